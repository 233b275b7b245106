// Tensor-parallel sharding plan (docs/tp.md): which head units, FFN columns and vocabulary rows
// each rank of a TP group owns, and how every weight tensor of the model is cut for a rank.
//
// Units (the indivisible pieces a split is counted in):
//   * attention: one KV head κ with its g = n_head / n_head_kv query heads [κ·g, (κ+1)·g)
//     (the CPU/ggml GQA rule: query head h reads KV head ⌊h / g⌋);
//   * Gated DeltaNet: one key head κ with its R = Hv / Hk value heads {r·Hk + κ : r < R} — GGUF's
//     tiled value-head order (spec §5.3: value head p reads key head p mod Hk). A rank owning key
//     heads [k0, k1) keeps its value heads in local order r·(k1−k0) + (κ − k0), so the local
//     tensors are again tiled and the unchanged GDN kernels run on them with Hk' = k1 − k0;
//   * FFN: `ffn_granule` columns (the quant block of ffn_down, so its column slice is whole blocks);
//   * vocabulary: one lm_head row.
// Each kind of unit is apportioned separately by the split weights (largest remainder), so an
// uneven split like 1,2 gives every component roughly 1/3 vs 2/3. A rank may own zero units of
// a kind (e.g. 8 ranks over 4 KV heads); it then contributes zeros to that all-reduce.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/util/status.h"
#include "worker/model/config.h"

namespace ds::tp {

struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// Largest-remainder apportionment of n units by positive weights; ties go to the lower rank.
// Σ result = n; result[i] ∈ {⌊n·w_i/Σw⌋, ⌈n·w_i/Σw⌉}.
std::vector<int64_t> Apportion(int64_t n, std::span<const double> weights);

// "1,2" / "1:1.5" → {1, 2} / {1, 1.5}. Errors name the bad field.
absl::StatusOr<std::vector<double>> ParseSplit(std::string_view s);

// Split weights proportional to each device's free memory (bytes).
std::vector<double> SplitFromFreeBytes(std::span<const double> free_bytes);

// This host's MemAvailable (/proc/meminfo) in GiB, the free memory of a CPU rank for
// `--split mem`; 1.0 when it cannot be read.
double HostMemAvailableGiB();

enum class LmHead {
  kVocabParallel,  // each rank holds rows `vocab` of output.weight; logits all-gathered
  kRank0,          // rank 0 holds the whole lm_head and alone produces logits
};

struct RankShard {
  int rank = 0;
  Range attn_units;  // KV heads [b, e); query heads [b·g, e·g)
  Range gdn_units;   // GDN key heads [b, e) and their tiled value heads
  Range ffn;         // FFN columns [b, e)
  Range vocab;       // output.weight rows held by this rank
};

struct Plan {
  int world = 1;
  std::vector<double> split;  // [world] weights as given (normalised only for printing)
  int64_t ffn_granule = 1;
  int attn_granule = 1;  // attention units are apportioned in groups of this many KV heads
  int gdn_granule = 1;   // GDN units in groups of this many key heads
  LmHead lm_head = LmHead::kVocabParallel;
  // Model sizes the plan was made for.
  int n_head = 0, n_head_kv = 0, gdn_k_heads = 0, gdn_v_heads = 0;
  int64_t n_ff = 0, n_vocab = 0;
  std::vector<RankShard> ranks;  // [world]

  // split empty = even. ffn_granule must divide n_ff; attn_granule n_head_kv; gdn_granule Hk.
  static absl::StatusOr<Plan> Make(const ModelConfig& c, std::span<const double> split,
                                   int64_t ffn_granule, LmHead lm_head, int attn_granule = 1,
                                   int gdn_granule = 1);
  // Local sizes of a rank.
  int q_heads(int r) const { return static_cast<int>(ranks[r].attn_units.size()) * (n_head / n_head_kv); }
  int kv_heads(int r) const { return static_cast<int>(ranks[r].attn_units.size()); }
  int gdn_k(int r) const { return static_cast<int>(ranks[r].gdn_units.size()); }
  int gdn_v(int r) const { return gdn_k(r) * (gdn_v_heads / gdn_k_heads); }
  std::string ToString() const;
};

// The quant block of the model's ffn_down tensors (largest over layers): the FFN granule.
absl::StatusOr<int64_t> FfnGranule(const gguf::File& f, const ModelConfig& c);
// The same over a tensor table (names, shapes, types): a file's, or one described without a file
// (`deltaserve tp-plan --synth`, which plans for a model it never writes).
absl::StatusOr<int64_t> FfnGranule(std::span<const gguf::TensorInfo> tensors, const ModelConfig& c);

// Head granules that keep the row-parallel column slices (attn_output, ssm_out) on quant-block
// boundaries: the smallest m with m·(unit width) a multiple of the block (27B Q6_K: GDN m = 2
// since dv = 128 < 256; attention m = 1 since 6·256 is whole blocks). m = 1 when it does not
// divide the unit count (that slice is then dequantized at load instead).
struct HeadGranules {
  int attn = 1, gdn = 1;
};
absl::StatusOr<HeadGranules> AlignedHeadGranules(const gguf::File& f, const ModelConfig& c);
absl::StatusOr<HeadGranules> AlignedHeadGranules(std::span<const gguf::TensorInfo> tensors,
                                                 const ModelConfig& c);

// How one rank's piece of a tensor is cut out of the full GGUF tensor (rows = ggml ne1, PyTorch
// out dimension; cols = ne0, in dimension). Ranges are concatenated in the given order.
struct Cut {
  enum Kind { kAll, kRows, kCols } kind = kAll;
  std::vector<Range> ranges;
};

// The cut of tensor `suffix` (name after "blk.i.", e.g. "attn_qkv.weight", "ssm_a", or a global
// name "output.weight") of a layer for rank r. Tensors not listed are replicated (kAll).
Cut CutFor(const ModelConfig& c, const Plan& p, int r, std::string_view suffix);

// Value-head index ranges (GGUF order) of key units [k0, k1), in local order: for r in [0, R):
// [r·Hk + k0, r·Hk + k1).
std::vector<Range> GdnValueHeads(int Hk, int Hv, Range k_units);

// Memory planner: bytes each rank holds for its shard (weights as cut by CutFor, state and KV).
struct RankMemory {
  uint64_t weight_bytes = 0;          // matrices + small tensors of this rank (embedding included)
  uint64_t dequantized_bytes = 0;     // of which f32 copies of unaligned column slices
  uint64_t state_bytes_per_slot = 0;  // GDN conv + delta-rule state of its heads, f32
  uint64_t kv_bytes_per_token = 0;    // K + V rows of its KV heads over all attention layers, f32
};
absl::StatusOr<std::vector<RankMemory>> PlanMemory(const gguf::File& f, const ModelConfig& c,
                                                   const Plan& p);
absl::StatusOr<std::vector<RankMemory>> PlanMemory(std::span<const gguf::TensorInfo> tensors,
                                                   const ModelConfig& c, const Plan& p);
std::string MemoryReport(const Plan& p, std::span<const RankMemory> m, int slot_ctx);

}  // namespace ds::tp
