// Vocabulary-wide float kernels used by the sampler (internal). Each has a portable scalar
// reference; the AVX2+FMA versions produce bit-identical results (same fma placement, same
// per-lane summation order), so sampled tokens do not depend on the instruction set.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ds::sampling::internal {

// Elements per partial sum in ExpSum; the draw uses the per-block sums to skip whole blocks.
inline constexpr size_t kSumBlock = 256;

// exp(s) for s <= 88, flushed to 0 below ln(FLT_MIN) (and for -inf / NaN). Cody-Waite reduction
// s = n ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r (Cephes expf coefficients), scale by 2^n
// via the exponent bits. Max relative error ~2 ulp; exp(0) == 1 exactly.
float Exp(float s);

// out[i] = x[i] with NaN -> -inf and +inf -> FLT_MAX (so later differences stay finite or -inf).
// Returns max(out). x and out: [n]; out may alias x.
float CopySanitizedMax(const float* x, size_t n, float* out);
float CopySanitizedMaxScalar(const float* x, size_t n, float* out);

// Max of x: [n] (no NaN), -inf for n == 0.
float Max(const float* x, size_t n);

// w[i] = Exp((x[i] - shift) * scale). Stores w into out ([n], may alias x) when out != nullptr,
// the sum of each kSumBlock block into block_sums ([ceil(n / kSumBlock)]) when non-null, and
// returns the total. Within a block element i accumulates into float lane (i - block_start) % 8;
// lanes are then added in order in double.
double ExpSum(const float* x, size_t n, float shift, float scale, float* out, double* block_sums);
double ExpSumScalar(const float* x, size_t n, float shift, float scale, float* out,
                    double* block_sums);

}  // namespace ds::sampling::internal
