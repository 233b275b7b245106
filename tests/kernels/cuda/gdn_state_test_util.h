// The GDN GPU tests' view of the delta-rule state in either storage type (kernels/cuda/gdn.cuh,
// GdnDecodeArgs / GdnPrefillArgs::state_bf16): device bytes <-> f32 values, and the check of a
// bf16 state against the CPU emulation's (cpu::DeltaRuleArgs::state_bf16).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/util/half.h"

namespace ds::cuda {

// Elements [first, first + n) of a state held as `bytes` (f32, or bf16 when `bf16`), as f32.
inline std::vector<float> StateAsF32(const std::vector<uint8_t>& bytes, size_t first, size_t n,
                                     bool bf16) {
  std::vector<float> v(n);
  if (!bf16) {
    std::memcpy(v.data(), bytes.data() + first * 4, n * 4);
    return v;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + (first + i) * 2, 2);
    v[i] = Bf16ToF32(h);
  }
  return v;
}

// f32 values (already bf16 values when `bf16`) as the bytes of a state of that storage type.
inline std::vector<uint8_t> StateBytes(const std::vector<float>& v, bool bf16) {
  std::vector<uint8_t> b(v.size() * (bf16 ? 2 : 4));
  if (!bf16) {
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = F32ToBf16(v[i]);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  return b;
}

// A bf16 state the GPU stored after one rounding (a decode token, a prefill piece) from the
// same input state as the CPU emulation's (the tests copy the GPU's state into the CPU's before
// each call, so that no earlier difference is carried). Both round to nearest even from f32
// values that differ only by the two sides' f32 arithmetic (__expf, fma, the chunked form's
// order: the f32 tests' 2e-4 relative L2 bound, ~1e-6 per typical element), so they are equal
// except where the two values straddle a rounding midpoint: there they are one bf16 ulp apart
// (2^-8 of the value, 2^-7 at most at a binade's low end), and that is a small fraction of the
// elements (the CPU's chunked vs recurrent forms: none of 6,144, DeltaRule.Bf16StateRoundAtEnd).
// A kernel that rounds differently (truncation, rounding per token where the reference rounds
// once per piece, a run's later token reading the unrounded value) leaves about half of them
// apart, and a wrong element or index is far more than one ulp off. Elements far below the
// state's scale are an exception: the f32 sums that made them cancelled, so the two sides' f32
// differences (absolute, ~1e-7 of the largest elements: the f32 tests' max abs) can exceed
// their ulp (H200, 2026-12-03: 2.589e-7 vs 2.645e-7 in a state whose elements reach ~1e-1).
// Bounds: every element within one ulp plus 1e-5 of the largest |element|, at most 3% of them
// differing.
inline void ExpectBf16StateMatches(const std::vector<float>& got, const std::vector<float>& ref,
                                   const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double scale = 0;
  for (float v : ref) scale = std::fmax(scale, std::fabs(v));
  const double floor = 1e-5 * scale;
  size_t differ = 0, far = 0, first_far = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (got[i] == ref[i]) continue;
    ++differ;
    const double d = std::fabs(double(got[i]) - ref[i]);
    if (!(d <= std::ldexp(std::fmax(std::fabs(got[i]), std::fabs(ref[i])), -7) + floor) &&
        far++ == 0)
      first_far = i;
  }
  std::printf("  gdn %-8s bf16 elements differing by one ulp: %zu of %zu\n", what, differ,
              ref.size());
  EXPECT_EQ(far, 0u) << what << ": more than one bf16 ulp apart, first at " << first_far << " ("
                     << got[first_far] << " vs " << ref[first_far] << ")";
  EXPECT_LE(differ, ref.size() * 3 / 100) << what;
}

}  // namespace ds::cuda
