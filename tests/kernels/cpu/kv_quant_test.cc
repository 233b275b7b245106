// KV cache quantization reference (kernels/cpu/kv_quant.h): block layout, the rounding rules the
// CUDA QkvPrep kernel mirrors, and the error bounds of the formats.
#include "kernels/cpu/kv_quant.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_blocks.h"

namespace ds::cpu {
namespace {

std::vector<uint8_t> Quant(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> b(GgmlRowBytes(t, static_cast<int64_t>(x.size())));
  EXPECT_TRUE(QuantizeKvRow(t, x.data(), b.data(), static_cast<int64_t>(x.size())));
  return b;
}
std::vector<float> Dequant(GgmlType t, const std::vector<uint8_t>& b, size_t n) {
  std::vector<float> y(n);
  EXPECT_TRUE(DequantizeKvRow(t, b.data(), y.data(), static_cast<int64_t>(n)));
  return y;
}

TEST(KvQuant, SupportedTypes) {
  EXPECT_TRUE(KvQuantSupported(GgmlType::F16));
  EXPECT_TRUE(KvQuantSupported(GgmlType::Q8_0));
  EXPECT_TRUE(KvQuantSupported(GgmlType::Q4_0));
  EXPECT_FALSE(KvQuantSupported(GgmlType::Q4_K));
  float x[32] = {};
  uint8_t b[64];
  EXPECT_FALSE(QuantizeKvRow(GgmlType::Q4_K, x, b, 32));
}

TEST(KvQuant, Q8_0IsTheWeightQuantizer) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> x(256);
  for (auto& v : x) v = u(rng);
  std::vector<uint8_t> ref(GgmlRowBytes(GgmlType::Q8_0, 256));
  QuantizeRow(GgmlType::Q8_0, x.data(), ref.data(), 256);
  EXPECT_EQ(Quant(GgmlType::Q8_0, x), ref);
}

TEST(KvQuant, Q4_0KnownBlock) {
  // Largest |x| is -8 at index 3 -> d = 1 exactly, x = d * (q - 8).
  std::vector<float> x(32, 0.f);
  x[3] = -8.f;
  x[0] = 7.f;
  x[1] = 2.5f;    // half to even: 2
  x[2] = 3.5f;    // 4
  x[16] = 7.6f;   // rounds to 8 quanta, clamps to q = 15 (7)
  x[17] = -1.2f;  // -1
  const auto b = Quant(GgmlType::Q4_0, x);
  BlockQ4_0 blk;
  std::memcpy(&blk, b.data(), sizeof blk);
  EXPECT_EQ(F16ToF32(blk.d), 1.f);
  EXPECT_EQ(blk.qs[0] & 15, 15);  // 7 + 8
  EXPECT_EQ(blk.qs[1] & 15, 10);
  EXPECT_EQ(blk.qs[2] & 15, 12);
  EXPECT_EQ(blk.qs[3] & 15, 0);
  EXPECT_EQ(blk.qs[0] >> 4, 15);  // element 16
  EXPECT_EQ(blk.qs[1] >> 4, 7);   // element 17
  const auto y = Dequant(GgmlType::Q4_0, b, 32);
  EXPECT_EQ(y[3], -8.f);
  EXPECT_EQ(y[0], 7.f);
  EXPECT_EQ(y[16], 7.f);
  EXPECT_EQ(y[5], 0.f);
}

TEST(KvQuant, Q4_0TiesTakeTheLowestIndex) {
  std::vector<float> x(32, 0.5f);
  x[4] = 4.f;
  x[9] = -4.f;  // same |x|, later: x[4] sets the sign of d
  const auto b = Quant(GgmlType::Q4_0, x);
  BlockQ4_0 blk;
  std::memcpy(&blk, b.data(), sizeof blk);
  EXPECT_EQ(F16ToF32(blk.d), -0.5f);
  const auto y = Dequant(GgmlType::Q4_0, b, 32);
  EXPECT_EQ(y[4], 4.f);
  EXPECT_EQ(y[9], -3.5f);  // q clamps at 15: the far side of the range has one level less
}

TEST(KvQuant, SpecialValuesGiveFiniteBlocks) {
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    std::vector<float> x(64, 0.f);  // block 0 all zero
    x[32] = std::numeric_limits<float>::quiet_NaN();
    x[33] = std::numeric_limits<float>::infinity();
    x[34] = -1e30f;
    const auto y = Dequant(t, Quant(t, x), 64);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.f) << i;
    for (float v : y) EXPECT_TRUE(std::isfinite(v));
    EXPECT_EQ(y[32], 0.f);  // NaN counts as 0
  }
}

TEST(KvQuant, ErrorWithinHalfAQuantum) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.5f);
  std::vector<float> x(32 * 64);
  for (auto& v : x) v = nd(rng);
  for (GgmlType t : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0}) {
    const auto b = Quant(t, x);
    const auto y = Dequant(t, b, x.size());
    for (size_t blk = 0; blk < x.size() / 32; ++blk) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[blk * 32 + j]));
      // Quantum: the block's d (q8_0: ~amax/127, q4_0: ~amax/8), f16: 2^-11 relative.
      const float step = t == GgmlType::Q8_0   ? amax / 127.f
                         : t == GgmlType::Q4_0 ? amax / 8.f
                                               : 0.f;
      for (int j = 0; j < 32; ++j) {
        const float xi = x[blk * 32 + j], yi = y[blk * 32 + j];
        const float bound =
            t == GgmlType::F16 ? std::fabs(xi) * 4.9e-4f : 0.5f * step * 1.002f + amax * 1e-3f;
        // q4_0 clamps the far side at +7 quanta: up to one quantum there.
        const float b2 = t == GgmlType::Q4_0 ? step * 1.002f + amax * 1e-3f : bound;
        EXPECT_LE(std::fabs(xi - yi), b2) << static_cast<int>(t) << " blk " << blk << " j " << j;
      }
    }
  }
}

}  // namespace
}  // namespace ds::cpu
