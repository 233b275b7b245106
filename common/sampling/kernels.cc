#include "common/sampling/kernels.h"

#include "common/sampling/exp_constants.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DS_SAMPLING_AVX2 1
#endif

namespace ds::sampling::internal {
namespace {

using namespace exp_constants;  // NOLINT: the exp below reads like its formula
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float Sanitize(float v) { return std::isnan(v) ? kNegInf : std::min(v, FLT_MAX); }

template <bool kStore>
double ExpSumScalarImpl(const float* x, size_t n, float shift, float scale, float* out,
                        double* block_sums) {
  double total = 0.0;
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += kSumBlock, ++bi) {
    const size_t b1 = std::min(n, b0 + kSumBlock);
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t i = b0; i < b1; ++i) {
      const float w = Exp((x[i] - shift) * scale);
      if constexpr (kStore) out[i] = w;
      lanes[(i - b0) & 7] += w;
    }
    double bs = 0.0;
    for (float l : lanes) bs += l;
    if (block_sums != nullptr) block_sums[bi] = bs;
    total += bs;
  }
  return total;
}

#if DS_SAMPLING_AVX2
// Same operation sequence as Exp(): every multiply-add that Exp() does with std::fma is an FMA
// here, the rest are separately rounded, so lanes match the scalar function bit for bit.
inline __m256 Exp8(__m256 s) {
  const __m256 lo = _mm256_set1_ps(kExpLo);
  const __m256 valid = _mm256_cmp_ps(s, lo, _CMP_GE_OQ);  // false for NaN and s < lo
  const __m256 x = _mm256_min_ps(_mm256_max_ps(s, lo), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 y = _mm256_fmadd_ps(p, z, r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_and_ps(y, valid);
}

template <bool kStore>
double ExpSumAvx2Impl(const float* x, size_t n, float shift, float scale, float* out,
                      double* block_sums) {
  const __m256 vshift = _mm256_set1_ps(shift);
  const __m256 vscale = _mm256_set1_ps(scale);
  double total = 0.0;
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += kSumBlock, ++bi) {
    const size_t b1 = std::min(n, b0 + kSumBlock);
    __m256 acc = _mm256_setzero_ps();
    size_t i = b0;
    for (; i + 8 <= b1; i += 8) {
      const __m256 s = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vshift), vscale);
      const __m256 w = Exp8(s);
      if constexpr (kStore) _mm256_storeu_ps(out + i, w);
      acc = _mm256_add_ps(acc, w);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    for (; i < b1; ++i) {
      const float w = Exp((x[i] - shift) * scale);
      if constexpr (kStore) out[i] = w;
      lanes[(i - b0) & 7] += w;
    }
    double bs = 0.0;
    for (float l : lanes) bs += l;
    if (block_sums != nullptr) block_sums[bi] = bs;
    total += bs;
  }
  return total;
}
#endif

}  // namespace

float Exp(float s) {
  if (!(s >= kExpLo)) return 0.0f;
  const float x = std::min(s, kExpHi);
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float p = kP0;
  p = std::fma(p, r, kP1);
  p = std::fma(p, r, kP2);
  p = std::fma(p, r, kP3);
  p = std::fma(p, r, kP4);
  p = std::fma(p, r, kP5);
  const float z = r * r;
  float y = std::fma(p, z, r);
  y = y + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return y * std::bit_cast<float>(bits);
}

float CopySanitizedMaxScalar(const float* x, size_t n, float* out) {
  float m = kNegInf;
  for (size_t i = 0; i < n; ++i) {
    const float v = Sanitize(x[i]);
    out[i] = v;
    m = std::max(m, v);
  }
  return m;
}

float CopySanitizedMax(const float* x, size_t n, float* out) {
#if DS_SAMPLING_AVX2
  const __m256 fmax = _mm256_set1_ps(FLT_MAX);
  const __m256 ninf = _mm256_set1_ps(kNegInf);
  __m256 m0 = ninf, m1 = ninf;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_loadu_ps(x + i);
    __m256 b = _mm256_loadu_ps(x + i + 8);
    // min_ps returns its second operand when the first is NaN, so blend NaN lanes afterwards.
    a = _mm256_blendv_ps(_mm256_min_ps(a, fmax), ninf, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    b = _mm256_blendv_ps(_mm256_min_ps(b, fmax), ninf, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    _mm256_storeu_ps(out + i, a);
    _mm256_storeu_ps(out + i + 8, b);
    m0 = _mm256_max_ps(m0, a);
    m1 = _mm256_max_ps(m1, b);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  float m = CopySanitizedMaxScalar(x + i, n - i, out + i);
  for (float l : lanes) m = std::max(m, l);
  return m;
#else
  return CopySanitizedMaxScalar(x, n, out);
#endif
}

float Max(const float* x, size_t n) {
  float m = kNegInf;
  size_t i = 0;
#if DS_SAMPLING_AVX2
  __m256 m0 = _mm256_set1_ps(kNegInf), m1 = m0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  for (float l : lanes) m = std::max(m, l);
#endif
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

void MassHistogram(const float* w, size_t n, double* hist, size_t stride) {
  size_t i = 0;
#if DS_SAMPLING_AVX2
  // Converting with vcvtps2pd writes whole registers; a scalar float->double conversion would
  // merge into the previous iteration's register and chain every iteration through the adds.
  alignas(32) double d[8];
  alignas(32) uint32_t bins[8];
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(w + i);
    _mm256_store_pd(d, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    _mm256_store_pd(d + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(bins),
                       _mm256_srli_epi32(_mm256_castps_si256(v), 20));
    for (size_t j = 0; j < 4; ++j) {
      hist[j * stride + bins[j]] += d[j];
      hist[j * stride + bins[j + 4]] += d[j + 4];
    }
  }
#endif
  for (; i < n; ++i) hist[(i & 3) * stride + (std::bit_cast<uint32_t>(w[i]) >> 20)] += w[i];
}

void CollectAtLeast(const float* x, size_t n, float thr, std::vector<int32_t>& out) {
  const float t = thr > 0.0f ? thr : std::numeric_limits<float>::denorm_min();
  size_t i = 0;
#if DS_SAMPLING_AVX2
  // Most of the vocabulary is below the threshold: one compare + movemask per 8 tokens.
  const __m256 vt = _mm256_set1_ps(t);
  for (; i + 8 <= n; i += 8) {
    unsigned mask = static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vt, _CMP_GE_OQ)));
    while (mask != 0) {
      out.push_back(static_cast<int32_t>(i + std::countr_zero(mask)));
      mask &= mask - 1;
    }
  }
#endif
  for (; i < n; ++i) {
    if (x[i] >= t) out.push_back(static_cast<int32_t>(i));
  }
}

double ExpSumScalar(const float* x, size_t n, float shift, float scale, float* out,
                    double* block_sums) {
  return out != nullptr ? ExpSumScalarImpl<true>(x, n, shift, scale, out, block_sums)
                        : ExpSumScalarImpl<false>(x, n, shift, scale, out, block_sums);
}

double ExpSum(const float* x, size_t n, float shift, float scale, float* out, double* block_sums) {
#if DS_SAMPLING_AVX2
  return out != nullptr ? ExpSumAvx2Impl<true>(x, n, shift, scale, out, block_sums)
                        : ExpSumAvx2Impl<false>(x, n, shift, scale, out, block_sums);
#else
  return ExpSumScalar(x, n, shift, scale, out, block_sums);
#endif
}

}  // namespace ds::sampling::internal
