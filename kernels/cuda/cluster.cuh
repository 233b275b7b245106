// Thread-block cluster primitives (sm_90+, PTX): a cluster-wide barrier and reads of another
// block's shared memory (distributed shared memory), as the f16 matmul's K split uses them
// (tiled_f16.cu). PTX rather than cooperative_groups: the CUDA 11.8 toolchain of the Volta build
// lacks the libcu++ headers that header includes. Defined for sm_90+ device code only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Barrier of every thread of the cluster; shared-memory writes before it are visible after it.
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}
// The barrier in two halves, so that work goes between them: every thread arrives (relaxed: no
// ordering of its memory accesses), then waits for the cluster. Before a block's first access to
// another block's shared memory: that block has then started (the CUDA guide's rule for
// distributed shared memory).
__device__ __forceinline__ void ClusterArriveRelaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void ClusterWait() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}
// The distributed-shared-memory address of `p` (this block's shared memory) in block `rank` of
// the cluster.
__device__ __forceinline__ uint32_t MapSharedRank(const void* p, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(r)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))), "r"(rank));
  return r;
}
// One float at a distributed-shared-memory address (MapSharedRank's).
__device__ __forceinline__ float LoadCluster(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
// One 32-bit word into a distributed-shared-memory address (MapSharedRank's); the cluster
// barrier's release / acquire makes it visible to that block.
__device__ __forceinline__ void StoreCluster(uint32_t addr, uint32_t v) {
  asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
#endif

}  // namespace ds::cuda
