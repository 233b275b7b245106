// Vocabulary-wide float kernels used by the sampler (internal). Each has a portable scalar
// reference; the AVX2+FMA versions produce bit-identical results (same fma placement, same
// per-lane summation order), so sampled tokens do not depend on the instruction set.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

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

// hist[(i % 4) * stride + (bits(w[i]) >> 20)] += w[i] for w: [n], w[i] in [0, 1];
// hist: [4, stride], stride >= 1024. Four interleaved copies break the load-add-store chain on a
// hot bin; the caller sums them.
void MassHistogram(const float* w, size_t n, double* hist, size_t stride);

// Appends to `out` the indices i (ascending) with x[i] >= thr and x[i] > 0; x: [n] without NaN.
void CollectAtLeast(const float* x, size_t n, float thr, std::vector<int32_t>& out);

}  // namespace ds::sampling::internal
