// f16 tensor-core building blocks (sm_80+) shared by the attention kernels (attention_mma.cu,
// attention_prefill_mma.cu): the m16n8k16 mma with f32 accumulation and the ldmatrix loads of
// its fragments. Below sm_80 they compile to nothing; their callers never launch there.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda {

// An f16 pair as the 32-bit register an mma operand takes, and back.
__device__ __forceinline__ uint32_t Bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 Half2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// c += a (16x16, row) * b (16x8, col): the PTX fragment layouts (lane = 4 g + tig: a0 = rows g,
// k 2tig..+1; a1 = rows g + 8; a2 / a3 = k + 8; b0 = k 2tig..+1, column g; b1 = k + 8; c0, c1 =
// row g, columns 2tig, 2tig + 1; c2, c3 = row g + 8).
__device__ __forceinline__ void MmaF16(const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                       float (&c)[4]) {
#if __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// c += a (16x8, row) * b (8x8, col), the k = 8 form: a0 = row g, k 2tig..+1; a1 = row g + 8;
// b0 = k 2tig..+1, column g; c as above.
__device__ __forceinline__ void MmaF16K8(uint32_t a0, uint32_t a1, uint32_t b0, float (&c)[4]) {
#if __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
#endif
}

// Four 8x8 b16 matrices from shared memory; lanes 8m..8m+7 give the row addresses of matrix m,
// r[m] is this lane's fragment of it (row lane / 4, elements 2 (lane % 4), +1; transposed with
// the .trans form).
__device__ __forceinline__ void LdMatrixX4(const void* p, uint32_t (&r)[4]) {
#if __CUDA_ARCH__ >= 800
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}
__device__ __forceinline__ void LdMatrixX4Trans(const void* p, uint32_t (&r)[4]) {
#if __CUDA_ARCH__ >= 800
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

}  // namespace ds::cuda
