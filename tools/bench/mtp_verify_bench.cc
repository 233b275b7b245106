// Cost of a speculative verify step on the CUDA device (issue #15), one stream: a plain decode
// step (1 token, graph-replayed), a speculative verify of k+1 tokens (decode path, every row
// sampled greedily on the device, recurrent state kept per token; and with logits + hidden
// copied to the host, as MtpSpeculator runs it) followed by CommitSpeculative(1), the same k+1
// tokens as a plain decode_path run (no entries), one MtpStep and MtpRows of 1 and k+1 rows (the
// draft head). Median of --iters timed repetitions each (tools/bench/mtp_cost.h, shared with
// `deltaserve bench --mtp`).
//   mtp_verify_bench [--model F.gguf] [--tokens 4] [--depth 512] [--iters 20] [--synth-only]
// Without --model it writes the synthetic 27B Q6_K file (tools/synth) to /tmp/mtp_bench_27b.gguf
// first (--synth-only: and stops there, so a script can write it while the GPU does other work).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "tools/bench/mtp_cost.h"
#include "tools/synth/synth.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/model/backend.h"

int main(int argc, char** argv) {
  std::string model;
  int tokens = 4, depth = 512, iters = 20;
  bool synth_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") model = next();
    else if (a == "--tokens") tokens = std::atoi(next());
    else if (a == "--depth") depth = std::atoi(next());
    else if (a == "--iters") iters = std::atoi(next());
    else if (a == "--synth-only") synth_only = true;
    else {
      std::fprintf(stderr, "usage: mtp_verify_bench [--model F] [--tokens K+1] [--depth N] [--iters N]\n");
      return 2;
    }
  }
  if (tokens < 1 || depth < 1 || iters < 1) {
    std::fprintf(stderr, "tokens, depth and iters must be >= 1\n");
    return 2;
  }
  if (model.empty()) {
    model = "/tmp/mtp_bench_27b.gguf";
    ds::SynthOptions o = ds::SynthOptions::Qwen27B();
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = ds::SynthesizeGguf(o, model);
    if (!s.ok()) {
      std::fprintf(stderr, "synth: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("synthesized %s in %.0f s\n", model.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (synth_only) return 0;
  auto f = ds::gguf::File::Open(model);
  if (!f.ok()) {
    std::fprintf(stderr, "%s\n", f.status().ToString().c_str());
    return 1;
  }
  ds::MtpCostOptions mo;
  mo.k = tokens - 1;
  mo.depth = depth;
  mo.iters = iters;
  mo.decode_path = true;
  if (mo.k < 1) {
    std::fprintf(stderr, "--tokens must be >= 2 (k + 1 with k >= 1 drafts)\n");
    return 2;
  }
  ds::BackendOptions bo;
  bo.n_slots = 1;
  bo.slot_ctx = ds::MtpCostSlotCtx(mo);
  ds::CudaBackendOptions co;
  co.spec_tokens = tokens;
  co.spec_seqs = 1;
  auto be_or = ds::CreateCudaBackend(std::shared_ptr<const ds::gguf::File>(std::move(*f)), bo, co);
  if (!be_or.ok()) {
    std::fprintf(stderr, "%s\n", be_or.status().ToString().c_str());
    return 1;
  }
  auto c = ds::MeasureMtpCost(**be_or, mo);
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    return 1;
  }
  std::printf("model %s depth %d: decode step %.2f ms; verify %d tokens + commit %.2f ms (%.2fx; "
              "logits + hidden to the host %.2f ms, %.2fx); decode_path %d tokens %.2f ms (%.2fx); "
              "MtpStep %.2f ms; MtpRows 1 row %.2f ms, %d rows %.2f ms\n",
              model.c_str(), depth, c->decode_ms, tokens, c->verify_dev_ms,
              c->verify_dev_ms / c->decode_ms, c->verify_host_ms, c->verify_host_ms / c->decode_ms,
              tokens, c->path_ms, c->path_ms / c->decode_ms, c->step_ms, c->rows1_ms, tokens,
              c->rows_k1_ms);
  return 0;
}
