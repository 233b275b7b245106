// `deltaserve tp-plan`: see tp_plan.h.
#include "tools/cli/tp_plan.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/cli/args.h"
#include "tools/cli/commands.h"
#include "tools/synth/synth.h"
#include "worker/model/gdn_state.h"
#include "worker/model/kv_type.h"
#include "worker/runner/memory_planner.h"
#include "worker/tp/plan.h"

namespace ds::cli {
namespace {

constexpr double kMiB = 1 << 20;
constexpr double kGiB = 1 << 30;

// llama.cpp's use_more_bits(i, n): the first and last eighth of the layers and every third one
// in between get the larger type in its _M mixes.
bool MoreBits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

absl::StatusOr<DescribedModel> Describe27B(const std::string& mix) {
  SynthOptions o = SynthOptions::Qwen27B();
  const bool q4km = mix == "q4_k_m" || mix == "Q4_K_M";
  if (q4km) {
    o.weight_type = GgmlType::Q4_K;
  } else {
    auto t = GgmlTypeFromName(mix);
    if (!t || !GgmlInfo(*t).supported)
      return absl::InvalidArgumentError("--mix expects q4_k_m or a weight type (Q6_K, Q4_K, ...), got '" +
                                        mix + "'");
    o.weight_type = *t;
  }
  DS_ASSIGN_OR_RETURN(const SynthPlan sp, DescribeGguf(o));
  DescribedModel m;
  ModelConfig& c = m.config;
  c.arch = "qwen35";
  c.n_layer = o.n_layer;
  c.n_nextn = o.with_mtp ? 1 : 0;
  c.n_embd = o.n_embd;
  c.n_ff = o.n_ff;
  c.n_vocab = sp.n_vocab;
  c.n_ctx_train = o.ctx_train;
  c.rms_eps = o.rms_eps;
  c.n_head = o.n_head;
  c.n_head_kv = o.n_head_kv;
  c.head_dim = o.head_dim;
  c.n_rot = o.n_rot;
  c.rope_base = o.rope_base;
  c.conv_kernel = o.conv_kernel;
  c.gdn_k_heads = o.gdn_k_heads;
  c.gdn_v_heads = o.gdn_v_heads;
  c.gdn_k_dim = o.gdn_k_dim;
  c.gdn_v_dim = o.gdn_v_dim;
  for (int i = 0; i < c.n_layer; ++i) c.is_recurrent.push_back((i + 1) % o.interval != 0);
  int n_attn_v = 0, n_ffn_down = 0;
  for (const SynthTensor& t : sp.tensors) {
    n_attn_v += EndsWith(t.name, ".attn_v.weight");
    n_ffn_down += EndsWith(t.name, ".ffn_down.weight");
  }
  int i_attn_v = 0, i_ffn_down = 0;
  for (const SynthTensor& t : sp.tensors) {
    gguf::TensorInfo ti;
    ti.name = t.name;
    ti.n_dims = static_cast<int>(t.ne.size());
    for (size_t d = 0; d < t.ne.size() && d < 4; ++d) ti.ne[d] = t.ne[d];
    ti.type = t.type;
    if (q4km && t.type == GgmlType::Q4_K) {
      if (t.name == "output.weight") ti.type = GgmlType::Q6_K;
      else if (EndsWith(t.name, ".attn_qkv.weight")) ti.type = GgmlType::Q5_K;
      else if (EndsWith(t.name, ".attn_v.weight"))
        ti.type = MoreBits(i_attn_v++, n_attn_v) ? GgmlType::Q6_K : GgmlType::Q4_K;
      else if (EndsWith(t.name, ".ffn_down.weight"))
        ti.type = MoreBits(i_ffn_down++, n_ffn_down) ? GgmlType::Q6_K : GgmlType::Q4_K;
    }
    ti.nbytes = GgmlRowBytes(ti.type, ti.ne[0]) * static_cast<uint64_t>(ti.n_rows());
    m.bytes += ti.nbytes;
    m.tensors.push_back(std::move(ti));
  }
  return m;
}

absl::StatusOr<std::string> TpPlanReport(const ModelConfig& c,
                                         const std::vector<gguf::TensorInfo>& tensors,
                                         const TpPlanOptions& o) {
  const int world = static_cast<int>(o.card_mib.size());
  if (world < 1) return absl::InvalidArgumentError("--cards-mib needs at least one card size");
  // What a worker finds free on an idle card: the CUDA context and driver take ~1% + 300 MB
  // (measured on the H200; the same allowance docs/memory.md's tables use).
  std::vector<double> free_b(world);
  for (int r = 0; r < world; ++r) {
    const double total = o.card_mib[r] * kMiB;
    free_b[r] = total - (total / 100 + 300 * kMiB);
  }
  std::vector<double> split = o.split.empty() ? tp::SplitFromFreeBytes(free_b) : o.split;
  if (static_cast<int>(split.size()) != world)
    return absl::InvalidArgumentError(absl::StrCat("--split has ", split.size(), " weights for ",
                                                   world, " cards"));
  DS_ASSIGN_OR_RETURN(const int64_t ffn_g, tp::FfnGranule(tensors, c));
  DS_ASSIGN_OR_RETURN(const tp::HeadGranules hg, tp::AlignedHeadGranules(tensors, c));
  DS_ASSIGN_OR_RETURN(const tp::Plan plan, tp::Plan::Make(c, split, ffn_g, tp::LmHead::kVocabParallel,
                                                          hg.attn, hg.gdn));
  DS_ASSIGN_OR_RETURN(const std::vector<tp::RankMemory> mem, tp::PlanMemory(tensors, c, plan));
  std::string out;
  absl::StrAppendFormat(&out, "TP split (%s), shares:", o.split.empty() ? "by free memory, --split mem" : "--split");
  double sum = 0;
  for (double w : split) sum += w;
  for (double w : split) absl::StrAppendFormat(&out, " %.3f", w / sum);
  absl::StrAppendFormat(&out, "\n%s\n", plan.ToString());
  int n_gdn = 0, n_attn = 0;
  for (int i = 0; i < c.n_layer; ++i) (c.is_recurrent[i] ? n_gdn : n_attn)++;
  for (int r = 0; r < world; ++r) {
    const int kv = plan.kv_heads(r), hk = plan.gdn_k(r), hv = plan.gdn_v(r);
    const int64_t ffn = plan.ranks[r].ffn.size();
    MemoryPlanInput in;
    in.device_total = static_cast<uint64_t>(o.card_mib[r] * kMiB);
    in.device_free = static_cast<uint64_t>(free_b[r]);
    in.margin = (512ull << 20) + in.device_total / 100;  // as the CUDA device keeps free
    in.weights = mem[r].weight_bytes;
    // Workspace, an estimate from the CUDA plan of the 27B on the H200 (docs/memory.md):
    // 1.83 GiB of [step rows, width] buffers at 4096 rows, taken here in proportion to the rows
    // and to this rank's share of the FFN (its widest buffers); per context token the prefill
    // attention scratch: the f16 K/V gather of its KV heads + one 256-query chunk of f32 scores
    // and f16 probabilities per query head of a group.
    const double share = static_cast<double>(ffn) / c.n_ff;
    in.workspace_fixed = static_cast<uint64_t>(1.832 * kGiB * o.max_step_tokens / 4096.0 *
                                               (0.25 + 0.75 * share));
    const int group = c.n_head_kv > 0 ? c.n_head / c.n_head_kv : 0;
    in.workspace_per_ctx = kv > 0 ? 2ull * kv * c.head_dim * 2 + group * 256ull * 6 : 0;
    // CUDA keeps conv_kernel ring rows (the CPU layout, tp::RankMemory, keeps one fewer), f32,
    // and the delta-rule state in f32 or bf16 (--gdn-state).
    in.recurrent_per_slot =
        n_gdn * (4ull * c.conv_kernel * (2ull * hk * c.gdn_k_dim + hv * c.gdn_v_dim) +
                 (o.gdn_state_bf16 ? 2ull : 4ull) * hv * c.gdn_k_dim * c.gdn_v_dim);
    in.kv_per_token = static_cast<uint64_t>(n_attn) * 2 * kv * KvRowBytes(o.kv_type, c.head_dim);
    in.page_size = 64;
    in.slots = o.slots;
    in.slot_ctx = o.ctx;
    absl::StrAppendFormat(&out,
                          "rank %d (card %.0f MiB = %.2f GiB): %d KV heads, %d/%d GDN key/value "
                          "heads, %d FFN columns, vocabulary rows [%d, %d)\n"
                          "  weights %.2f GiB (dequantized copies %.2f GiB), recurrent state %.1f "
                          "MiB per sequence, KV %s %.1f KiB per token, workspace ~%.2f GiB + %.1f "
                          "KiB per context token\n",
                          r, o.card_mib[r], o.card_mib[r] * kMiB / kGiB, kv, hk, hv, ffn,
                          plan.ranks[r].vocab.begin, plan.ranks[r].vocab.end,
                          mem[r].weight_bytes / kGiB, mem[r].dequantized_bytes / kGiB,
                          in.recurrent_per_slot / kMiB, KvTypeName(o.kv_type),
                          in.kv_per_token / 1024.0, in.workspace_fixed / kGiB,
                          in.workspace_per_ctx / 1024.0);
    auto p = PlanMemory(in);
    if (p.ok()) {
      absl::StrAppendFormat(&out, "  fits: %s\n", p->ToString());
    } else {
      absl::StrAppendFormat(&out, "  does not fit: %s\n", std::string(p.status().message()));
    }
  }
  return out;
}

int CmdTpPlan(int argc, char** argv) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "deltaserve: error: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  auto args = Args::Parse(argc, argv,
                          {"--model", "--synth", "--mix", "--cards-mib", "--split", "--kv-type",
                           "--ctx", "--slots", "--max-step-tokens", "--gdn-state"},
                          {});
  if (!args.ok()) return fail(args.status());
  TpPlanOptions o;
  auto cards = tp::ParseSplit(args->Str("--cards-mib", "16160,32510"));
  if (!cards.ok()) return fail(cards.status());
  o.card_mib = *cards;
  const std::string split = args->Str("--split", "mem");
  if (split != "mem") {
    auto s = tp::ParseSplit(split);
    if (!s.ok()) return fail(s.status());
    o.split = *s;
  }
  auto kv = ParseKvType(args->Str("--kv-type", "q4_0"));
  if (!kv.ok()) return fail(kv.status());
  o.kv_type = *kv;
  auto gdn_state = ParseGdnState(args->Str("--gdn-state", "f32"));
  if (!gdn_state.ok()) return fail(gdn_state.status());
  o.gdn_state_bf16 = *gdn_state;
  auto ctx = args->Int("--ctx", o.ctx);
  auto slots = args->Int("--slots", o.slots);
  auto step = args->Int("--max-step-tokens", o.max_step_tokens);
  if (!ctx.ok()) return fail(ctx.status());
  if (!slots.ok()) return fail(slots.status());
  if (!step.ok()) return fail(step.status());
  if (*ctx < 1 || *slots < 0 || *step < 1)
    return fail(absl::InvalidArgumentError("--ctx and --max-step-tokens must be >= 1, --slots >= 0"));
  o.ctx = *ctx;
  o.slots = static_cast<int>(*slots);
  o.max_step_tokens = static_cast<int>(*step);
  std::vector<gguf::TensorInfo> tensors;
  ModelConfig c;
  std::unique_ptr<gguf::File> file;
  if (args->Has("--model")) {
    auto f = gguf::File::Open(args->Str("--model"));
    if (!f.ok()) return fail(f.status());
    file = std::move(*f);
    auto cfg = ModelConfig::FromGguf(*file);
    if (!cfg.ok()) return fail(cfg.status());
    c = *cfg;
    tensors = file->tensors();
    std::printf("model %s\n", args->Str("--model").c_str());
  } else {
    if (args->Str("--synth", "27b") != "27b")
      return fail(absl::InvalidArgumentError("--synth expects 27b"));
    auto m = Describe27B(args->Str("--mix", "q4_k_m"));
    if (!m.ok()) return fail(m.status());
    c = m->config;
    tensors = std::move(m->tensors);
    std::printf("model: the 27B shape, %s matrices (described, not written): %.2f GiB of tensors\n",
                args->Str("--mix", "q4_k_m").c_str(), m->bytes / kGiB);
  }
  std::printf("cards (MiB):");
  for (double x : o.card_mib) std::printf(" %.0f", x);
  std::printf(
      "; KV %s, GDN state %s, --ctx %lld, --slots %d (0: the planner picks), "
      "--max-step-tokens %d\n",
      KvTypeName(o.kv_type), GdnStateName(o.gdn_state_bf16), static_cast<long long>(o.ctx), o.slots,
      o.max_step_tokens);
  auto r = TpPlanReport(c, tensors, o);
  if (!r.ok()) return fail(r.status());
  std::fputs(r->c_str(), stdout);
  return 0;
}

}  // namespace ds::cli
