#include "kernels/cuda/page_copy.cuh"

#include "kernels/cuda/common.cuh"

namespace ds::cuda {
namespace {

// Block (j, i) copies page j of pool i; 16-byte words when every address allows, else bytes.
template <typename Word>
__global__ void CopyPagesKernel(const __grid_constant__ PageCopyArgs a) {
  const int j = blockIdx.x, i = blockIdx.y;
  const uint64_t words = a.page_bytes / sizeof(Word);
  Word* in_pool = reinterpret_cast<Word*>(a.pool[i] + static_cast<uint64_t>(a.pages[j]) * a.page_bytes);
  Word* in_packed = reinterpret_cast<Word*>(a.packed[i] + static_cast<uint64_t>(j) * a.page_bytes);
  const Word* src = a.to_packed ? in_pool : in_packed;
  Word* dst = a.to_packed ? in_packed : in_pool;
  for (uint64_t w = threadIdx.x; w < words; w += blockDim.x) dst[w] = src[w];
}

}  // namespace

absl::Status CopyPages(const PageCopyArgs& a, cudaStream_t stream) {
  if (a.n_pools < 0 || a.n_pools > kPageCopyMaxPools || a.n_pages < 0)
    return absl::InvalidArgumentError(absl::StrCat("CopyPages: ", a.n_pools, " pools, ", a.n_pages, " pages"));
  if (a.n_pools == 0 || a.n_pages == 0 || a.page_bytes == 0) return absl::OkStatus();
  if (a.pages == nullptr) return absl::InvalidArgumentError("CopyPages: no page list");
  bool aligned = a.page_bytes % 16 == 0;
  for (int i = 0; i < a.n_pools; ++i) {
    if (a.pool[i] == nullptr || a.packed[i] == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("CopyPages: pool ", i, " has no address"));
    aligned = aligned && reinterpret_cast<uintptr_t>(a.pool[i]) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(a.packed[i]) % 16 == 0;
  }
  const dim3 grid(a.n_pages, a.n_pools);
  if (aligned) CopyPagesKernel<uint4><<<grid, 256, 0, stream>>>(a);
  else CopyPagesKernel<uint8_t><<<grid, 256, 0, stream>>>(a);
  return LastLaunchStatus("CopyPages");
}

}  // namespace ds::cuda
