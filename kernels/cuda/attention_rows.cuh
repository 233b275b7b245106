// Device helpers the decode attention kernels share (attention.cu, attention_mma.cu): where a
// token's cache row lives, and how a sequence is cut into splits. Internal to kernels/cuda.
#pragma once
#include <cstdint>

#include "kernels/cuda/attention.cuh"

namespace ds::cuda {

// First head row of token `pos` of slot `slot` (head h is row + h).
__device__ __forceinline__ int64_t KvRow(const KvCacheView& kv, int slot, int pos) {
  const int page = kv.block_table[slot * kv.max_pages + pos / kv.page_size];
  return (static_cast<int64_t>(page) * kv.page_size + pos % kv.page_size) * kv.n_kv;
}

// Tokens per split: the fixed split count spread over the sequence, but never under
// kAttnMinChunk tokens, so a short sequence uses few splits (`used`) and the combine reads only
// those. Every decode kernel and the combine cut a sequence the same way.
constexpr int kAttnMinChunk = 64;

__device__ __forceinline__ int SplitChunk(int len, int n_splits, int* used) {
  const int chunk = max((len + n_splits - 1) / n_splits, kAttnMinChunk);
  *used = (len + chunk - 1) / chunk;
  return chunk;
}

}  // namespace ds::cuda
