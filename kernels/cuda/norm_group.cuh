// Device helpers shared by the kernels that end in an RMSNorm over rows laid out as groups of 8
// consecutive floats per thread (norm.cu RmsNormWideKernel, custom_allreduce.cu's fused
// all-reduce + norm): scale a group, store it, and quantize it to int8 the way the GEMV kernels'
// activations are (QuantizeActKernel: d = amax / 127, q = rint(v / d) per block of 32 floats).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda {

// v = (a, b) * inv * (wa, wb): one group of 8 floats normalised and weighted.
__device__ __forceinline__ void NormGroup(float4 a, float4 b, float4 wa, float4 wb, float inv,
                                          float (&v)[8]) {
  v[0] = a.x * inv * wa.x; v[1] = a.y * inv * wa.y; v[2] = a.z * inv * wa.z; v[3] = a.w * inv * wa.w;
  v[4] = b.x * inv * wb.x; v[5] = b.y * inv * wb.y; v[6] = b.z * inv * wb.z; v[7] = b.w * inv * wb.w;
}

// Group g of a row: out[g] <- v when `ok`, and (kQuant) its int8 quantization into xq (the row's
// bytes) with the block scale in xd (the row's scales). A 32-float block is the groups of 4
// neighbouring lanes, which exchange their maxima, so EVERY lane of the warp must call this
// (lanes past the row with ok = false and v all zero).
template <bool kQuant>
__device__ __forceinline__ void StoreNormGroup(const float (&v)[8], bool ok, int g, float4* out,
                                               int8_t* xq, float* xd) {
  if (ok) {
    out[2 * g] = make_float4(v[0], v[1], v[2], v[3]);
    out[2 * g + 1] = make_float4(v[4], v[5], v[6], v[7]);
  }
  if constexpr (kQuant) {
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    if (ok) {
      const float d = amax / 127.f;
      const float id = d > 0.f ? 1.f / d : 0.f;
      uint32_t q[2] = {0, 0};
#pragma unroll
      for (int j = 0; j < 8; ++j)
        q[j >> 2] |= (static_cast<uint32_t>(__float2int_rn(v[j] * id)) & 0xFFu) << (8 * (j & 3));
      *reinterpret_cast<uint2*>(xq + 8 * g) = make_uint2(q[0], q[1]);
      if ((g & 3) == 0) xd[g / 4] = d;
    }
  }
}

}  // namespace ds::cuda
