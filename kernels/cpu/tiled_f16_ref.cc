// CPU reference of the f16 tensor-core matmul on tiled Q6_K (tiled_f16_ref.h).
#include "kernels/cpu/tiled_f16_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/tiled_iq4nl_layout.h"
#include "kernels/cpu/tiled_iq4xs_layout.h"
#include "kernels/cpu/tiled_kquant_layout.h"
#include "kernels/cpu/tiled_q8_layout.h"

namespace ds::cpu {

void HalfActivationsRow(const float* x, int64_t n, uint16_t* xh, float* xs) {
  float m = 0.f;
  for (int64_t k = 0; k < n; ++k) m = std::fmax(m, std::fabs(x[k]));
  int ex = 14;
  if (m > 0.f && std::isfinite(m)) std::frexp(m, &ex);
  ex = std::max(ex, -100);  // 2^(14 - ex) stays a finite float
  const float scale = std::ldexp(1.f, 14 - ex);
  for (int64_t k = 0; k < n; ++k) xh[k] = F32ToF16(x[k] * scale);
  *xs = std::ldexp(1.f, ex - 14);
}

double TiledF16DotQ6K(const void* row, const uint16_t* xh, int64_t n, double* abs_sum) {
  const auto* blocks = static_cast<const BlockQ6K*>(row);
  double sum = 0, abs = 0;
  for (int64_t u = 0; u < n / 256; ++u) {
    const BlockQ6K& b = blocks[u];
    const double d = F16ToF32(b.d);
    double unit = 0, unit_abs = 0;
    for (int k = 0; k < 256; ++k) {
      // (q - 32) * sc is an integer of at most 13 bits; the kernel rounds it to f16 once.
      const float a = F16ToF32(F32ToF16(static_cast<float>(Q6KCentred(b, k) * b.scales[k / 16])));
      const double t = static_cast<double>(a) * F16ToF32(xh[256 * u + k]);
      unit += t;
      unit_abs += std::fabs(t);
    }
    sum += d * unit;
    abs += std::fabs(d) * unit_abs;
  }
  if (abs_sum) *abs_sum = abs;
  return sum;
}

void HalfSubBlockSums(const uint16_t* xh, int64_t n, uint16_t* sums) {
  for (int64_t b = 0; b < n / 32; ++b) {
    double s = 0;
    for (int k = 0; k < 32; ++k) s += F16ToF32(xh[32 * b + k]);
    sums[b] = F32ToF16(static_cast<float>(s) * 0x1p-6f);
  }
}

double TiledF16DotKq(const void* row, bool q5, const uint16_t* xh, const uint16_t* sums, int64_t n,
                     double* abs_sum) {
  const auto* bytes = static_cast<const uint8_t*>(row);
  const int bb = tiled_kq::RawBlockBytes(q5);
  double sum = 0, abs = 0;
  for (int64_t u = 0; u < n / 256; ++u) {
    const uint8_t* b = bytes + u * bb;
    uint16_t dh, mh;
    std::memcpy(&dh, b, 2);
    std::memcpy(&mh, b + 2, 2);
    const double d = F16ToF32(dh), dmin = F16ToF32(mh);
    double unit = 0, unit_abs = 0, mins = 0, mins_abs = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      UnpackKScaleMin(b + 4, j, &sc, &mn);
      for (int k = 32 * j; k < 32 * j + 32; ++k) {
        const double t = static_cast<double>(sc * tiled_kq::RawQuant(b, q5, k)) * F16ToF32(xh[256 * u + k]);
        unit += t;
        unit_abs += std::fabs(t);
      }
      const double m = static_cast<double>(mn) * F16ToF32(sums[8 * u + j]);
      mins += m;
      mins_abs += std::fabs(m);
    }
    sum += d * unit - 64.0 * dmin * mins;
    abs += std::fabs(d) * unit_abs + 64.0 * std::fabs(dmin) * mins_abs;
  }
  if (abs_sum) *abs_sum = abs;
  return sum;
}

namespace {

// The formats with an f16 scale at the start of every 32-element block (Q8_0, IQ4_NL) as the
// kernel computes them: per unit e from the 8 scales, f16(v_k * f16(d 2^e)) times xh_k, 2^-e.
// value(unit, k): element k's integer value (the int8 quant, the codebook entry).
template <class Value>
double BlockScaledDot(const uint8_t* bytes, int block_bytes, const uint16_t* xh, int64_t n,
                      double* abs_sum, const Value& value) {
  double sum = 0, abs = 0;
  for (int64_t u = 0; u < n / 256; ++u) {
    const uint8_t* unit = bytes + u * 8 * block_bytes;
    uint16_t d[8];
    for (int b = 0; b < 8; ++b) std::memcpy(&d[b], unit + b * block_bytes, 2);
    const int e = tiled_q8::UnitExponent(d);
    double part = 0, part_abs = 0;
    for (int k = 0; k < 256; ++k) {
      const float dp = F16ToF32(F32ToF16(tiled_q8::ScaledScale(F16ToF32(d[k / 32]), e)));
      // v * d' is exact in f32 (8 x 11 bits); the kernel's f16 multiply rounds it once.
      const float w = F16ToF32(F32ToF16(static_cast<float>(value(unit, k)) * dp));
      const double t = static_cast<double>(w) * F16ToF32(xh[256 * u + k]);
      part += t;
      part_abs += std::fabs(t);
    }
    const double scale = tiled_q8::ScaledScale(1.f, -e);
    sum += scale * part;
    abs += scale * part_abs;
  }
  if (abs_sum) *abs_sum = abs;
  return sum;
}

}  // namespace

double TiledF16DotQ80(const void* row, const uint16_t* xh, int64_t n, double* abs_sum) {
  return BlockScaledDot(static_cast<const uint8_t*>(row), tiled_q8::kBlockBytes, xh, n, abs_sum,
                        [](const uint8_t* unit, int k) {
                          return static_cast<int8_t>(unit[(k / 32) * tiled_q8::kBlockBytes + 2 + k % 32]);
                        });
}

double TiledF16DotIq4Nl(const void* row, const uint16_t* xh, int64_t n, double* abs_sum) {
  return BlockScaledDot(static_cast<const uint8_t*>(row), tiled_iq4nl::kBlockBytes, xh, n, abs_sum,
                        [](const uint8_t* unit, int k) {
                          return kIq4Values[tiled_iq4nl::RawIndex(unit, k)];
                        });
}

double TiledF16DotIq4Xs(const void* row, const uint16_t* xh, int64_t n, double* abs_sum) {
  const auto* bytes = static_cast<const uint8_t*>(row);
  double sum = 0, abs = 0;
  for (int64_t u = 0; u < n / 256; ++u) {
    const uint8_t* b = bytes + u * tiled_iq4xs::kBlockBytes;
    uint16_t dh, sh;
    std::memcpy(&dh, b, 2);
    std::memcpy(&sh, b + 2, 2);
    double part = 0, part_abs = 0;
    for (int k = 0; k < 256; ++k) {
      const int j = k / 32;
      const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
      // An integer of at most 127 * 32: exact in f16 up to 2048, rounded once above.
      const float a = F16ToF32(F32ToF16(static_cast<float>(
          kIq4Values[tiled_iq4xs::RawIndex(b, k)] * (ls - 32))));
      const double t = static_cast<double>(a) * F16ToF32(xh[256 * u + k]);
      part += t;
      part_abs += std::fabs(t);
    }
    const double d = F16ToF32(dh);
    sum += d * part;
    abs += std::fabs(d) * part_abs;
  }
  if (abs_sum) *abs_sum = abs;
  return sum;
}

}  // namespace ds::cpu
