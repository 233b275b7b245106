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
#include "tests/kernels/cpu/tiled_layout_test_util.h"

namespace ds::tiled_q8 {
namespace {

// Random Q8_0 rows: one block far larger than the rest, one tiny block per row.
std::vector<uint8_t> RandomRows(int rows, int K, uint32_t seed) {
  return tiled_test::QuantizedRows(GgmlType::Q8_0, rows, K, seed, 3, 0.9f, 64);
}

std::vector<uint8_t> PackUnit(const std::vector<uint8_t>& raw, int rows, int K, int u) {
  return tiled_test::PackTileUnit(GgmlType::Q8_0, raw, rows, K, u, kUnitBytes, PackLane);
}

uint16_t Scale(const std::vector<uint8_t>& unit, int r, int b) {
  return tiled_test::BlockScaleBits(unit, kOffD, r, b);
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
  const tiled_test::HalfColumn c = tiled_test::RandomHalfColumn(K, 5);
  const std::vector<uint16_t>& xh = c.xh;
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
  tiled_test::ExpectEmulatedIsReferenceIsDequantized(
      GgmlType::Q8_0, raw, rows, K, c, emulated, [&](const uint8_t* row, double* abs) {
        return cpu::TiledF16DotQ80(row, xh.data(), K, abs);
      });
}

}  // namespace
}  // namespace ds::tiled_q8
