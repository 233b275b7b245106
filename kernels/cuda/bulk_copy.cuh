// One-shot bulk copies from global to shared memory (sm_90's copy engine, `cp.async.bulk`)
// completing on a shared-memory barrier (`mbarrier`), for kernels that move one contiguous
// piece per block: one thread asks for the whole piece with one instruction, no thread holds a
// register for it while it is in flight, and every thread waits on the barrier before it reads.
//
// Below sm_90 every helper traps: callers launch the kernels that use them only where
// GdnBulkStateAvailable() (gdn.cuh) said the sm_90 code is there.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DS_BULK_COPY 1
#else
#define DS_BULK_COPY 0
#endif

namespace ds::cuda {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Thread 0 of the block, before the barrier's first use; the block synchronizes after it.
__device__ __forceinline__ void MbarrierInitForBulkCopy(uint64_t* bar) {
#if DS_BULK_COPY
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(SharedAddress(bar)));
  // The copy engine (the async proxy) must see the initialized barrier.
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
  __trap();
#endif
}

// One thread: copies `bytes` (a multiple of 16; both addresses 16-byte aligned; < 2^20) from
// `src` to `dst`, arriving on `bar` with the byte count as the transaction to wait for.
__device__ __forceinline__ void BulkCopyToShared(void* dst, const void* src, uint32_t bytes,
                                                 uint64_t* bar) {
#if DS_BULK_COPY
  const uint32_t b = SharedAddress(bar);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(SharedAddress(dst)),
      "l"(src), "r"(bytes), "r"(b)
      : "memory");
#else
  __trap();
#endif
}

// Every thread that reads the copied bytes: returns once the barrier's phase `parity` completed
// (the first copy on a fresh barrier is phase 0). The completed phase makes the bytes visible.
__device__ __forceinline__ void MbarrierWait(uint64_t* bar, uint32_t parity) {
#if DS_BULK_COPY
  const uint32_t b = SharedAddress(bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(b), "r"(parity)
        : "memory");
  }
#else
  __trap();
#endif
}

}  // namespace ds::cuda
