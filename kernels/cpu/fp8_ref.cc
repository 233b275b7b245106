// CPU reference of the block-scaled FP8 matmul (fp8_ref.h).
#include "kernels/cpu/fp8_ref.h"

#include <cmath>
#include <vector>

namespace ds::cpu {

uint8_t F32ToE4M3(float f) {
  if (std::isnan(f)) return 0x7F;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= 448.f) return sign | 0x7E;  // saturated (everything above rounds to 448 or beyond)
  if (a < 0.015625f) {                 // below 2^-6: subnormals of 2^-9 steps (8 steps = 2^-6)
    const int m = static_cast<int>(std::nearbyint(a * 512.f));  // exact scaling, half to even
    return sign | static_cast<uint8_t>(m);                      // m == 8 is 2^-6's encoding
  }
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): a's exponent is e - 1
  const int exp = e - 1;
  // a * 2^(3 - exp) is in [8, 16): its integer part is 8 + mantissa; round half to even.
  int m = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exp))) - 8;
  int biased = exp + 7;
  if (m == 8) {
    m = 0;
    ++biased;
  }
  return sign | static_cast<uint8_t>((biased << 3) | m);
}

float E4M3ToF32(uint8_t b) {
  const float sign = (b & 0x80) ? -1.f : 1.f;
  const int biased = (b >> 3) & 0xF, m = b & 7;
  if (biased == 0xF && m == 7) return std::nanf("");
  if (biased == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(static_cast<float>(8 + m), biased - 7 - 3);
}

void QuantizeTokensFp8(const float* x, int64_t tokens, int K, uint8_t* q, float* scale,
                       int64_t ld_scale) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int b = 0; b < K / kFp8Block; ++b) {
      const float* xb = x + t * K + static_cast<int64_t>(b) * kFp8Block;
      float amax = 0.f;
      for (int i = 0; i < kFp8Block; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
      const float s = amax / 448.f;
      const float inv = s > 0.f ? 1.f / s : 0.f;
      for (int i = 0; i < kFp8Block; ++i)
        q[t * K + static_cast<int64_t>(b) * kFp8Block + i] = F32ToE4M3(xb[i] * inv);
      scale[static_cast<int64_t>(b) * ld_scale + t] = s;
    }
  }
}

void QuantizeBlocksFp8(const float* w, int64_t rows, int K, uint8_t* q, float* scale) {
  const int nb = K / kFp8Block;
  for (int64_t rb = 0; rb < rows / kFp8Block; ++rb) {
    for (int b = 0; b < nb; ++b) {
      float amax = 0.f;
      for (int64_t r = rb * kFp8Block; r < (rb + 1) * kFp8Block; ++r)
        for (int k = b * kFp8Block; k < (b + 1) * kFp8Block; ++k)
          amax = std::fmax(amax, std::fabs(w[r * K + k]));
      const float s = amax / 448.f;
      const float inv = s > 0.f ? 1.f / s : 0.f;
      for (int64_t r = rb * kFp8Block; r < (rb + 1) * kFp8Block; ++r)
        for (int k = b * kFp8Block; k < (b + 1) * kFp8Block; ++k)
          q[r * K + k] = F32ToE4M3(w[r * K + k] * inv);
      scale[rb * Fp8BlockScaleLd(K) + b] = s;
    }
  }
}

void GemmFp8Ref(const uint8_t* w, const float* ws, const uint8_t* x, const float* xs,
                int64_t ld_xs, float* y, int M, int K, int T, int64_t ldy, bool accumulate,
                double* abs_sum) {
  const int nb = K / kFp8Block;
  std::vector<float> lut(256);
  for (int i = 0; i < 256; ++i) lut[i] = E4M3ToF32(static_cast<uint8_t>(i));
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < M; ++r) {
      double sum = 0, mag = 0;
      for (int b = 0; b < nb; ++b) {
        const double s = static_cast<double>(ws[(r / kFp8Block) * Fp8BlockScaleLd(K) + b]) *
                         xs[static_cast<int64_t>(b) * ld_xs + t];
        double part = 0, part_mag = 0;
        for (int k = b * kFp8Block; k < (b + 1) * kFp8Block; ++k) {
          const double v = static_cast<double>(lut[w[static_cast<int64_t>(r) * K + k]]) *
                           lut[x[static_cast<int64_t>(t) * K + k]];
          part += v;
          part_mag += std::fabs(v);
        }
        sum += s * part;
        mag += std::fabs(s) * part_mag;
      }
      float& out = y[static_cast<int64_t>(t) * ldy + r];
      out = static_cast<float>(accumulate ? sum + out : sum);
      if (abs_sum) abs_sum[static_cast<int64_t>(t) * ldy + r] = mag;
    }
  }
}

}  // namespace ds::cpu
