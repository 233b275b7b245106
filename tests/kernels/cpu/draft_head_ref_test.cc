// The CPU reference of the coarse draft head (kernels/cpu/draft_head_ref.h): its values against
// the Q6_K dequantization they approximate, and its two dot products against each other and
// against the values.
#include "kernels/cpu/draft_head_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/draft_head_fit.h"
#include "kernels/cpu/mmq_ref.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_blocks.h"

namespace ds::cpu {
namespace {

std::vector<uint8_t> RandomQ6KRow(std::mt19937& rng, int64_t n) {
  std::vector<uint8_t> row(n / 256 * sizeof(BlockQ6K));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> d(1e-3f, 2e-2f);
  for (auto& b : row) b = static_cast<uint8_t>(byte(rng));
  for (int64_t u = 0; u < n / 256; ++u) {
    auto* blk = reinterpret_cast<BlockQ6K*>(row.data()) + u;
    blk->d = F32ToF16(d(rng));
  }
  return row;
}

// Codes in range, values scale * code, and each value within half a step of the Q6_K value it
// codes unless that lies past the codes' range [-8.5, 7.5] steps (then the nearest end, same
// sign).
TEST(CoarseDraftHead, CodesFitTheQ6KValues) {
  std::mt19937 rng(7);
  const int64_t n = 1024;
  const auto row = RandomQ6KRow(rng, n);
  std::vector<float> coarse(n), exact(n);
  CoarseQ6KRow(row.data(), n, coarse.data());
  DequantizeRow(GgmlType::Q6_K, row.data(), exact.data(), n);
  const auto* blocks = reinterpret_cast<const BlockQ6K*>(row.data());
  int clipped = 0, zero_blocks = 0;
  for (int64_t u = 0; u < n / 256; ++u) {
    const CoarseUnit c = CoarseFitQ6KBlock(blocks + u);
    for (int s = 0; s < 16; ++s) {
      const float step = Bf16ToF32(c.scale[s]);
      EXPECT_GE(step, 0.f);
      if (step == 0.f) ++zero_blocks;
      for (int i = 16 * s; i < 16 * s + 16; ++i) {
        const int64_t e = 256 * u + i;
        EXPECT_GE(c.code[i], -8);
        EXPECT_LE(c.code[i], 7);
        EXPECT_EQ(coarse[e], step * static_cast<float>(c.code[i])) << e;
        if (exact[e] <= 7.5f * step && exact[e] >= -8.5f * step) {
          EXPECT_LE(std::fabs(coarse[e] - exact[e]), 0.5f * step * (1 + 1e-5f)) << e;
        } else {
          ++clipped;
          EXPECT_TRUE(c.code[i] == 7 || c.code[i] == -8) << e;
          EXPECT_GT(coarse[e] * exact[e], 0.f) << e;
        }
      }
    }
  }
  EXPECT_LT(clipped, n / 8);
  EXPECT_LT(zero_blocks, 4);  // random scales: a zero sub-block scale is rare
}

TEST(CoarseDraftHead, DotProductsAgree) {
  std::mt19937 rng(11);
  for (const int64_t n : {256, 5120}) {
    const auto row = RandomQ6KRow(rng, n);
    std::vector<float> x(n), coarse(n);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& v : x) v = u(rng);
    std::vector<int8_t> xq(n);
    std::vector<float> xd(n / 32);
    QuantizeActivationsQ8(x.data(), n, xq.data(), xd.data());
    CoarseQ6KRow(row.data(), n, coarse.data());
    double want = 0;
    for (int64_t i = 0; i < n; ++i) want += static_cast<double>(coarse[i]) * xd[i / 32] * xq[i];
    double abs = 0;
    const double exact = CoarseDotQ6K(row.data(), xq.data(), xd.data(), n, &abs);
    EXPECT_NEAR(exact, want, 1e-6 * abs) << n;  // want: the f32-rounded values
    EXPECT_NEAR(CoarseDotQ6KKernelOrder(row.data(), xq.data(), xd.data(), n), exact, 1e-5 * abs)
        << n;
    EXPECT_GT(abs, 0.0);
  }
}

}  // namespace
}  // namespace ds::cpu
