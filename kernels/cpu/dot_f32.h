// f32 dot products over whole chunks (n a multiple of 16): the sums every CPU matmul and DotRow
// are made of. Two 8-lane accumulators and a fixed reduction tree, so a result depends only on
// its inputs; DotF32x4 runs four of them interleaved with the same operations per chain.
#pragma once
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace ds::cpu {

#if defined(__AVX2__) && defined(__FMA__)
// The fixed reduction tree of one dot's two 8-lane accumulators.
inline float SumAccumulators(__m256 acc0, __m256 acc1) {
  const __m256 acc = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// Dot product of n floats, n a multiple of 16 (deterministic for a given n).
inline float DotF32(const float* a, const float* x, int n) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
  }
  return SumAccumulators(acc0, acc1);
#else
  float acc[16] = {};
  for (int i = 0; i < n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += a[i + k] * x[i + k];
  for (int k = 0; k < 8; ++k) acc[k] += acc[k + 8];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
#endif
}

// out[k] = DotF32(a[k], x[k], n) for k < 4, with the same operations in the same order per k
// (bit-identical), the four chains interleaved: one DotF32 waits on its two FMA chains, four
// of them keep the FMA units busy. n a multiple of 16.
inline void DotF32x4(const float* const a[4], const float* const x[4], int n, float out[4]) {
#if defined(__AVX2__) && defined(__FMA__)
  // Eight named accumulators (arrays indexed in a loop were kept on the stack).
  __m256 p0 = _mm256_setzero_ps(), q0 = p0, p1 = p0, q1 = p0, p2 = p0, q2 = p0, p3 = p0, q3 = p0;
  const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3];
  const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
  for (int i = 0; i < n; i += 16) {
    p0 = _mm256_fmadd_ps(_mm256_loadu_ps(a0 + i), _mm256_loadu_ps(x0 + i), p0);
    q0 = _mm256_fmadd_ps(_mm256_loadu_ps(a0 + i + 8), _mm256_loadu_ps(x0 + i + 8), q0);
    p1 = _mm256_fmadd_ps(_mm256_loadu_ps(a1 + i), _mm256_loadu_ps(x1 + i), p1);
    q1 = _mm256_fmadd_ps(_mm256_loadu_ps(a1 + i + 8), _mm256_loadu_ps(x1 + i + 8), q1);
    p2 = _mm256_fmadd_ps(_mm256_loadu_ps(a2 + i), _mm256_loadu_ps(x2 + i), p2);
    q2 = _mm256_fmadd_ps(_mm256_loadu_ps(a2 + i + 8), _mm256_loadu_ps(x2 + i + 8), q2);
    p3 = _mm256_fmadd_ps(_mm256_loadu_ps(a3 + i), _mm256_loadu_ps(x3 + i), p3);
    q3 = _mm256_fmadd_ps(_mm256_loadu_ps(a3 + i + 8), _mm256_loadu_ps(x3 + i + 8), q3);
  }
  out[0] = SumAccumulators(p0, q0);
  out[1] = SumAccumulators(p1, q1);
  out[2] = SumAccumulators(p2, q2);
  out[3] = SumAccumulators(p3, q3);
#else
  for (int k = 0; k < 4; ++k) out[k] = DotF32(a[k], x[k], n);
#endif
}

}  // namespace ds::cpu
