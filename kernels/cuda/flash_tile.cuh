// The per-tile steps the two flash prefill attention kernels share (attention_prefill_mma.cu on
// mma.sync, attention_prefill_wgmma.cu on wgmma): both hold a key tile's scores and the output
// rows in mma C fragments (lane 4g + quad of a warp: entries e = 0, 1 in row g, 2, 3 in row g + 8;
// 8-column block n at columns 8n + 2 quad + e % 2), so the online softmax, the rescale and the
// gated store are the same code over a different number of blocks. Internal to kernels/cuda.
#pragma once
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_f16.cuh"

namespace ds::cuda {

// Online softmax of one tile of NS 8-key blocks for the lane's rows g, g + 8: scales the scores
// to base 2, masks keys past pos_row[r] when `diag` (some key of the tile lies past some row),
// updates the running max m (the 4 lanes of a row agree by two shuffles) and sum l (the lane's
// own part; summed over the row at the end), sets c = the factor O must be rescaled by, and packs
// P into the A fragments of the NS / 2 16-key steps of P V (block n: a0 / a1 of step n / 2 for
// even n, a2 / a3 for odd n).
template <int NS>
__device__ __forceinline__ void FlashSoftmaxTile(float (&sc)[NS][4], int key0, bool diag,
                                                 const int (&pos_row)[2], int quad,
                                                 float scale_log2, float (&m)[2], float (&l)[2],
                                                 float (&c)[2], uint32_t (&pa)[NS / 2][4]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, key = key0 + 8 * n + 2 * quad + (e & 1);
      float v = sc[n][e] * scale_log2;
      if (diag && key > pos_row[r]) v = -INFINITY;
      sc[n][e] = v;
      mx[r] = fmaxf(mx[r], v);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float mn = fmaxf(m[r], mx[r]);  // finite: key 0 is visible to every row
    c[r] = exp2f(m[r] - mn);
    m[r] = mn;
    l[r] *= c[r];
  }
#pragma unroll
  for (int n = 0; n < NS; ++n) {
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[e] = exp2f(sc[n][e] - m[e >> 1]);
      l[e >> 1] += p[e];
    }
    pa[n >> 1][(n & 1) * 2] = Bits(__floats2half2_rn(p[0], p[1]));
    pa[n >> 1][(n & 1) * 2 + 1] = Bits(__floats2half2_rn(p[2], p[3]));
  }
}

// O *= c per row, only when some lane's row max moved (c is exactly 1 otherwise): past the first
// tiles that is rare, and the rescale is as many instructions as a tile's products.
template <int NO>
__device__ __forceinline__ void FlashRescale(float (&o)[NO][4], const float (&c)[2]) {
  if (__any_sync(0xffffffffu, c[0] != 1.f || c[1] != 1.f)) {
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      o[n][0] *= c[0];
      o[n][1] *= c[0];
      o[n][2] *= c[1];
      o[n][3] *= c[1];
    }
  }
}

// The running sums of the lane's rows over their four lanes (after the last tile).
__device__ __forceinline__ void FlashRowSums(float (&l)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
}

// Row r (0: g, 1: g + 8) of the lane's output: O / l times the sigmoid of the gate, f32.
template <int NO>
__device__ __forceinline__ void FlashStoreRow(const float (&o)[NO][4], int r, float l, int quad,
                                              const float* gate, float* dst) {
  const float inv = 1.f / l;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    const int d = 8 * n + 2 * quad;
    const float2 gt = *reinterpret_cast<const float2*>(gate + d);
    float2 v;
    v.x = o[n][2 * r] * inv * Sigmoid(gt.x);
    v.y = o[n][2 * r + 1] * inv * Sigmoid(gt.y);
    *reinterpret_cast<float2*>(dst + d) = v;
  }
}

}  // namespace ds::cuda
