// CPU reference of the FP8 prefill matmul (kernels/cuda/gemm_fp8.cuh, issue #22): the e4m3
// encoding, the two block quantizers and the product, so that the GPU path is tested against
// what it is meant to compute.
//
// The scheme is DeepSeek-V3's block scaling (cuBLASLt's VEC128 / BLK128x128 modes): activations
// keep one f32 scale per token and 128-element block along K, weights one per 128 x 128 block;
// a value is q * s with q an e4m3 number (OCP "FN": no infinities, finite range +-448) and
// s = amax / 448 of its block.
#pragma once
#include <cstdint>

namespace ds::cpu {

inline constexpr int kFp8Block = 128;

// e4m3 ("FN") of f: round to nearest even, saturated to +-448; NaN -> 0x7F. Decode is exact.
uint8_t F32ToE4M3(float f);
float E4M3ToF32(uint8_t b);

// Activations: q[t * K + k] = e4m3(x[t * K + k] * (1 / s)) with s = amax / 448 of token t's
// 128-block b = k / 128 (an all-zero block: s = 0, q = 0); scale[b * ld_scale + t] = s.
// K % 128 == 0.
void QuantizeTokensFp8(const float* x, int64_t tokens, int K, uint8_t* q, float* scale,
                       int64_t ld_scale);

// Weights: q[r * K + k] = e4m3(w[r * K + k] * (1 / s)) with s = amax / 448 of the 128 x 128 block
// (r / 128, k / 128); scale[(r / 128) * Fp8BlockScaleLd(K) + k / 128] = s (a row block's K blocks
// contiguous, padded to a multiple of 4: cuBLASLt's BLK128x128 layout; the padding is left as
// it was). rows % 128 == 0, K % 128 == 0.
inline constexpr int64_t Fp8BlockScaleLd(int K) { return (K / kFp8Block + 3) / 4 * 4; }
void QuantizeBlocksFp8(const float* w, int64_t rows, int K, uint8_t* q, float* scale);

// y[t * ldy + r] (+)= sum_k ws(r, k) * xs(t, k) * e4m3(qw[r, k]) * e4m3(qx[t, k]) in double
// (the GPU's tensor cores sum in another order: compare within a bound). abs_sum (optional,
// [T * ldy]) gets the sum of |terms|, the scale of that bound.
void GemmFp8Ref(const uint8_t* w, const float* ws, const uint8_t* x, const float* xs,
                int64_t ld_xs, float* y, int M, int K, int T, int64_t ldy, bool accumulate,
                double* abs_sum = nullptr);

}  // namespace ds::cpu
