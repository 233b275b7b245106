// Gated full attention (spec/model.md §6.2) per-sequence CPU reference over an f32 KV cache.
#pragma once
#include <cstdint>

namespace ds {
class ThreadPool;
}

namespace ds::cpu {

struct AttnArgs {
  int n_head = 0;      // query heads
  int n_head_kv = 0;   // KV heads; query head h uses KV head h / (n_head / n_head_kv)
  int head_dim = 0;
  int n_rot = 0;       // NeoX rope on the first n_rot dims of each head
  float rope_base = 1e7f;
  float eps = 1e-6f;
  int64_t T = 0;       // new tokens
  int32_t pos0 = 0;    // position of the first new token == number of cached rows before it
  const float* qg = nullptr;      // [T, n_head * 2 * head_dim]: per head [query | gate]
  const float* k = nullptr;       // [T, n_head_kv * head_dim] pre-norm
  const float* v = nullptr;       // [T, n_head_kv * head_dim]
  const float* q_norm = nullptr;  // [head_dim] (+1 already baked in, §3.4)
  const float* k_norm = nullptr;  // [head_dim]
  float* k_cache = nullptr;       // [>= pos0 + T, n_head_kv * head_dim]; rows pos0.. written
  float* v_cache = nullptr;       // same
  // Paged cache (issue #23): when page_table is set, k_cache / v_cache are a pool of pages of
  // page_size rows and cache row j lives at row page_table[j / page_size] * page_size +
  // j % page_size of it (the CUDA KvCacheView rule). Null: rows are contiguous.
  const int32_t* page_table = nullptr;  // [>= ceil((pos0 + T) / page_size)]
  int page_size = 0;
  // Optional row mask over cache rows [0, pos0 + T): rows with valid[j] == 0 are not attended.
  const uint8_t* valid = nullptr;
  float* out = nullptr;           // [T, n_head * head_dim] = attention output ⊙ sigmoid(gate)
  ThreadPool* pool = nullptr;     // (token, head) pairs run in parallel; nullptr = serial
};

// Normalises + ropes the new q/k, appends k/v to the cache at rows pos0..pos0+T-1, and computes
// causal softmax attention (token t sees cache rows [0, pos0 + t]) with the sigmoid output gate.
// Output projection is left to the caller (it is batched across sequences).
void GatedAttention(const AttnArgs& a);

// The MTP layer's row mask after writing rows [pos0, pos0 + n) of a sequence whose rows
// [0, old_len) may be valid: the written rows become valid and every row past them is dropped
// (rejected drafts), spec §8.3. Returns the new length pos0 + n. (CUDA: MtpMaskUpdate.)
inline int32_t MtpMaskWrite(uint8_t* valid, int32_t pos0, int32_t n, int32_t old_len) {
  for (int32_t j = pos0; j < old_len || j < pos0 + n; ++j) valid[j] = j < pos0 + n ? 1 : 0;
  return pos0 + n;
}

}  // namespace ds::cpu
