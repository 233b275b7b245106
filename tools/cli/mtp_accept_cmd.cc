// `deltaserve mtp-accept --model F --text FILE [--draft K] [--prompts N] [--prompt-len P]
// [--gen G]`: how often greedy MTP drafts would be accepted, per draft position (docs/quality.md).
//
// For N prompts of P tokens taken at evenly spaced places in the text, the main model generates
// G tokens greedily (the sequence a greedy speculative decoder must reproduce), keeping the
// final-normed hidden state of every position. Then, for every position t of the generated part,
// the MTP head drafts K tokens the way a speculative step would: d_1 = MTP(x_{t+1}, h_t), d_j =
// MTP(d_{j-1}, h'_{j-1}); draft j counts as accepted when d_1..d_j all equal the greedy tokens
// x_{t+2}..x_{t+1+j} (the verifier's verdict under greedy decoding). The MTP KV cache is filled
// position by position with (x_{t+1}, h_t) as the decoder does; later draft steps overwrite rows
// that the next position's step discards. Reported: for each j, P(d_j accepted | d_1..d_{j-1}
// accepted) and P(d_1..d_j accepted), and the mean tokens per verify step (1 + accepted drafts).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/model_alias.h"
#include "tools/cli/args.h"
#include "tools/cli/commands.h"
#include "worker/backend_factory.h"

namespace ds::cli {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "deltaserve: error: %s\n", std::string(s.message()).c_str());
  return 1;
}

int32_t Argmax(const float* row, int n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

}  // namespace

int CmdMtpAccept(int argc, char** argv) {
  auto args = Args::Parse(argc, argv, {"--model", "--text", "--draft", "--prompts", "--prompt-len",
                                       "--gen", "--backend", "--threads"},
                          {"--json"});
  if (!args.ok()) return Fail(args.status());
  auto model_arg = args->Required("--model");
  auto text_path = args->Required("--text");
  if (!model_arg.ok()) return Fail(model_arg.status());
  if (!text_path.ok()) return Fail(text_path.status());
  auto K = args->Int("--draft", 3);
  auto N = args->Int("--prompts", 16);
  auto P = args->Int("--prompt-len", 32);
  auto G = args->Int("--gen", 64);
  auto threads = args->Int("--threads", 0);
  for (const absl::Status& s : {K.status(), N.status(), P.status(), G.status(), threads.status()})
    if (!s.ok()) return Fail(s);
  if (*K < 1 || *N < 1 || *P < 1 || *G < *K + 2)
    return Fail(absl::InvalidArgumentError("need --draft >= 1, --prompts >= 1, --prompt-len >= 1, --gen >= draft + 2"));
  const std::string model = ResolveModelAlias(*model_arg);
  std::ifstream f(*text_path, std::ios::binary);
  if (!f) return Fail(absl::NotFoundError("cannot open --text " + *text_path));
  std::ostringstream ss;
  ss << f.rdbuf();
  auto file = gguf::File::Open(model);
  if (!file.ok()) return Fail(file.status());
  auto tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) return Fail(tok.status());
  auto ids = tok->Encode(ss.str(), /*parse_special=*/true);
  if (!ids.ok()) return Fail(ids.status());
  if (static_cast<int64_t>(ids->size()) < *P + 1) return Fail(absl::InvalidArgumentError("text too short"));

  BackendOptions bo;
  bo.n_slots = 1;
  bo.slot_ctx = static_cast<int>(*P + *G + *K + 1);
  bo.n_threads = static_cast<int>(*threads);
  auto be_or = CreateBackend(args->Str("--backend", "cpu"), model, bo);
  if (!be_or.ok()) return Fail(be_or.status());
  Backend& be = **be_or;
  const int V = be.config().n_vocab, H = be.config().n_embd;

  std::vector<int64_t> reached(*K + 1, 0);  // reached[j]: chains whose drafts 1..j were all accepted
  int64_t chains = 0;
  const int64_t stride = (static_cast<int64_t>(ids->size()) - *P) / *N;
  for (int64_t n = 0; n < *N; ++n) {
    std::vector<int32_t> seq(ids->begin() + n * stride, ids->begin() + n * stride + *P);
    be.ResetSlot(0);
    std::vector<float> hid;  // [len][H], final-normed, position by position
    SeqStep step;
    step.slot = 0;
    step.pos0 = 0;
    step.tokens = seq;
    step.all_logits = true;
    StepOptions so;
    so.want_hidden = true;
    StepOutput out;
    if (auto s = be.Forward({&step, 1}, so, &out); !s.ok()) return Fail(s);
    hid = out.hidden;
    int32_t next = Argmax(out.logits.data() + (seq.size() - 1) * V, V);
    for (int64_t g = 0; g < *G; ++g) {
      seq.push_back(next);
      SeqStep d;
      d.slot = 0;
      d.pos0 = static_cast<int32_t>(seq.size() - 1);
      d.tokens = {next};
      StepOutput o2;
      if (auto s = be.Forward({&d, 1}, so, &o2); !s.ok()) return Fail(s);
      hid.insert(hid.end(), o2.hidden.begin(), o2.hidden.end());
      next = Argmax(o2.logits.data(), V);
    }
    // MTP pass over the whole sequence: row t pairs h_t with x_{t+1}.
    std::vector<float> lg, ho;
    const int64_t L = static_cast<int64_t>(seq.size());
    for (int64_t t = 0; t + 1 < L; ++t) {
      std::span<const float> h(hid.data() + t * H, H);
      if (auto s = be.MtpStep(0, seq[t + 1], static_cast<int32_t>(t), h, &lg, &ho); !s.ok()) return Fail(s);
      if (t < *P - 1 || t + 1 + *K >= L) continue;  // score drafts inside the generated part only
      ++chains;
      ++reached[0];
      int32_t d = Argmax(lg.data(), V);
      for (int64_t j = 1; j <= *K; ++j) {
        if (d != seq[t + 1 + j]) break;
        ++reached[j];
        if (j == *K) break;
        std::vector<float> h2 = ho;
        if (auto s = be.MtpStep(0, d, static_cast<int32_t>(t + j), h2, &lg, &ho); !s.ok()) return Fail(s);
        d = Argmax(lg.data(), V);
      }
    }
    std::fprintf(stderr, "  prompt %lld/%lld: %lld chains, first-draft acceptance so far %.3f\n",
                 static_cast<long long>(n + 1), static_cast<long long>(*N), static_cast<long long>(chains),
                 static_cast<double>(reached[1]) / std::max<int64_t>(1, chains));
  }
  nlohmann::json j;
  j["model"] = model;
  j["chains"] = chains;
  double mean_tokens = 1;
  for (int64_t k = 1; k <= *K; ++k) {
    const double cond = static_cast<double>(reached[k]) / std::max<int64_t>(1, reached[k - 1]);
    const double all = static_cast<double>(reached[k]) / std::max<int64_t>(1, chains);
    mean_tokens += all;
    j["conditional"].push_back(cond);
    j["cumulative"].push_back(all);
    if (!args->Has("--json"))
      std::printf("draft %lld: accepted %.4f given the earlier drafts accepted, %.4f overall\n",
                  static_cast<long long>(k), cond, all);
  }
  j["tokens_per_step"] = mean_tokens;
  if (args->Has("--json")) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("mean tokens per verify step with %lld drafts: %.4f (%lld chains)\n", static_cast<long long>(*K),
                mean_tokens, static_cast<long long>(chains));
  }
  return 0;
}

}  // namespace ds::cli
