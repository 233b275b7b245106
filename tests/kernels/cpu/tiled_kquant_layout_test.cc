// The tiled Q4_K / Q5_K layout (kernels/cpu/tiled_kquant_layout.h) on the CPU: a tile-unit
// packed by PackLane in all 32 lanes, read back with the kernel's own bit operations (PairBits,
// UnpackScales), gives every raw quant, scale, min, d and dmin at the place the f16 mma fragment
// wants it; and the kernel's arithmetic emulated from the packed tile equals the CPU reference
// TiledF16DotKq (kernels/cpu/tiled_f16_ref.h), which in turn is the dequantized product.
#include "kernels/cpu/tiled_kquant_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/tiled_f16_ref.h"
#include "tests/kernels/cpu/tiled_layout_test_util.h"

namespace ds::tiled_kq {
namespace {

GgmlType TypeOf(bool q5) { return q5 ? GgmlType::Q5_K : GgmlType::Q4_K; }

// Random Q4_K / Q5_K rows; a sub-block far from zero mean per row, so that mins differ.
std::vector<uint8_t> RandomRows(bool q5, int rows, int K, uint32_t seed) {
  return tiled_test::QuantizedRows(TypeOf(q5), rows, K, seed, 40, 0.3f);
}

std::vector<uint8_t> PackUnit(const std::vector<uint8_t>& raw, bool q5, int rows, int K, int u) {
  return tiled_test::PackTileUnit(TypeOf(q5), raw, rows, K, u, UnitBytes(q5),
                                  [q5](const uint8_t* const (&blk)[kRows], int T, uint8_t* unit) {
                                    PackLane(blk, q5, T, unit);
                                  });
}

uint32_t Word(const std::vector<uint8_t>& unit, int off) { return tiled_test::At<uint32_t>(unit, off); }
uint16_t Half(const std::vector<uint8_t>& unit, int off) { return tiled_test::At<uint16_t>(unit, off); }

// Row r's (sc, mn) of sub-block j as the kernel gets them: its 12 scale bytes from the unit,
// through UnpackScales.
void KernelScales(const std::vector<uint8_t>& unit, bool q5, int r, int j, int& sc, int& mn) {
  const int off = OffScales(q5) + kScaleRowBytes * r;
  uint32_t s[2], m[2];
  UnpackScales(Word(unit, off), Word(unit, off + 4), Word(unit, off + 8), s, m);
  sc = ScaleByte(s, j);
  mn = ScaleByte(m, j);
}

// Row r's (d, dmin) bits as the kernel gets them: half h of the pair word of g = r % 8.
uint16_t KernelD(const std::vector<uint8_t>& unit, bool q5, int r, bool dmin) {
  return Half(unit, (dmin ? OffDmin(q5) : OffD(q5)) + 4 * (r & 7) + 2 * (r >> 3));
}

// Every weight of a packed tile-unit as the kernel reads it: f(T, s, p, e, r, k, h) with h the
// f16 bits (1024 + quant) of element e of lane T's pair p of step s, which holds (row r, k) =
// (g + 8 (p & 1), 16s + 4q + 2 (p >> 1) + e).
template <class F>
void ForEachKernelWeight(const std::vector<uint8_t>& unit, bool q5, F&& f) {
  for (int T = 0; T < 32; ++T) {
    const int g = T >> 2, q = T & 3;
    for (int s = 0; s < 16; ++s) {
      const uint32_t qs = Word(unit, QsWordOffset(T, s));
      const uint32_t qh = q5 ? Word(unit, QhWordOffset(T, s >> 2)) : 0;
      for (int p = 0; p < 4; ++p) {
        const uint32_t v = PairBits(qs, qh, q5, s, p);
        for (int e = 0; e < 2; ++e)
          f(T, s, p, e, g + 8 * (p & 1), 16 * s + 4 * q + 2 * (p >> 1) + e,
            static_cast<uint16_t>(v >> (16 * e)));
      }
    }
  }
}

// Every quant through PairBits, as 1024 + quant in its f16 half.
void ExpectPairsHoldQuants(bool q5, int rows) {
  const int K = 512;
  const auto raw = RandomRows(q5, rows, K, q5 ? 3 : 4);
  const size_t rb = GgmlRowBytes(TypeOf(q5), K);
  for (int u = 0; u < K / kUnitElems; ++u) {
    const auto unit = PackUnit(raw, q5, rows, K, u);
    int bad = 0;
    ForEachKernelWeight(unit, q5, [&](int T, int s, int p, int e, int r, int k, uint16_t h) {
      const int want = r < rows ? RawQuant(raw.data() + rb * r + u * RawBlockBytes(q5), q5, k) : 0;
      if ((h & 0xFC00u) != 0x6400u || static_cast<int>(h & 0x3FF) != want ||
          F16ToF32(h) != 1024.f + want)
        if (bad++ < 5)
          ADD_FAILURE() << "q5=" << q5 << " u=" << u << " T=" << T << " s=" << s << " p=" << p
                        << " e=" << e << ": bits " << h << ", quant " << want;
    });
    EXPECT_EQ(bad, 0);
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* b = r < rows ? raw.data() + rb * r + u * RawBlockBytes(q5) : nullptr;
      for (int j = 0; j < 8; ++j) {
        int sc, mn;
        KernelScales(unit, q5, r, j, sc, mn);
        uint8_t want_sc = 0, want_mn = 0;
        if (b) cpu::UnpackKScaleMin(b + 4, j, &want_sc, &want_mn);
        EXPECT_EQ(sc, want_sc) << "r=" << r << " j=" << j;
        EXPECT_EQ(mn, want_mn) << "r=" << r << " j=" << j;
      }
      uint16_t d = 0, dmin = 0;
      if (b) {
        std::memcpy(&d, b, 2);
        std::memcpy(&dmin, b + 2, 2);
      }
      EXPECT_EQ(KernelD(unit, q5, r, false), d) << "r=" << r;
      EXPECT_EQ(KernelD(unit, q5, r, true), dmin) << "r=" << r;
    }
  }
}

TEST(TiledKquantLayout, Q4KPairsScalesAndD) { ExpectPairsHoldQuants(false, 16); }
TEST(TiledKquantLayout, Q5KPairsScalesAndD) { ExpectPairsHoldQuants(true, 16); }
TEST(TiledKquantLayout, PaddingRowsAreZero) {
  ExpectPairsHoldQuants(false, 11);
  ExpectPairsHoldQuants(true, 5);
}

// The sums: exact known answers, and the rounding of a sum that f16 cannot hold.
TEST(TiledKquantLayout, SubBlockSumsKnownAnswers) {
  std::vector<uint16_t> xh(64);
  for (int k = 0; k < 32; ++k) xh[k] = F32ToF16(16384.f * (k % 2 ? -1.f : 1.f) * 0.5f);
  for (int k = 32; k < 64; ++k) xh[k] = F32ToF16(16000.f);  // 512000 * 2^-6 = 8000
  xh[0] = F32ToF16(0.25f);  // 0.25 - 8192 + 16 * 8192 ... exact in double
  uint16_t sums[2];
  cpu::HalfSubBlockSums(xh.data(), 64, sums);
  EXPECT_EQ(F16ToF32(sums[0]), F16ToF32(F32ToF16((0.25f - 8192.f) * 0x1p-6f)));
  EXPECT_EQ(F16ToF32(sums[1]), 8000.f);
}

// The kernel's arithmetic on the packed tile (per unit: d times the sum of (sc * q) * xh over the
// 16 steps of every lane, minus 64 dmin times the mins against the sub-block sums) equals the
// reference, and the reference times the row scale is the product of the dequantized row with
// the f32 activations to f16's rounding.
void ExpectEmulatedKernelMatchesReference(bool q5) {
  const int K = 768, rows = 16;
  const auto raw = RandomRows(q5, rows, K, q5 ? 21 : 22);
  const tiled_test::HalfColumn c = tiled_test::RandomHalfColumn(K, 5);
  const std::vector<uint16_t>& xh = c.xh;
  std::vector<uint16_t> sums(K / 32);
  cpu::HalfSubBlockSums(xh.data(), K, sums.data());
  std::vector<double> emulated(rows, 0.0);
  for (int u = 0; u < K / kUnitElems; ++u) {
    const auto unit = PackUnit(raw, q5, rows, K, u);
    std::vector<double> cu(rows, 0.0), cm(rows, 0.0);
    ForEachKernelWeight(unit, q5, [&](int, int s, int, int, int r, int k, uint16_t h) {
      int sc, mn;
      KernelScales(unit, q5, r, s >> 1, sc, mn);
      const int quant = static_cast<int>(F16ToF32(h)) - 1024;
      cu[r] += static_cast<double>(sc * quant) * F16ToF32(xh[u * 256 + k]);
    });
    for (int T = 0; T < 32; ++T) {
      const int g = T >> 2, q = T & 3;
      // The minimum term's m16n8k8: lane (g, q) holds sub-blocks 2q, 2q + 1 of rows g, g + 8.
      for (int h = 0; h < 2; ++h)
        for (int jj = 0; jj < 2; ++jj) {
          const int r = g + 8 * h, j = 2 * q + jj;
          int sc, mn;
          KernelScales(unit, q5, r, j, sc, mn);
          cm[r] += static_cast<double>(mn) * F16ToF32(sums[8 * u + j]);
        }
    }
    for (int r = 0; r < rows; ++r)
      emulated[r] += F16ToF32(KernelD(unit, q5, r, false)) * cu[r] -
                     64.0 * F16ToF32(KernelD(unit, q5, r, true)) * cm[r];
  }
  tiled_test::ExpectEmulatedIsReferenceIsDequantized(
      TypeOf(q5), raw, rows, K, c, emulated, [&](const uint8_t* row, double* abs) {
        return cpu::TiledF16DotKq(row, q5, xh.data(), sums.data(), K, abs);
      });
}

TEST(TiledKquantLayout, Q4KEmulatedKernelMatchesReference) { ExpectEmulatedKernelMatchesReference(false); }
TEST(TiledKquantLayout, Q5KEmulatedKernelMatchesReference) { ExpectEmulatedKernelMatchesReference(true); }

}  // namespace
}  // namespace ds::tiled_kq
