// Tensor-parallel sharding plan and memory planner (see plan.h).
#include "worker/tp/plan.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ds::tp {

std::vector<int64_t> Apportion(int64_t n, std::span<const double> w) {
  const size_t k = w.size();
  std::vector<int64_t> out(k, 0);
  if (k == 0) return out;
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<double> rem(k);
  int64_t given = 0;
  for (size_t i = 0; i < k; ++i) {
    const double exact = static_cast<double>(n) * w[i] / sum;
    out[i] = static_cast<int64_t>(std::floor(exact + 1e-9));
    rem[i] = exact - static_cast<double>(out[i]);
    given += out[i];
  }
  std::vector<size_t> order(k);
  std::iota(order.begin(), order.end(), 0);
  // Largest remainder first; equal remainders (within rounding) go to the lower rank.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rem[a] > rem[b] + 1e-9; });
  for (size_t j = 0; given < n; ++j, ++given) ++out[order[j % k]];
  return out;
}

absl::StatusOr<std::vector<double>> ParseSplit(std::string_view s) {
  std::vector<double> w;
  int i = 0;
  size_t start = 0;
  while (true) {
    const size_t end = s.find_first_of(",:", start);
    const std::string f(s.substr(start, end == std::string_view::npos ? end : end - start));
    double v;
    if (!absl::SimpleAtod(f, &v) || !std::isfinite(v) || v <= 0)
      return absl::InvalidArgumentError(
          absl::StrCat("--split field ", i, " ('", f, "') must be a positive number"));
    w.push_back(v);
    ++i;
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return w;
}

double HostMemAvailableGiB() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (f >> key >> kb) {
    if (key == "MemAvailable:") return kb / 1048576.0;
    f.ignore(256, '\n');
  }
  return 1.0;
}

std::vector<double> SplitFromFreeBytes(std::span<const double> free_bytes) {
  std::vector<double> w(free_bytes.begin(), free_bytes.end());
  for (double& x : w) x = std::max(x, 1.0);  // a full device still gets a (tiny) weight
  return w;
}

absl::StatusOr<Plan> Plan::Make(const ModelConfig& c, std::span<const double> split,
                                int64_t ffn_granule, LmHead lm_head, int attn_granule,
                                int gdn_granule) {
  if (split.empty())
    return absl::InvalidArgumentError("TP split is empty (need one weight per rank)");
  for (size_t i = 0; i < split.size(); ++i)
    if (!(split[i] > 0) || !std::isfinite(split[i]))
      return absl::InvalidArgumentError(
          absl::StrCat("TP split weight of rank ", i, " is ", split[i], "; must be > 0"));
  if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0)
    return absl::InvalidArgumentError(absl::StrCat("TP: n_head ", c.n_head,
                                                   " is not a multiple of n_head_kv ", c.n_head_kv));
  if (c.gdn_k_heads <= 0 || c.gdn_v_heads % c.gdn_k_heads != 0)
    return absl::InvalidArgumentError(absl::StrCat("TP: GDN value heads ", c.gdn_v_heads,
                                                   " not a multiple of key heads ", c.gdn_k_heads));
  if (ffn_granule < 1 || c.n_ff % ffn_granule != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("TP: FFN granule ", ffn_granule, " does not divide n_ff ", c.n_ff));
  if (attn_granule < 1 || c.n_head_kv % attn_granule != 0 || gdn_granule < 1 ||
      c.gdn_k_heads % gdn_granule != 0)
    return absl::InvalidArgumentError(absl::StrCat("TP: head granules ", attn_granule, " / ",
                                                   gdn_granule, " do not divide n_head_kv ",
                                                   c.n_head_kv, " / GDN key heads ", c.gdn_k_heads));
  Plan p;
  p.world = static_cast<int>(split.size());
  p.attn_granule = attn_granule;
  p.gdn_granule = gdn_granule;
  p.split.assign(split.begin(), split.end());
  p.ffn_granule = ffn_granule;
  p.lm_head = lm_head;
  p.n_head = c.n_head;
  p.n_head_kv = c.n_head_kv;
  p.gdn_k_heads = c.gdn_k_heads;
  p.gdn_v_heads = c.gdn_v_heads;
  p.n_ff = c.n_ff;
  p.n_vocab = c.n_vocab;
  auto attn = Apportion(c.n_head_kv / attn_granule, split);
  auto gdn = Apportion(c.gdn_k_heads / gdn_granule, split);
  for (auto& x : attn) x *= attn_granule;
  for (auto& x : gdn) x *= gdn_granule;
  const auto ffn = Apportion(c.n_ff / ffn_granule, split);
  const auto voc = Apportion(c.n_vocab, split);
  p.ranks.resize(p.world);
  int64_t a = 0, g = 0, f = 0, v = 0;
  for (int r = 0; r < p.world; ++r) {
    RankShard& s = p.ranks[r];
    s.rank = r;
    s.attn_units = {a, a + attn[r]};
    s.gdn_units = {g, g + gdn[r]};
    s.ffn = {f * ffn_granule, (f + ffn[r]) * ffn_granule};
    if (lm_head == LmHead::kVocabParallel)
      s.vocab = {v, v + voc[r]};
    else
      s.vocab = r == 0 ? Range{0, c.n_vocab} : Range{0, 0};
    a += attn[r];
    g += gdn[r];
    f += ffn[r];
    v += voc[r];
  }
  return p;
}

std::string Plan::ToString() const {
  const double sum = std::accumulate(split.begin(), split.end(), 0.0);
  std::string s = absl::StrCat("TP plan: world ", world, ", lm_head ",
                               lm_head == LmHead::kVocabParallel ? "vocab-parallel" : "rank0",
                               ", granules: FFN ", ffn_granule, " cols, attention ", attn_granule,
                               " KV heads, GDN ", gdn_granule, " key heads\n");
  for (const RankShard& r : ranks) {
    absl::StrAppendFormat(&s,
                          "  rank %d (share %.3f): attn kv heads [%d,%d) q heads %d | GDN k heads "
                          "[%d,%d) v heads %d | FFN cols [%d,%d) | vocab rows [%d,%d)\n",
                          r.rank, split[r.rank] / sum, r.attn_units.begin, r.attn_units.end,
                          q_heads(r.rank), r.gdn_units.begin, r.gdn_units.end, gdn_v(r.rank),
                          r.ffn.begin, r.ffn.end, r.vocab.begin, r.vocab.end);
  }
  return s;
}

namespace {
const gguf::TensorInfo* FindIn(std::span<const gguf::TensorInfo> tensors, std::string_view name) {
  for (const gguf::TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}
}  // namespace

absl::StatusOr<int64_t> FfnGranule(const gguf::File& f, const ModelConfig& c) {
  return FfnGranule(f.tensors(), c);
}

absl::StatusOr<int64_t> FfnGranule(std::span<const gguf::TensorInfo> tensors, const ModelConfig& c) {
  int64_t g = 1;
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string name = absl::StrCat("blk.", i, ".ffn_down.weight");
    const gguf::TensorInfo* t = FindIn(tensors, name);
    if (!t) return absl::InvalidArgumentError(absl::StrCat("missing tensor ", name));
    const GgmlTypeInfo* ti = FindGgmlType(static_cast<uint32_t>(t->type));
    if (!ti) return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has an unknown type"));
    g = std::max<int64_t>(g, ti->block_elems);  // block sizes are powers of two: max == lcm
  }
  return g;
}

absl::StatusOr<HeadGranules> AlignedHeadGranules(const gguf::File& f, const ModelConfig& c) {
  return AlignedHeadGranules(f.tensors(), c);
}

absl::StatusOr<HeadGranules> AlignedHeadGranules(std::span<const gguf::TensorInfo> tensors,
                                                 const ModelConfig& c) {
  int64_t attn_block = 1, gdn_block = 1;
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string name =
        absl::StrCat("blk.", i, c.is_recurrent[i] ? ".ssm_out.weight" : ".attn_output.weight");
    const gguf::TensorInfo* t = FindIn(tensors, name);
    if (!t) return absl::InvalidArgumentError(absl::StrCat("missing tensor ", name));
    const GgmlTypeInfo* ti = FindGgmlType(static_cast<uint32_t>(t->type));
    if (!ti) return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has an unknown type"));
    int64_t& b = c.is_recurrent[i] ? gdn_block : attn_block;
    b = std::max<int64_t>(b, ti->block_elems);
  }
  auto granule = [](int64_t block, int64_t width, int units) {
    const int64_t m = block / std::gcd(block, width);
    return units % m == 0 ? static_cast<int>(m) : 1;
  };
  HeadGranules g;
  if (c.n_head_kv > 0)
    g.attn = granule(attn_block, static_cast<int64_t>(c.n_head / c.n_head_kv) * c.head_dim, c.n_head_kv);
  g.gdn = granule(gdn_block, c.gdn_v_dim, c.gdn_k_heads);
  return g;
}

std::vector<Range> GdnValueHeads(int Hk, int Hv, Range k) {
  std::vector<Range> out;
  if (k.size() == 0) return out;
  for (int r = 0; r < Hv / Hk; ++r) out.push_back({r * Hk + k.begin, r * Hk + k.end});
  return out;
}

namespace {
std::vector<Range> Scale(const std::vector<Range>& v, int64_t m, int64_t off = 0) {
  std::vector<Range> o;
  for (const Range& r : v) o.push_back({off + r.begin * m, off + r.end * m});
  return o;
}
}  // namespace

Cut CutFor(const ModelConfig& c, const Plan& p, int r, std::string_view n) {
  const RankShard& s = p.ranks[r];
  const int64_t g = c.n_head / c.n_head_kv, hd = c.head_dim, dk = c.gdn_k_dim, dv = c.gdn_v_dim;
  const int64_t Kw = static_cast<int64_t>(c.gdn_k_heads) * dk;
  const std::vector<Range> vh = GdnValueHeads(c.gdn_k_heads, c.gdn_v_heads, s.gdn_units);
  auto rows = [](std::vector<Range> v) { return Cut{Cut::kRows, std::move(v)}; };
  auto cols = [](std::vector<Range> v) { return Cut{Cut::kCols, std::move(v)}; };
  const Range a = s.attn_units, k = s.gdn_units;
  if (n == "attn_q.weight") return rows({{a.begin * g * 2 * hd, a.end * g * 2 * hd}});
  if (n == "attn_k.weight" || n == "attn_v.weight") return rows({{a.begin * hd, a.end * hd}});
  if (n == "attn_output.weight") return cols({{a.begin * g * hd, a.end * g * hd}});
  if (n == "attn_qkv.weight" || n == "ssm_conv1d.weight") {
    std::vector<Range> v = {{k.begin * dk, k.end * dk}, {Kw + k.begin * dk, Kw + k.end * dk}};
    for (const Range& x : Scale(vh, dv, 2 * Kw)) v.push_back(x);
    return rows(std::move(v));
  }
  if (n == "attn_gate.weight") return rows(Scale(vh, dv));
  if (n == "ssm_beta.weight" || n == "ssm_alpha.weight") return rows(vh);
  if (n == "ssm_a" || n == "ssm_dt.bias") return cols(vh);  // 1-D: elements run along ne0
  if (n == "ssm_out.weight") return cols(Scale(vh, dv));
  if (n == "ffn_gate.weight" || n == "ffn_up.weight") return rows({s.ffn});
  if (n == "ffn_down.weight") return cols({s.ffn});
  // The embedding is vocab-parallel like the lm_head, with the same rows (docs/tp.md §3).
  // The MTP block's own embedding and head (when the file has them) are cut the same way.
  if (n == "output.weight" || n == "token_embd.weight" || n == "nextn.embed_tokens.weight" ||
      n == "nextn.shared_head_head.weight")
    return rows({s.vocab});
  return Cut{};
}

absl::StatusOr<std::vector<RankMemory>> PlanMemory(const gguf::File& f, const ModelConfig& c,
                                                   const Plan& p) {
  return PlanMemory(f.tensors(), c, p);
}

absl::StatusOr<std::vector<RankMemory>> PlanMemory(std::span<const gguf::TensorInfo> tensors,
                                                   const ModelConfig& c, const Plan& p) {
  std::vector<RankMemory> out(p.world);
  for (int r = 0; r < p.world; ++r) {
    RankMemory& m = out[r];
    for (const gguf::TensorInfo& t : tensors) {
      std::string_view name = t.name, suffix = name;
      if (name.rfind("blk.", 0) == 0) {
        const size_t dot = name.find('.', 4);
        int layer = -1;
        if (dot == std::string_view::npos || !absl::SimpleAtoi(std::string(name.substr(4, dot - 4)), &layer))
          continue;
        // The MTP block (layer n_layer) is cut like a trunk attention layer; its nextn.*
        // tensors are whole on every rank except the embedding and head (CutFor).
        if (layer > c.n_layer || (layer == c.n_layer && c.n_nextn < 1)) continue;
        suffix = name.substr(dot + 1);
      }
      const Cut cut = CutFor(c, p, r, suffix);
      const int64_t ne0 = t.ne[0], nrows = t.n_rows();
      int64_t sel = 0;
      for (const Range& x : cut.ranges) sel += x.size();
      const GgmlTypeInfo* ti = FindGgmlType(static_cast<uint32_t>(t.type));
      if (!ti) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": unknown type"));
      switch (cut.kind) {
        case Cut::kAll: m.weight_bytes += t.nbytes; break;
        case Cut::kRows: m.weight_bytes += static_cast<uint64_t>(sel) * t.row_bytes(); break;
        case Cut::kCols: {
          bool aligned = true;
          for (const Range& x : cut.ranges)
            aligned &= x.begin % ti->block_elems == 0 && x.end % ti->block_elems == 0;
          if (aligned) {
            m.weight_bytes += static_cast<uint64_t>(nrows) * GgmlRowBytes(t.type, sel);
          } else {
            const uint64_t b = static_cast<uint64_t>(nrows) * sel * 4;
            m.weight_bytes += b;
            m.dequantized_bytes += b;
          }
          break;
        }
      }
      (void)ne0;
    }
    int n_gdn = 0, n_attn = 0;
    for (int i = 0; i < c.n_layer; ++i) (c.is_recurrent[i] ? n_gdn : n_attn)++;
    const uint64_t hk = p.gdn_k(r), hv = p.gdn_v(r);
    const uint64_t conv = static_cast<uint64_t>(c.conv_kernel - 1) * (2 * hk * c.gdn_k_dim + hv * c.gdn_v_dim);
    const uint64_t ssm = hv * c.gdn_k_dim * c.gdn_v_dim;
    m.state_bytes_per_slot = 4ull * n_gdn * (conv + ssm);
    m.kv_bytes_per_token = 4ull * n_attn * 2 * p.kv_heads(r) * c.head_dim;
  }
  return out;
}

std::string MemoryReport(const Plan& p, std::span<const RankMemory> m, int slot_ctx) {
  std::string s = "TP memory plan (per rank; state and KV are f32, per slot of slot_ctx " +
                  std::to_string(slot_ctx) + "):\n";
  for (int r = 0; r < p.world; ++r)
    absl::StrAppendFormat(&s,
                          "  rank %d: weights %.3f MiB (of which dequantized %.3f MiB), GDN state "
                          "%.3f MiB/slot, KV %.1f KiB/token = %.3f MiB/slot\n",
                          r, m[r].weight_bytes / 1048576.0, m[r].dequantized_bytes / 1048576.0,
                          m[r].state_bytes_per_slot / 1048576.0, m[r].kv_bytes_per_token / 1024.0,
                          m[r].kv_bytes_per_token * static_cast<double>(slot_ctx) / 1048576.0);
  return s;
}

}  // namespace ds::tp
