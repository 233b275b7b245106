// The per-row f16 scaling of TiledF16Multi's activations (tiled_f16.cuh, HalfActivations),
// shared by HalfActivations and the fused RMSNorm (norm.cu, RmsNormHalf) so that both give the
// same bits: the row's largest |x| (m) times 2^(14 - ex) lies in [2^13, 2^14).
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

}  // namespace ds::cuda
