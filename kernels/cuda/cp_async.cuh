// Asynchronous global -> shared copies (cp.async, sm_80+), shared by the kernels that stage
// operands through shared memory (mmq.cu, attention_mma.cu). Their callers run only on sm_80+
// (TiledAvailable / the portable path's switch); below, a copy traps.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda {

__device__ __forceinline__ void CpAsync16(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src));
#else
  __trap();  // never launched below sm_80
#endif
}
__device__ __forceinline__ void CpAsyncCommit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;");
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

}  // namespace ds::cuda
