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

namespace ds::tiled_iq4xs {
namespace {

std::vector<uint8_t> RandomRows(int rows, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows) * K);
  for (auto& v : w) v = n(rng);
  for (int r = 0; r < rows; ++r) w[static_cast<size_t>(r) * K + 9 + r] = 0.5f;
  const size_t rb = GgmlRowBytes(GgmlType::IQ4_XS, K);
  std::vector<uint8_t> raw(rb * rows);
  for (int r = 0; r < rows; ++r)
    cpu::QuantizeRow(GgmlType::IQ4_XS, w.data() + static_cast<size_t>(r) * K, raw.data() + rb * r, K);
  return raw;
}

std::vector<uint8_t> PackUnit(const std::vector<uint8_t>& raw, int rows, int K, int u) {
  const size_t rb = GgmlRowBytes(GgmlType::IQ4_XS, K);
  const uint8_t* blk[kRows];
  for (int r = 0; r < kRows; ++r)
    blk[r] = r < rows ? raw.data() + rb * r + static_cast<size_t>(u) * kBlockBytes : nullptr;
  std::vector<uint8_t> unit(kUnitBytes, 0xEE);
  for (int T = 0; T < 32; ++T) PackLane(blk, T, unit.data());
  return unit;
}

template <typename V>
V At(const std::vector<uint8_t>& unit, int off) {
  V v;
  std::memcpy(&v, unit.data() + off, sizeof v);
  return v;
}

// Row r's ls of sub-block j as the kernel gets it.
int KernelScale(const std::vector<uint8_t>& unit, int r, int j) {
  uint32_t ls[2];
  SubBlockScales(At<uint16_t>(unit, kOffScalesH + 2 * r), At<uint32_t>(unit, kOffScalesL + 4 * r), ls);
  return static_cast<int>((ls[j >> 2] >> (8 * (j & 3))) & 0xFF);
}

// The kernel's index of (lane T, step s, element jj of row half h): byte h + 2 (jj % 2) of
// (word >> 4 (jj / 2)) & 0x0F0F0F0F.
int KernelIndex(const std::vector<uint8_t>& unit, int T, int s, int h, int jj) {
  const uint32_t w = At<uint32_t>(unit, tiled_kq::QsWordOffset(T, s));
  return static_cast<int>((((w >> (4 * (jj >> 1))) & 0x0F0F0F0Fu) >> (8 * (h + 2 * (jj & 1)))) & 0xFF);
}

TEST(TiledIq4XsLayout, IndicesScalesAndD) {
  for (int rows : {16, 7}) {
    const int K = 512;
    const auto raw = RandomRows(rows, K, 12);
    const size_t rb = GgmlRowBytes(GgmlType::IQ4_XS, K);
    for (int u = 0; u < K / 256; ++u) {
      const auto unit = PackUnit(raw, rows, K, u);
      for (int T = 0; T < 32; ++T)
        for (int s = 0; s < 16; ++s)
          for (int h = 0; h < 2; ++h)
            for (int jj = 0; jj < 4; ++jj) {
              const int r = (T >> 2) + 8 * h, k = 16 * s + 4 * (T & 3) + jj;
              const int want = r < rows ? RawIndex(raw.data() + rb * r + u * kBlockBytes, k) : 0;
              ASSERT_EQ(KernelIndex(unit, T, s, h, jj), want)
                  << "rows=" << rows << " u=" << u << " T=" << T << " s=" << s << " h=" << h;
            }
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
  const size_t rb = GgmlRowBytes(GgmlType::IQ4_XS, K);
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
      double part = 0;
      for (int T = 4 * (r & 7); T < 4 * (r & 7) + 4; ++T)
        for (int s = 0; s < 16; ++s)
          for (int jj = 0; jj < 4; ++jj) {
            const int v = Codebook(KernelIndex(unit, T, s, r >> 3, jj));
            const float a = F16ToF32(F32ToF16(static_cast<float>(v * (KernelScale(unit, r, s >> 1) - 32))));
            part += static_cast<double>(a) * F16ToF32(xh[256 * u + 16 * s + 4 * (T & 3) + jj]);
          }
      emulated[r] += F16ToF32(At<uint16_t>(unit, kOffD + 4 * (r & 7) + 2 * (r >> 3))) * part;
    }
  }
  for (int r = 0; r < rows; ++r) {
    double abs_sum = 0;
    const double ref = cpu::TiledF16DotIq4Xs(raw.data() + rb * r, xh.data(), K, &abs_sum);
    EXPECT_NEAR(emulated[r], ref, 1e-12 * abs_sum) << "row " << r;
    EXPECT_GT(abs_sum, 0.0);
    std::vector<float> w(K);
    cpu::DequantizeRow(GgmlType::IQ4_XS, raw.data() + rb * r, w.data(), K);
    double direct = 0, abs_direct = 0;
    for (int k = 0; k < K; ++k) {
      direct += static_cast<double>(w[k]) * x[k];
      abs_direct += std::fabs(static_cast<double>(w[k]) * x[k]);
    }
    EXPECT_NEAR(ref * xs, direct, 0x1p-10 * (abs_sum * xs + abs_direct)) << "row " << r;
  }
}

}  // namespace
}  // namespace ds::tiled_iq4xs
