// The tiled IQ4_NL layout (kernels/cpu/tiled_iq4nl_layout.h) on the CPU: a tile-unit packed by
// PackLane in all 32 lanes holds every codebook index where the kernel's two lookups per step read
// it and each row's 8 scales verbatim; and the kernel's arithmetic emulated from the packed tile
// equals the CPU reference cpu::TiledF16DotIq4Nl, which is the dequantized product to f16
// rounding.
#include "kernels/cpu/tiled_iq4nl_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/tiled_f16_ref.h"
#include "tests/kernels/cpu/tiled_layout_test_util.h"

namespace ds::tiled_iq4nl {
namespace {

// Random IQ4_NL rows: one large weight and one tiny block per row.
std::vector<uint8_t> RandomRows(int rows, int K, uint32_t seed) {
  return tiled_test::QuantizedRows(GgmlType::IQ4_NL, rows, K, seed, 5, 0.7f, 96);
}

std::vector<uint8_t> PackUnit(const std::vector<uint8_t>& raw, int rows, int K, int u) {
  return tiled_test::PackTileUnit(GgmlType::IQ4_NL, raw, rows, K, u, kUnitBytes, PackLane);
}

uint16_t Scale(const std::vector<uint8_t>& unit, int r, int b) {
  return tiled_test::BlockScaleBits(unit, kOffD, r, b);
}

int KernelIndex(const std::vector<uint8_t>& unit, int T, int s, int h, int jj) {
  return tiled_test::Iq4KernelIndex(unit, T, s, h, jj);
}

TEST(TiledIq4NlLayout, IndicesAndScales) {
  for (int rows : {16, 3}) {
    const int K = 512;
    const auto raw = RandomRows(rows, K, 14);
    const size_t rb = GgmlRowBytes(GgmlType::IQ4_NL, K);
    for (int u = 0; u < K / 256; ++u) {
      const auto unit = PackUnit(raw, rows, K, u);
      tiled_test::ExpectIq4Indices(unit, rows, [&](int r, int k) {
        return RawIndex(raw.data() + rb * r + static_cast<size_t>(u) * 8 * kBlockBytes, k);
      });
      for (int r = 0; r < kRows; ++r)
        for (int b = 0; b < 8; ++b) {
          uint16_t want = 0;
          if (r < rows) std::memcpy(&want, raw.data() + rb * r + (8 * u + b) * kBlockBytes, 2);
          EXPECT_EQ(Scale(unit, r, b), want) << "r=" << r << " b=" << b;
        }
    }
  }
}

TEST(TiledIq4NlLayout, EmulatedKernelMatchesReference) {
  const int K = 768, rows = 16;
  const auto raw = RandomRows(rows, K, 9);
  const tiled_test::HalfColumn c = tiled_test::RandomHalfColumn(K, 5);
  const std::vector<uint16_t>& xh = c.xh;
  std::vector<double> emulated(rows, 0.0);
  for (int u = 0; u < K / 256; ++u) {
    const auto unit = PackUnit(raw, rows, K, u);
    for (int r = 0; r < rows; ++r) {
      uint16_t d[8];
      for (int b = 0; b < 8; ++b) d[b] = Scale(unit, r, b);
      const int e = tiled_q8::UnitExponent(d);
      double part = 0;
      for (int T = 4 * (r & 7); T < 4 * (r & 7) + 4; ++T)
        for (int s = 0; s < 16; ++s) {
          const float dp = F16ToF32(F32ToF16(tiled_q8::ScaledScale(F16ToF32(d[s >> 1]), e)));
          for (int jj = 0; jj < 4; ++jj) {
            const int v = cpu::kIq4Values[KernelIndex(unit, T, s, r >> 3, jj)];
            part += static_cast<double>(F16ToF32(F32ToF16(static_cast<float>(v) * dp))) *
                    F16ToF32(xh[256 * u + 16 * s + 4 * (T & 3) + jj]);
          }
        }
      emulated[r] += tiled_q8::ScaledScale(1.f, -e) * part;
    }
  }
  tiled_test::ExpectEmulatedIsReferenceIsDequantized(
      GgmlType::IQ4_NL, raw, rows, K, c, emulated, [&](const uint8_t* row, double* abs) {
        return cpu::TiledF16DotIq4Nl(row, xh.data(), K, abs);
      });
}

}  // namespace
}  // namespace ds::tiled_iq4nl
