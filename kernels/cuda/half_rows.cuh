// The per-row f16 scaling of TiledF16Multi's activations (tiled_f16.cuh, HalfActivations),
// shared by HalfActivations and the fused RMSNorm (norm.cu, RmsNormHalf) so that both give the
// same bits: the row's largest |x| (m) times 2^(14 - ex) lies in [2^13, 2^14); and the
// sub-block sums of those f16 values that tiled Q4_K / Q5_K need.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/mma_f16.cuh"

namespace ds::cuda {

// ex of the row scale 2^(14 - ex); 14 (scale 1) for an all-zero or non-finite row, >= -100 so
// that the scale stays a finite float.
__device__ __forceinline__ int HalfRowExponent(float m) {
  int ex = 14;
  if (m > 0.f && isfinite(m)) frexpf(m, &ex);
  return max(ex, -100);
}

// Four floats times `scale`, rounded to nearest f16, as the 8 bytes of two f16 pairs.
__device__ __forceinline__ uint2 HalfScaled4(float4 v, float scale) {
  const __half2 lo = __floats2half2_rn(v.x * scale, v.y * scale);
  const __half2 hi = __floats2half2_rn(v.z * scale, v.w * scale);
  return make_uint2(Bits(lo), Bits(hi));
}

// Stores HalfScaled4's pairs of elements 4i..4i+3 into a row: in order, or in the order of the
// warpgroup (wgmma) matmul kernel (tiled_f16.cuh, TiledF16Scratch::warpgroup_order): within each
// 16-element group, the pairs starting at elements 0, 4, 8, 12, then those at 2, 6, 10, 14. That
// is the order in which the tiled weight fragments hold k (thread q: k = 4q..4q+3 at operand
// positions 2q, 2q+1 and 2q+8, 2q+9), so the tensor core's B tile is a plain copy of the row.
__device__ __forceinline__ void StoreHalf4(uint16_t* row, int i, uint2 h, bool warpgroup_order) {
  if (!warpgroup_order) {
    reinterpret_cast<uint2*>(row)[i] = h;
    return;
  }
  uint32_t* group = reinterpret_cast<uint32_t*>(row) + 8 * (i >> 2);
  group[i & 3] = h.x;
  group[4 + (i & 3)] = h.y;
}

// The exact sum of the four f16 values of two pairs (double: a sub-block's 32 values span at most
// 2^-24..2^16, so their sum in any order is exact).
__device__ __forceinline__ double HalfSum4(uint2 h) {
  const float2 a = __half22float2(Half2(h.x)), b = __half22float2(Half2(h.y));
  return (static_cast<double>(a.x) + a.y) + (static_cast<double>(b.x) + b.y);
}

// The sum over each aligned group of kLanes lanes (every lane of the warp takes part).
template <int kLanes>
__device__ __forceinline__ double LaneGroupSum(double v) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A sub-block's exact sum as the Q4_K / Q5_K minimum term takes it (cpu::HalfSubBlockSums):
// f16(float(sum) * 2^-6).
__device__ __forceinline__ uint16_t SubBlockSumBits(double sum) {
  return __half_as_ushort(__float2half_rn(static_cast<float>(sum) * 0x1p-6f));
}

}  // namespace ds::cuda
