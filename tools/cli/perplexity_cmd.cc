// `deltaserve perplexity --model F --text FILE [--ctx N]`: perplexity of a model over a text
// (docs/quality.md). The text is tokenized with the model's own vocabulary (control-token texts
// such as the <|endoftext|> between documents become their ids), cut into consecutive windows of
// --ctx tokens, and each window is run from an empty state with logits for every position; every
// token after the first of its window is scored: ppl = exp(mean(-log p(x_{i+1} | x_{<=i}))).
// Progress (windows done, tokens, running perplexity, tokens/s) goes to stderr. --decode-path
// scores the same windows through the device's decode kernels instead of its prefill kernels.
// --gdn-state bf16: the GDN recurrent state stored in bf16 between steps (CUDA backend; the CPU
// backend emulates it by rounding), the precision question of issue #22 (with --chunk 1 every
// token is a step, as in decoding). --prefill-fp8 on: the prefill products in FP8 (CUDA; the CPU
// backend multiplies the same e4m3 values). These and the worker's other device switches are
// parsed by worker/process/device_tuning.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/model_alias.h"
#include "tools/cli/args.h"
#include "tools/cli/commands.h"
#include "tools/cli/device_tuning_args.h"
#include "worker/backend_factory.h"
#include "worker/model/gdn_state.h"

namespace ds::cli {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "deltaserve: error: %s\n", std::string(s.message()).c_str());
  return 1;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int CmdPerplexity(int argc, char** argv) {
  // The worker's device switches (worker/process/device_tuning.h: --gdn-state, --prefill-fp8,
  // --dense-weights, ...), parsed and applied as `generate` does.
  std::set<std::string> valued = {"--model",  "--text",       "--ctx",  "--backend",
                                  "--threads", "--max-tokens", "--chunk"};
  valued.insert(DeviceTuningFlagNames().begin(), DeviceTuningFlagNames().end());
  auto args = Args::Parse(argc, argv, valued, {"--json", "--quiet", "--decode-path"});
  if (!args.ok()) return Fail(args.status());
  auto model_arg = args->Required("--model");
  auto text_path = args->Required("--text");
  if (!model_arg.ok()) return Fail(model_arg.status());
  if (!text_path.ok()) return Fail(text_path.status());
  auto ctx = args->Int("--ctx", 512);
  auto threads = args->Int("--threads", 0);
  auto max_tokens = args->Int("--max-tokens", 0);
  auto chunk = args->Int("--chunk", 512);
  for (const absl::Status& s : {ctx.status(), threads.status(), max_tokens.status(), chunk.status()})
    if (!s.ok()) return Fail(s);
  if (*ctx < 2) return Fail(absl::InvalidArgumentError("--ctx must be >= 2"));
  if (*chunk < 1) return Fail(absl::InvalidArgumentError("--chunk must be >= 1"));
  const std::string model = ResolveModelAlias(*model_arg);

  std::ifstream f(*text_path, std::ios::binary);
  if (!f) return Fail(absl::NotFoundError("cannot open --text " + *text_path));
  std::ostringstream ss;
  ss << f.rdbuf();
  auto file = gguf::File::Open(model);
  if (!file.ok()) return Fail(file.status());
  auto tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) return Fail(tok.status());
  if (!tok->has_vocab())
    return Fail(absl::InvalidArgumentError("model has no vocabulary: perplexity needs a tokenizer"));
  auto ids_or = tok->Encode(ss.str(), /*parse_special=*/true);
  if (!ids_or.ok()) return Fail(ids_or.status());
  std::vector<int32_t> ids = std::move(*ids_or);
  if (*max_tokens > 0 && static_cast<int64_t>(ids.size()) > *max_tokens) ids.resize(*max_tokens);
  if (ids.size() < 2) return Fail(absl::InvalidArgumentError("the text has fewer than 2 tokens"));

  BackendOptions bo;
  bo.n_slots = 1;
  bo.slot_ctx = static_cast<int>(*ctx);
  bo.n_threads = static_cast<int>(*threads);
  DeviceTuning tuning;
  if (auto s = DeviceTuningFromArgs(*args, DeviceTuningFlagNames(), &tuning); !s.ok()) return Fail(s);
  ApplyDeviceTuning(tuning, &bo);
  auto be_or = CreateBackend(args->Str("--backend", "cpu"), model, bo);
  if (!be_or.ok()) return Fail(be_or.status());
  Backend& be = **be_or;
  const int V = be.config().n_vocab;
  const bool quiet = args->Has("--quiet");
  const size_t n_windows = (ids.size() + *ctx - 1) / *ctx;
  if (!quiet)
    std::fprintf(stderr, "perplexity: %s on %s, %zu tokens, %zu windows of %lld\n", model.c_str(),
                 be.name().c_str(), ids.size(), n_windows, static_cast<long long>(*ctx));

  double nll = 0;
  int64_t scored = 0;
  const double t0 = Now();
  for (size_t w = 0; w < n_windows; ++w) {
    const size_t b = w * *ctx, e = std::min(ids.size(), b + static_cast<size_t>(*ctx));
    if (e - b < 2) break;
    be.ResetSlot(0);
    for (size_t p = b; p < e; p += *chunk) {
      SeqStep step;
      step.slot = 0;
      step.pos0 = static_cast<int32_t>(p - b);
      const size_t n = std::min<size_t>(*chunk, e - p);
      step.tokens.assign(ids.begin() + p, ids.begin() + p + n);
      step.all_logits = true;
      // --decode-path: the device computes the window as one-token decode steps (its decode
      // kernels), so the decode arithmetic's quality is measured too (SeqStep::decode_path).
      step.decode_path = args->Has("--decode-path");
      StepOutput out;
      if (auto s = be.Forward({&step, 1}, StepOptions{}, &out); !s.ok()) return Fail(s);
      for (size_t i = 0; i < n; ++i) {
        const size_t pos = p + i;
        if (pos + 1 >= e) break;
        const float* row = out.logits.data() + i * V;
        double mx = row[0];
        for (int v = 1; v < V; ++v) mx = std::max<double>(mx, row[v]);
        double sum = 0;
        for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
        nll += (mx + std::log(sum)) - row[ids[pos + 1]];
        ++scored;
      }
    }
    if (!quiet)
      std::fprintf(stderr, "  [%zu/%zu] %lld tokens scored, ppl %.4f, %.0f tok/s\n", w + 1, n_windows,
                   static_cast<long long>(scored), std::exp(nll / scored),
                   static_cast<double>(e) / std::max(1e-9, Now() - t0));
  }
  const double ppl = std::exp(nll / std::max<int64_t>(1, scored));
  if (args->Has("--json")) {
    nlohmann::json j;
    j["model"] = model;
    j["backend"] = be.name();
    j["tokens"] = ids.size();
    j["scored"] = scored;
    j["ctx"] = *ctx;
    j["decode_path"] = args->Has("--decode-path");
    j["gdn_state"] = GdnStateName(tuning.gdn_state_bf16);
    j["mean_nll"] = nll / std::max<int64_t>(1, scored);
    j["perplexity"] = ppl;
    j["seconds"] = Now() - t0;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("perplexity %.4f over %lld tokens (ctx %lld, %s)\n", ppl, static_cast<long long>(scored),
                static_cast<long long>(*ctx), be.name().c_str());
  }
  return 0;
}

}  // namespace ds::cli
