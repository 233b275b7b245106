// Cost of a speculative verify step on the CUDA device (issue #15), one stream: a plain decode
// step (1 token, graph-replayed), a speculative verify of k+1 tokens (decode path, every row
// sampled greedily on the device, recurrent state kept per token) followed by
// CommitSpeculative(1), the same k+1 tokens as a plain decode_path run (no entries), and one
// MtpStep (the draft head). Median of --iters timed repetitions each.
//   mtp_verify_bench [--model F.gguf] [--tokens 4] [--depth 512] [--iters 20] [--synth-only]
// Without --model it writes the synthetic 27B Q6_K file (tools/synth) to /tmp/mtp_bench_27b.gguf
// first (--synth-only: and stops there, so a script can write it while the GPU does other work).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/sampling/sampling_params.h"
#include "tools/synth/synth.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/model/backend.h"

namespace {

double MedianMs(int iters, const std::function<bool()>& body) {
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!body()) return -1;
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

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
  ds::BackendOptions bo;
  bo.n_slots = 2;
  bo.slot_ctx = depth + 4 * (iters + 8) * (tokens + 1) + 64;
  ds::CudaBackendOptions co;
  co.spec_tokens = tokens;
  co.spec_seqs = 1;
  auto be_or = ds::CreateCudaBackend(std::shared_ptr<const ds::gguf::File>(std::move(*f)), bo, co);
  if (!be_or.ok()) {
    std::fprintf(stderr, "%s\n", be_or.status().ToString().c_str());
    return 1;
  }
  ds::Backend& be = **be_or;
  const int V = be.config().n_vocab, H = be.config().n_embd;
  ds::SeqStep p;
  p.slot = 0;
  for (int i = 0; i < depth; ++i) p.tokens.push_back((i * 7919 + 13) % V);
  ds::StepOutput out;
  if (absl::Status s = be.Forward({&p, 1}, ds::StepOptions{}, &out); !s.ok()) {
    std::fprintf(stderr, "prefill: %s\n", s.ToString().c_str());
    return 1;
  }
  // Every output row sampled greedily on the device (what a speculator reads back).
  ds::sampling::SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<ds::DeviceSampleRow> rows(tokens);
  for (auto& r : rows) {
    r.mode = ds::DeviceSampleRow::Mode::kSample;
    r.params = &greedy;
  }
  int32_t pos = depth;
  auto run = [&](ds::SeqStep s) {
    s.slot = 0;
    s.pos0 = pos;
    ds::StepOptions so;
    so.device_sample = std::span<const ds::DeviceSampleRow>(rows.data(), s.all_logits ? s.tokens.size() : 1);
    absl::Status st = be.Forward({&s, 1}, so, &out);
    if (st.ok() && s.speculative) st = be.CommitSpeculative(0, 1);
    if (!st.ok()) {
      std::fprintf(stderr, "step: %s\n", st.ToString().c_str());
      return false;
    }
    pos += s.speculative ? 1 : static_cast<int32_t>(s.tokens.size());
    return true;
  };
  ds::SeqStep dec;
  dec.tokens = {17};
  ds::SeqStep ver;
  for (int i = 0; i < tokens; ++i) ver.tokens.push_back(17 + i);
  ver.all_logits = true;
  ver.speculative = true;
  ds::SeqStep path = ver;
  path.speculative = false;
  path.decode_path = true;
  for (int i = 0; i < 3; ++i)
    if (!run(dec) || !run(ver) || !run(path)) return 1;  // graphs, lazy state
  const double t_dec = MedianMs(iters, [&] { return run(dec); });
  const double t_ver = MedianMs(iters, [&] { return run(ver); });
  const double t_path = MedianMs(iters, [&] { return run(path); });
  std::vector<float> h(H, 0.01f), lg, ho;
  double t_mtp = -1;
  if (absl::Status s = be.MtpStep(0, 17, pos, h, &lg, &ho); s.ok()) {
    t_mtp = MedianMs(iters, [&] { return be.MtpStep(0, 17, pos, h, &lg, &ho).ok(); });
  } else {
    std::printf("MtpStep: %s\n", s.ToString().c_str());
  }
  std::printf("model %s depth %d: decode step %.2f ms; verify %d tokens + commit %.2f ms (%.2fx); "
              "decode_path %d tokens %.2f ms (%.2fx); MtpStep %.2f ms\n",
              model.c_str(), depth, t_dec, tokens, t_ver, t_ver / t_dec, tokens, t_path,
              t_path / t_dec, t_mtp);
  return 0;
}
