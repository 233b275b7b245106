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
// 16 bytes, or 16 zero bytes when !valid (src is not read then, but must be a mapped address).
__device__ __forceinline__ void CpAsync16Zfill(void* dst, const void* src, bool valid) {
#if __CUDA_ARCH__ >= 800
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src),
               "r"(valid ? 16 : 0));
#else
  __trap();
#endif
}
// One 4-byte element (through L1: cp.async.cg takes 16 bytes only).
__device__ __forceinline__ void CpAsync4(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(src));
#else
  __trap();
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
