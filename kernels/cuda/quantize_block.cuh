// The int8 quantization of one 32-element activation block by one warp (lane i holds element i):
// scale d = amax / 127, q = round(x / d), and optionally the sums of lanes 0-15 and 16-31 (the
// tiled kernel's kSums, gemv_tiled.cu). One definition for every kernel that writes int8
// activations (QuantizeActivations, the GDN decode kernel's fused output), so that a matmul sees
// the same bits whichever kernel quantized its input.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace ds::cuda {

// Every lane of the warp must call it. xq: the block's 32 bytes; xd: its scale; xsum: its two
// 16-element sums, or null.
__device__ __forceinline__ void QuantizeBlock32(float v, int lane, int8_t* xq, float* xd,
                                                int32_t* xsum) {
  const float amax = WarpMax(fabsf(v));
  const float d = amax / 127.f;
  const float id = d > 0.f ? 1.f / d : 0.f;
  const int qv = __float2int_rn(v * id);
  xq[lane] = static_cast<int8_t>(qv);
  if (lane == 0) *xd = d;
  if (xsum != nullptr) {
    int sum = qv;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((lane & 15) == 0) xsum[lane >> 4] = sum;
  }
}

}  // namespace ds::cuda
