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
//
// `--draft-heads`: the same chains also drafted through two stand-ins for the MTP head's LM head,
// applied to the same MTP hidden states: the head requantized to Q6_K, and the coarse copy of
// that Q6_K head the CUDA drafts use (kernels/cuda/draft_head.cuh: 4-bit codes with a bf16 scale
// per 16 values). Drafts only propose tokens, so the question is how often a cheaper head's
// drafts are still accepted; reported per position for each head.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"
#include "kernels/cpu/draft_head_ref.h"
#include "kernels/cpu/quant.h"
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

// The MTP head's matrix [V, H] as f32 after requantizing it to Q6_K: the Q6_K values, or
// (`coarse`) those of its coarse draft copy (kernels/cpu/draft_head_ref.h).
absl::StatusOr<std::vector<float>> DraftHead(const gguf::File& f, int n_layer, int64_t H,
                                             int64_t V, bool coarse) {
  const gguf::TensorInfo* t =
      f.FindTensor(absl::StrCat("blk.", n_layer, ".nextn.shared_head_head.weight"));
  if (t == nullptr) t = f.FindTensor("output.weight");
  if (t == nullptr) t = f.FindTensor("token_embd.weight");  // tied
  if (t == nullptr || t->ne[0] != H || t->n_rows() != V || H % 256 != 0)
    return absl::InvalidArgumentError("--draft-heads: no [V, H] head with H % 256 == 0");
  std::vector<float> w(static_cast<size_t>(V) * H), row(H);
  std::vector<uint8_t> q6(GgmlRowBytes(GgmlType::Q6_K, H));
  for (int64_t r = 0; r < V; ++r) {
    cpu::DequantizeRow(t->type, t->data + r * t->row_bytes(), row.data(), H);
    cpu::QuantizeRow(GgmlType::Q6_K, row.data(), q6.data(), H);
    if (coarse)
      cpu::CoarseQ6KRow(q6.data(), H, w.data() + r * H);
    else
      cpu::DequantizeRow(GgmlType::Q6_K, q6.data(), w.data() + r * H, H);
  }
  return w;
}

int32_t ArgmaxOf(const std::vector<float>& w, const std::vector<float>& h, int64_t V) {
  const int64_t H = static_cast<int64_t>(h.size());
  int32_t best = 0;
  float best_v = -INFINITY;
  for (int64_t r = 0; r < V; ++r) {
    float acc = 0.f;
    for (int64_t i = 0; i < H; ++i) acc += w[r * H + i] * h[i];
    if (acc > best_v) {
      best_v = acc;
      best = static_cast<int32_t>(r);
    }
  }
  return best;
}

}  // namespace

int CmdMtpAccept(int argc, char** argv) {
  auto args = Args::Parse(argc, argv, {"--model", "--text", "--draft", "--prompts", "--prompt-len",
                                       "--gen", "--backend", "--threads"},
                          {"--json", "--draft-heads"});
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

  // Drafting heads: 0 the model's, then with --draft-heads its Q6_K and coarse stand-ins.
  std::vector<std::vector<float>> stand_ins;
  if (args->Has("--draft-heads")) {
    for (const bool coarse : {false, true}) {
      auto w = DraftHead(**file, be.config().n_layer, H, V, coarse);
      if (!w.ok()) return Fail(w.status());
      stand_ins.push_back(std::move(*w));
    }
  }
  const int n_heads = 1 + static_cast<int>(stand_ins.size());
  // reached_by[head][j]: chains whose drafts 1..j were all accepted
  std::vector<std::vector<int64_t>> reached_by(n_heads, std::vector<int64_t>(*K + 1, 0));
  const std::vector<int64_t>& reached = reached_by[0];
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
      // Every head's chain is fed the accepted (greedy) tokens, so while several are alive they
      // see the same MTP hidden states; a chain ends at its first rejected draft.
      std::vector<bool> alive(n_heads, true);
      for (int hd = 0; hd < n_heads; ++hd) ++reached_by[hd][0];
      for (int64_t j = 1; j <= *K; ++j) {
        bool any = false;
        for (int hd = 0; hd < n_heads; ++hd) {
          if (!alive[hd]) continue;
          const int32_t d = hd == 0 ? Argmax(lg.data(), V) : ArgmaxOf(stand_ins[hd - 1], ho, V);
          alive[hd] = d == seq[t + 1 + j];
          if (alive[hd]) ++reached_by[hd][j];
          any = any || alive[hd];
        }
        if (!any || j == *K) break;
        std::vector<float> h2 = ho;
        if (auto s = be.MtpStep(0, seq[t + 1 + j], static_cast<int32_t>(t + j), h2, &lg, &ho);
            !s.ok())
          return Fail(s);
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
  const char* kStandIn[2] = {"q6_k_head", "coarse_draft_head"};
  for (int hd = 1; hd < n_heads; ++hd) {
    const std::vector<int64_t>& r = reached_by[hd];
    double tokens = 1;
    for (int64_t k = 1; k <= *K; ++k) {
      j[kStandIn[hd - 1]]["conditional"].push_back(static_cast<double>(r[k]) /
                                                   std::max<int64_t>(1, r[k - 1]));
      tokens += static_cast<double>(r[k]) / std::max<int64_t>(1, chains);
    }
    j[kStandIn[hd - 1]]["tokens_per_step"] = tokens;
    if (!args->Has("--json"))
      std::printf("drafts through the %s: %.4f tokens per verify step\n", kStandIn[hd - 1], tokens);
  }
  if (args->Has("--json")) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("mean tokens per verify step with %lld drafts: %.4f (%lld chains)\n", static_cast<long long>(*K),
                mean_tokens, static_cast<long long>(chains));
  }
  return 0;
}

}  // namespace ds::cli
