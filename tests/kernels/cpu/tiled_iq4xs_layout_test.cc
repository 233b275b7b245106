// The tiled IQ4_XS layout (kernels/cpu/tiled_iq4xs_layout.h) on the CPU: a tile-unit packed by
// PackLane in all 32 lanes holds every codebook index where the kernel's two lookups per step read
// it, the scales whose SubBlockScales are the raw blocks' ls, and d; and the kernel's arithmetic
// emulated from the packed tile equals the CPU reference cpu::TiledF16DotIq4Xs, which is the
// dequantized product to f16 rounding.
#include "kernels/cpu/tiled_iq4xs_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/tiled_f16_ref.h"
#include "tests/kernels/cpu/tiled_layout_test_util.h"

namespace ds::tiled_iq4xs {
namespace {

std::vector<uint8_t> RandomRows(int rows, int K, uint32_t seed) {
  return tiled_test::QuantizedRows(GgmlType::IQ4_XS, rows, K, seed, 9, 0.5f);
}

std::vector<uint8_t> PackUnit(const std::vector<uint8_t>& raw, int rows, int K, int u) {
  return tiled_test::PackTileUnit(GgmlType::IQ4_XS, raw, rows, K, u, kUnitBytes, PackLane);
}

using tiled_test::At;

// Row r's ls of sub-block j as the kernel gets it.
int KernelScale(const std::vector<uint8_t>& unit, int r, int j) {
  uint32_t ls[2];
  SubBlockScales(At<uint16_t>(unit, kOffScalesH + 2 * r), At<uint32_t>(unit, kOffScalesL + 4 * r), ls);
  return static_cast<int>((ls[j >> 2] >> (8 * (j & 3))) & 0xFF);
}

int KernelIndex(const std::vector<uint8_t>& unit, int T, int s, int h, int jj) {
  return tiled_test::Iq4KernelIndex(unit, T, s, h, jj);
}

TEST(TiledIq4XsLayout, IndicesScalesAndD) {
  for (int rows : {16, 7}) {
    const int K = 512;
    const auto raw = RandomRows(rows, K, 12);
    const size_t rb = GgmlRowBytes(GgmlType::IQ4_XS, K);
    for (int u = 0; u < K / 256; ++u) {
      const auto unit = PackUnit(raw, rows, K, u);
      tiled_test::ExpectIq4Indices(unit, rows, [&](int r, int k) {
        return RawIndex(raw.data() + rb * r + u * kBlockBytes, k);
      });
      for (int r = 0; r < kRows; ++r) {
        const uint8_t* b = r < rows ? raw.data() + rb * r + u * kBlockBytes : nullptr;
        uint16_t sh = 0, d = 0;
        if (b) {
          std::memcpy(&d, b, 2);
          std::memcpy(&sh, b + 2, 2);
        }
        for (int j = 0; j < 8; ++j) {
          const int want = b ? ((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4) : 0;
          EXPECT_EQ(KernelScale(unit, r, j), want) << "r=" << r << " j=" << j;
        }
        EXPECT_EQ(At<uint16_t>(unit, kOffD + 4 * (r & 7) + 2 * (r >> 3)), d) << "r=" << r;
      }
    }
  }
}

// Every 6-bit scale pattern through SubBlockScales.
TEST(TiledIq4XsLayout, SubBlockScalesEveryPattern) {
  std::mt19937 rng(3);
  for (int it = 0; it < 2000; ++it) {
    const uint32_t sh = rng() & 0xFFFF, sl = rng();
    uint32_t ls[2];
    SubBlockScales(sh, sl, ls);
    for (int j = 0; j < 8; ++j) {
      const uint32_t want = ((sl >> (4 * j)) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
      ASSERT_EQ((ls[j >> 2] >> (8 * (j & 3))) & 0xFF, want) << sh << " " << sl << " j=" << j;
    }
  }
}

TEST(TiledIq4XsLayout, EmulatedKernelMatchesReference) {
  const int K = 768, rows = 16;
  const auto raw = RandomRows(rows, K, 8);
  const tiled_test::HalfColumn c = tiled_test::RandomHalfColumn(K, 5);
  const std::vector<uint16_t>& xh = c.xh;
  std::vector<double> emulated(rows, 0.0);
  for (int u = 0; u < K / 256; ++u) {
    const auto unit = PackUnit(raw, rows, K, u);
    for (int r = 0; r < rows; ++r) {
      double part = 0;
      for (int T = 4 * (r & 7); T < 4 * (r & 7) + 4; ++T)
        for (int s = 0; s < 16; ++s)
          for (int jj = 0; jj < 4; ++jj) {
            const int v = cpu::kIq4Values[KernelIndex(unit, T, s, r >> 3, jj)];
            const float a = F16ToF32(F32ToF16(static_cast<float>(v * (KernelScale(unit, r, s >> 1) - 32))));
            part += static_cast<double>(a) * F16ToF32(xh[256 * u + 16 * s + 4 * (T & 3) + jj]);
          }
      emulated[r] += F16ToF32(At<uint16_t>(unit, kOffD + 4 * (r & 7) + 2 * (r >> 3))) * part;
    }
  }
  tiled_test::ExpectEmulatedIsReferenceIsDequantized(
      GgmlType::IQ4_XS, raw, rows, K, c, emulated, [&](const uint8_t* row, double* abs) {
        return cpu::TiledF16DotIq4Xs(row, xh.data(), K, abs);
      });
}

}  // namespace
}  // namespace ds::tiled_iq4xs
