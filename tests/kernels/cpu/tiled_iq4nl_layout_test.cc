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

namespace ds::tiled_iq4nl {
namespace {

std::vector<uint8_t> RandomRows(int rows, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows) * K);
  for (auto& v : w) v = n(rng);
  for (int r = 0; r < rows; ++r) {
    w[static_cast<size_t>(r) * K + 5 + r] = 0.7f;
    for (int k = 96; k < 128; ++k) w[static_cast<size_t>(r) * K + k] *= 1e-6f;  // a tiny block
  }
  const size_t rb = GgmlRowBytes(GgmlType::IQ4_NL, K);
  std::vector<uint8_t> raw(rb * rows);
  for (int r = 0; r < rows; ++r)
    cpu::QuantizeRow(GgmlType::IQ4_NL, w.data() + static_cast<size_t>(r) * K, raw.data() + rb * r, K);
  return raw;
}

std::vector<uint8_t> PackUnit(const std::vector<uint8_t>& raw, int rows, int K, int u) {
  const size_t rb = GgmlRowBytes(GgmlType::IQ4_NL, K);
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

// The kernel's index of (lane T, step s, element jj of row half h), as for IQ4_XS.
int KernelIndex(const std::vector<uint8_t>& unit, int T, int s, int h, int jj) {
  uint32_t w;
  std::memcpy(&w, unit.data() + tiled_kq::QsWordOffset(T, s), 4);
  return static_cast<int>((((w >> (4 * (jj >> 1))) & 0x0F0F0F0Fu) >> (8 * (h + 2 * (jj & 1)))) & 0xFF);
}

TEST(TiledIq4NlLayout, IndicesAndScales) {
  for (int rows : {16, 3}) {
    const int K = 512;
    const auto raw = RandomRows(rows, K, 14);
    const size_t rb = GgmlRowBytes(GgmlType::IQ4_NL, K);
    for (int u = 0; u < K / 256; ++u) {
      const auto unit = PackUnit(raw, rows, K, u);
      for (int T = 0; T < 32; ++T)
        for (int s = 0; s < 16; ++s)
          for (int h = 0; h < 2; ++h)
            for (int jj = 0; jj < 4; ++jj) {
              const int r = (T >> 2) + 8 * h, k = 16 * s + 4 * (T & 3) + jj;
              const int want =
                  r < rows ? RawIndex(raw.data() + rb * r + static_cast<size_t>(u) * 8 * kBlockBytes, k) : 0;
              ASSERT_EQ(KernelIndex(unit, T, s, h, jj), want)
                  << "rows=" << rows << " u=" << u << " T=" << T << " s=" << s << " h=" << h;
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

TEST(TiledIq4NlLayout, EmulatedKernelMatchesReference) {
  const int K = 768, rows = 16;
  const auto raw = RandomRows(rows, K, 9);
  const size_t rb = GgmlRowBytes(GgmlType::IQ4_NL, K);
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
      const int e = tiled_q8::UnitExponent(d);
      double part = 0;
      for (int T = 4 * (r & 7); T < 4 * (r & 7) + 4; ++T)
        for (int s = 0; s < 16; ++s) {
          const float dp = F16ToF32(F32ToF16(tiled_q8::ScaledScale(F16ToF32(d[s >> 1]), e)));
          for (int jj = 0; jj < 4; ++jj) {
            const int v = tiled_iq4xs::Codebook(KernelIndex(unit, T, s, r >> 3, jj));
            part += static_cast<double>(F16ToF32(F32ToF16(static_cast<float>(v) * dp))) *
                    F16ToF32(xh[256 * u + 16 * s + 4 * (T & 3) + jj]);
          }
        }
      emulated[r] += tiled_q8::ScaledScale(1.f, -e) * part;
    }
  }
  for (int r = 0; r < rows; ++r) {
    double abs_sum = 0;
    const double ref = cpu::TiledF16DotIq4Nl(raw.data() + rb * r, xh.data(), K, &abs_sum);
    EXPECT_NEAR(emulated[r], ref, 1e-12 * abs_sum) << "row " << r;
    EXPECT_GT(abs_sum, 0.0);
    std::vector<float> w(K);
    cpu::DequantizeRow(GgmlType::IQ4_NL, raw.data() + rb * r, w.data(), K);
    double direct = 0, abs_direct = 0;
    for (int k = 0; k < K; ++k) {
      direct += static_cast<double>(w[k]) * x[k];
      abs_direct += std::fabs(static_cast<double>(w[k]) * x[k]);
    }
    EXPECT_NEAR(ref * xs, direct, 0x1p-10 * (abs_sum * xs + abs_direct) + 1e-9) << "row " << r;
  }
}

}  // namespace
}  // namespace ds::tiled_iq4nl
