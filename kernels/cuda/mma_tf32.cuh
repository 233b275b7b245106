// TF32 tensor-core building blocks (sm_80+): the m16n8k8 mma with f32 accumulation, and the
// three-pass ("3xTF32") product that keeps f32 accuracy. Used by the chunked Gated DeltaNet scan
// (gdn_chunk_scan_mma.cu). Below sm_80 they compile to nothing; their callers never launch there.
//
// Why three passes: one TF32 operand keeps 10 of f32's 23 mantissa bits, so a product of two
// rounded operands is off by ~2^-11 relative, which the delta rule's V' = U - W S (a difference
// of near-equal terms once the state has learned) and its state carried over hundreds of chunks
// turn into errors far above the f32 scan's. Writing x = hi + lo (hi = tf32(x), lo = tf32(x - hi))
// and summing lo_a hi_b + hi_a lo_b + hi_a hi_b drops only the lo_a lo_b term (~2^-22 relative):
// the f32 scan's accuracy at three times the tensor work, which is still a small part of a step.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda {

// x rounded to TF32 (nearest, ties away), as the 32-bit register an mma operand takes.
__device__ __forceinline__ uint32_t ToTf32(float x) {
  uint32_t r = 0;
#if __CUDA_ARCH__ >= 800
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
#endif
  return r;
}

// x = hi + lo, both TF32.
struct Tf32Pair {
  uint32_t hi, lo;
};
__device__ __forceinline__ Tf32Pair SplitTf32(float x) {
  const uint32_t hi = ToTf32(x);
  return {hi, ToTf32(x - __uint_as_float(hi))};
}

// c += a (16x8, row) * b (8x8, col), TF32 operands: the PTX fragment layouts (lane = 4 g + t:
// a0 = (row g, k t), a1 = (g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4); b0 = (k t, column g),
// b1 = (t + 4, g); c0, c1 = row g, columns 2t, 2t + 1; c2, c3 = row g + 8).
__device__ __forceinline__ void MmaTf32(const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                        float (&c)[4]) {
#if __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// c += a * b with both operands split (3xTF32, small terms first).
__device__ __forceinline__ void Mma3xTf32(const Tf32Pair (&a)[4], const Tf32Pair& b0,
                                          const Tf32Pair& b1, float (&c)[4]) {
  const uint32_t ah[4] = {a[0].hi, a[1].hi, a[2].hi, a[3].hi};
  const uint32_t al[4] = {a[0].lo, a[1].lo, a[2].lo, a[3].lo};
  MmaTf32(al, b0.hi, b1.hi, c);
  MmaTf32(ah, b0.lo, b1.lo, c);
  MmaTf32(ah, b0.hi, b1.hi, c);
}

}  // namespace ds::cuda
