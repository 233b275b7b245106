// Shared helpers of the CPU tests of the tiled layouts (tiled_*_layout_test.cc): quantized random
// rows, a tile-unit packed by a layout's PackLane in all 32 lanes, an activation column in the
// f16 kernel's form, and the check that a kernel emulated on the packed tiles equals the CPU
// reference, which in turn is the dequantized product to f16 rounding.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/tiled_f16_ref.h"
#include "kernels/cpu/tiled_kquant_layout.h"

namespace ds::tiled_test {

// `rows` rows of K weights ~ N(0, 0.02) quantized to t: in row r element spike + r set to
// spike_value (a sub-block far from the rest), and with tiny_block >= 0 the 32 elements from there
// scaled by 1e-6 (a block scale far below the unit's largest).
inline std::vector<uint8_t> QuantizedRows(GgmlType t, int rows, int K, uint32_t seed, int spike,
                                          float spike_value, int tiny_block = -1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows) * K);
  for (auto& v : w) v = n(rng);
  for (int r = 0; r < rows; ++r) {
    float* row = w.data() + static_cast<size_t>(r) * K;
    row[spike + r] = spike_value;
    if (tiny_block >= 0)
      for (int k = tiny_block; k < tiny_block + 32; ++k) row[k] *= 1e-6f;
  }
  const size_t rb = GgmlRowBytes(t, K);
  std::vector<uint8_t> raw(rb * rows);
  for (int r = 0; r < rows; ++r)
    cpu::QuantizeRow(t, w.data() + static_cast<size_t>(r) * K, raw.data() + rb * r, K);
  return raw;
}

// Tile-unit u of the tile of rows [0, 16) of `raw` (rows past `rows` are padding), packed by
// pack(rows' unit pointers, lane, unit) in every lane; unit_bytes filled with 0xEE first, so a
// byte that no lane writes shows.
template <class Pack>
std::vector<uint8_t> PackTileUnit(GgmlType t, const std::vector<uint8_t>& raw, int rows, int K,
                                  int u, int unit_bytes, const Pack& pack) {
  const size_t rb = GgmlRowBytes(t, K), raw_unit = rb / (K / 256);
  const uint8_t* unit_rows[16];
  for (int r = 0; r < 16; ++r) unit_rows[r] = r < rows ? raw.data() + rb * r + raw_unit * u : nullptr;
  std::vector<uint8_t> unit(unit_bytes, 0xEE);
  for (int T = 0; T < 32; ++T) pack(unit_rows, T, unit.data());
  return unit;
}

template <typename V>
V At(const std::vector<uint8_t>& unit, int off) {
  V v;
  std::memcpy(&v, unit.data() + off, sizeof v);
  return v;
}

// The index a 4-bit-index kernel (IQ4_XS, IQ4_NL) reads for (lane T, step s, element jj of row
// half h): byte h + 2 (jj % 2) of (word >> 4 (jj / 2)) & 0x0F0F0F0F (tiled_kquant_layout.h order).
inline int Iq4KernelIndex(const std::vector<uint8_t>& unit, int T, int s, int h, int jj) {
  const uint32_t w = At<uint32_t>(unit, tiled_kq::QsWordOffset(T, s));
  return static_cast<int>((((w >> (4 * (jj >> 1))) & 0x0F0F0F0Fu) >> (8 * (h + 2 * (jj & 1)))) & 0xFF);
}

// Every index a 4-bit-index kernel reads from a packed unit (Iq4KernelIndex, all lanes, steps,
// row halves) equals raw_index(r, k), the raw row's index of element k (rows >= rows: padding, 0).
template <class RawIndex>
void ExpectIq4Indices(const std::vector<uint8_t>& unit, int rows, const RawIndex& raw_index) {
  int bad = 0;
  for (int T = 0; T < 32; ++T)
    for (int s = 0; s < 16; ++s)
      for (int h = 0; h < 2; ++h)
        for (int jj = 0; jj < 4; ++jj) {
          const int r = (T >> 2) + 8 * h, k = 16 * s + 4 * (T & 3) + jj;
          const int want = r < rows ? raw_index(r, k) : 0;
          if (Iq4KernelIndex(unit, T, s, h, jj) != want && bad++ < 5)
            ADD_FAILURE() << "T=" << T << " s=" << s << " h=" << h << " jj=" << jj;
        }
  EXPECT_EQ(bad, 0);
}

// The f16 bits of block scale b of row r in a unit that keeps each row's 8 block scales at
// off_d + 16 r (Q8_0, IQ4_NL).
inline uint16_t BlockScaleBits(const std::vector<uint8_t>& unit, int off_d, int r, int b) {
  return At<uint16_t>(unit, off_d + 16 * r + 2 * b);
}

// An activation column with one outlier, in the f16 kernel's form (cpu::HalfActivationsRow).
struct HalfColumn {
  std::vector<float> x;
  std::vector<uint16_t> xh;
  float xs = 0;
};
inline HalfColumn RandomHalfColumn(int K, uint32_t seed) {
  HalfColumn c;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ux(-3.f, 3.f);
  c.x.resize(K);
  for (auto& v : c.x) v = ux(rng);
  c.x[7] = 40.f;
  c.xh.resize(K);
  cpu::HalfActivationsRow(c.x.data(), K, c.xh.data(), &c.xs);
  return c;
}

// Row by row: the emulated kernel's dot equals the reference's (both exact sums of the same
// terms: to 1e-12 of sum |terms|), and the reference times the column's scale is the f32 product
// of the dequantized row with the f32 activations within 2^-10 of the terms (f16 rounding of
// the activations, and of the weights or sums where the format rounds them).
// reference(row, &abs): the reference dot of a raw row with c.xh.
template <class Reference>
void ExpectEmulatedIsReferenceIsDequantized(GgmlType t, const std::vector<uint8_t>& raw, int rows,
                                            int K, const HalfColumn& c,
                                            const std::vector<double>& emulated,
                                            const Reference& reference) {
  const size_t rb = GgmlRowBytes(t, K);
  for (int r = 0; r < rows; ++r) {
    double abs_sum = 0;
    const double ref = reference(raw.data() + rb * r, &abs_sum);
    EXPECT_NEAR(emulated[r], ref, 1e-12 * abs_sum) << "row " << r;
    EXPECT_GT(abs_sum, 0.0);
    std::vector<float> w(K);
    cpu::DequantizeRow(t, raw.data() + rb * r, w.data(), K);
    double direct = 0, abs_direct = 0;
    for (int k = 0; k < K; ++k) {
      direct += static_cast<double>(w[k]) * c.x[k];
      abs_direct += std::fabs(static_cast<double>(w[k]) * c.x[k]);
    }
    EXPECT_NEAR(ref * c.xs, direct, 0x1p-10 * (abs_sum * c.xs + abs_direct) + 1e-9) << "row " << r;
  }
}

}  // namespace ds::tiled_test
