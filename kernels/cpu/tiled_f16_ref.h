// CPU reference of the f16 tensor-core matmul on tiled Q6_K, Q4_K, Q5_K, Q8_0, IQ4_XS and IQ4_NL
// (kernels/cuda/tiled_f16.cuh): the activation conversion it takes and the dot product it
// computes, so that the kernel is tested against what it is meant to compute (f16 operands), not
// only against the f32 product.
#pragma once
#include <cstdint>

namespace ds::cpu {

// One row as HalfActivations (kernels/cuda/tiled_f16.cu) converts it: e such that the row's
// largest |x| lies in [2^13, 2^14) after scaling by 2^e (e = 0 for an all-zero or non-finite
// row; e <= 114), xh[k] = f16(x[k] * 2^e) rounded to nearest even, *xs = 2^-e.
void HalfActivationsRow(const float* x, int64_t n, uint16_t* xh, float* xs);

// One Q6_K row (n / 256 raw GGUF blocks) times one f16 column as the kernel's operands hold
// them, exactly (double): sum over units u of d_u * sum_k f16((q_k - 32) * sc_k) * xh_k.
// `abs_sum` (optional) gets the sum of |terms|, the scale for tolerances.
double TiledF16DotQ6K(const void* row, const uint16_t* xh, int64_t n, double* abs_sum = nullptr);

// The sub-block sums that Q4_K / Q5_K need for their minimum term (HalfActivations' optional
// output): sums[b] = f16(float(sum of xh[32b..32b+31]) * 2^-6), rounded to nearest even. The
// sum of 32 f16 values is exact in double whatever the order (they span at most 2^-24..2^16), so
// every kernel that makes these gets the same bits; the 2^-6 keeps |sum| < 2^19 of a row scaled
// into [2^13, 2^14) inside f16's range.
void HalfSubBlockSums(const uint16_t* xh, int64_t n, uint16_t* sums);

// One Q4_K (q5 = false) or Q5_K row (n / 256 raw GGUF blocks) times one f16 column as the kernel
// computes it, exactly (double): sum over units u of d_u * sum_k (sc_k * q_k) * xh_k minus
// 64 * dmin_u * sum_j mn_j * sums_j, with sums from HalfSubBlockSums. `abs_sum` (optional) gets
// the sum of the |terms| of both parts, the scale for tolerances.
double TiledF16DotKq(const void* row, bool q5, const uint16_t* xh, const uint16_t* sums, int64_t n,
                     double* abs_sum = nullptr);

// One Q8_0 row (n / 32 raw GGUF blocks) times one f16 column as the kernel computes it, exactly
// (double): sum over 256-element units u of 2^-e_u * sum_k f16(q_k * d'_k) * xh_k, with d' =
// f16(d * 2^e_u) the block's scale and e_u from the unit's 8 scales (tiled_q8::UnitExponent).
double TiledF16DotQ80(const void* row, const uint16_t* xh, int64_t n, double* abs_sum = nullptr);

// One IQ4_XS row (n / 256 raw GGUF blocks) times one f16 column as the kernel computes it,
// exactly (double): sum over units of d * sum_k f16(codebook[idx_k] * (ls_k - 32)) * xh_k.
double TiledF16DotIq4Xs(const void* row, const uint16_t* xh, int64_t n, double* abs_sum = nullptr);

// One IQ4_NL row (n / 32 raw GGUF blocks) times one f16 column as the kernel computes it, exactly
// (double): as TiledF16DotQ80 with the codebook value of each index for the quant.
double TiledF16DotIq4Nl(const void* row, const uint16_t* xh, int64_t n, double* abs_sum = nullptr);

}  // namespace ds::cpu
