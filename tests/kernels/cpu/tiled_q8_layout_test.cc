// The tiled Q8_0 layout (kernels/cpu/tiled_q8_layout.h) on the CPU: a tile-unit packed by
// PackLane in all 32 lanes holds every quant at the lane, step and row half the f16 fragment
// wants and the 8 scales of every row verbatim; UnitExponent puts a unit's largest scale in
// [2^8, 2^9) for normal and subnormal scales; and the kernel's arithmetic emulated from the packed
// tile equals the CPU reference cpu::TiledF16DotQ80, which is the dequantized product to f16
// rounding.
#include "kernels/cpu/tiled_q8_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/tiled_f16_ref.h"

namespace ds::tiled_q8 {
namespace {

std::vector<uint8_t> RandomRows(int rows, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows) * K);
  for (auto& v : w) v = n(rng);
  for (int r = 0; r < rows; ++r) {
    w[static_cast<size_t>(r) * K + 3 + r] = 0.9f;  // one block of each row far larger
    for (int k = 64; k < 96; ++k) w[static_cast<size_t>(r) * K + k] *= 1e-6f;  // a tiny block
  }
  const size_t rb = GgmlRowBytes(GgmlType::Q8_0, K);
  std::vector<uint8_t> raw(rb * rows);
  for (int r = 0; r < rows; ++r)
    cpu::QuantizeRow(GgmlType::Q8_0, w.data() + static_cast<size_t>(r) * K, raw.data() + rb * r, K);
  return raw;
}

std::vector<uint8_t> PackUnit(const std::vector<uint8_t>& raw, int rows, int K, int u) {
  const size_t rb = GgmlRowBytes(GgmlType::Q8_0, K);
  const uint8_t* unit_rows[kRows];
  for (int r = 0; r < kRows; ++r)
    unit_rows[r] = r < rows ? raw.data() + rb * r + static_cast<size_t>(u) * 8 * kBlockBytes : nullptr;
  std::vector<uint8_t> unit(kUnitBytes, 0xEE);
  for (int T = 0; T < 32; ++T) PackLane(unit_rows, T, unit.data());
  return unit;
}

uint16_t Scale(const std::vector<uint8_t>& unit, int r, int b) {
  uint16_t d;
  std::memcpy(&d, unit.data() + kOffD + 16 * r + 2 * b, 2);
  return d;
}

TEST(TiledQ8Layout, QuantsAndScalesWhereTheKernelReadsThem) {
  for (int rows : {16, 9}) {
    const int K = 512;
    const auto raw = RandomRows(rows, K, 31);
    const size_t rb = GgmlRowBytes(GgmlType::Q8_0, K);
    for (int u = 0; u < K / 256; ++u) {
      const auto unit = PackUnit(raw, rows, K, u);
      for (int T = 0; T < 32; ++T)
        for (int s = 0; s < 16; ++s)
          for (int h = 0; h < 2; ++h) {
            uint32_t w;
            std::memcpy(&w, unit.data() + QsWordOffset(T, s, h), 4);
            const int r = (T >> 2) + 8 * h;
            for (int j = 0; j < 4; ++j) {
              const int k = 256 * u + 16 * s + 4 * (T & 3) + j;
              const int8_t want =
                  r < rows ? static_cast<int8_t>(raw[rb * r + (k / 32) * kBlockBytes + 2 + k % 32]) : 0;
              ASSERT_EQ(static_cast<int8_t>(w >> (8 * j)), want)
                  << "rows=" << rows << " u=" << u << " T=" << T << " s=" << s << " h=" << h;
            }
          }
      for (int r = 0; r < kRows; ++r)
        for (int b = 0; b < 8; ++b) {
          uint16_t want = 0;
          if (r < rows) std::memcpy(&want, raw.data() + rb * r + (8 * u + b) * kBlockBytes, 2);
          EXPECT_EQ(Scale(unit, r, b), want) << "r=" << r << " b=" << b;
        }
    }
  }
}

TEST(TiledQ8Layout, UnitExponentPutsTheLargestScaleInRange) {
  for (float big : {1e-3f, 0.0123f, 3.5f, 255.f, 6e-5f, 3e-6f, 6e-8f, 65504.f}) {
    uint16_t d[8] = {F32ToF16(big * 0.01f), F32ToF16(-big), 0, F32ToF16(big * 0.5f), 0, 0, 0, 0};
    const int e = UnitExponent(d);
    const double m = std::fabs(F16ToF32(d[1])) * std::ldexp(1.0, e);
    EXPECT_GE(m, 256.0) << big;
    EXPECT_LT(m, 512.0) << big;
    EXPECT_EQ(F16ToF32(F32ToF16(ScaledScale(F16ToF32(d[1]), e))), static_cast<float>(-m)) << big;
  }
  const uint16_t zeros[8] = {0, 0x8000, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(UnitExponent(zeros), 0);
  EXPECT_EQ(ScaledScale(1.f, -5), 1.f / 32);
}

// The kernel's arithmetic on the packed tile (per unit and lane: q exact, times the f16 d' of its
// block, rounded once, times the f16 activation; the unit's 2^-e) equals the reference, and the
// reference times the row scale is the dequantized product to f16 rounding.
TEST(TiledQ8Layout, EmulatedKernelMatchesReference) {
  const int K = 768, rows = 16;
  const auto raw = RandomRows(rows, K, 7);
  const size_t rb = GgmlRowBytes(GgmlType::Q8_0, K);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> ux(-3.f, 3.f);
  std::vector<float> x(K);
  for (auto& v : x) v = ux(rng);
  std::vector<uint16_t> xh(K);
  float xs = 0;
  cpu::HalfActivationsRow(x.data(), K, xh.data(), &xs);
  std::vector<double> emulated(rows, 0.0);
  for (int u = 0; u < K / 256; ++u) {
    const auto unit = PackUnit(raw, rows, K, u);
    for (int r = 0; r < rows; ++r) {
      uint16_t d[8];
      for (int b = 0; b < 8; ++b) d[b] = Scale(unit, r, b);
      const int e = UnitExponent(d);
      double part = 0;
      for (int T = 4 * (r & 7); T < 4 * (r & 7) + 4; ++T)
        for (int s = 0; s < 16; ++s) {
          uint32_t w;
          std::memcpy(&w, unit.data() + QsWordOffset(T, s, r >> 3), 4);
          const float dp = F16ToF32(F32ToF16(ScaledScale(F16ToF32(d[s >> 1]), e)));
          for (int j = 0; j < 4; ++j) {
            const float q = F16ToF32(F32ToF16(static_cast<float>(((w >> (8 * j)) & 0xFF) ^ 0x80) + 1024.f)) - 1152.f;
            part += static_cast<double>(F16ToF32(F32ToF16(q * dp))) *
                    F16ToF32(xh[256 * u + 16 * s + 4 * (T & 3) + j]);
          }
        }
      emulated[r] += ScaledScale(1.f, -e) * part;
    }
  }
  for (int r = 0; r < rows; ++r) {
    double abs_sum = 0;
    const double ref = cpu::TiledF16DotQ80(raw.data() + rb * r, xh.data(), K, &abs_sum);
    EXPECT_NEAR(emulated[r], ref, 1e-12 * abs_sum) << "row " << r;
    EXPECT_GT(abs_sum, 0.0);
    std::vector<float> w(K);
    cpu::DequantizeRow(GgmlType::Q8_0, raw.data() + rb * r, w.data(), K);
    double direct = 0, abs_direct = 0;
    for (int k = 0; k < K; ++k) {
      direct += static_cast<double>(w[k]) * x[k];
      abs_direct += std::fabs(static_cast<double>(w[k]) * x[k]);
    }
    // f16 weights q d' (2^-11 relative each, subnormal ones 2^-24 absolute) and activations.
    EXPECT_NEAR(ref * xs, direct, 0x1p-10 * (abs_sum * xs + abs_direct) + 1e-9) << "row " << r;
  }
}

}  // namespace
}  // namespace ds::tiled_q8
