// A sequence's KV pages between the paged pool and a packed copy, all layers in one launch
// (prefix-cache checkpoints in device memory: one cudaMemcpy per page and layer was ~8,000 calls
// for a 16k-token checkpoint of the 27B). CPU reference: kernels/cpu/page_copy.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

constexpr int kPageCopyMaxPools = 64;

struct PageCopyArgs {
  uint8_t* pool[kPageCopyMaxPools] = {};    // the layers' K or V pools
  uint8_t* packed[kPageCopyMaxPools] = {};  // where pool i's pages go, one after another
  int n_pools = 0;
  const int32_t* pages = nullptr;  // [n_pages] device: the sequence's page ids in position order
  int n_pages = 0;
  uint64_t page_bytes = 0;
  bool to_packed = true;  // pool -> packed; false: packed -> pool
};

// For each pool i and entry j: pool[i] + pages[j] * page_bytes <-> packed[i] + j * page_bytes.
absl::Status CopyPages(const PageCopyArgs& a, cudaStream_t stream);

}  // namespace ds::cuda
