// The CPU reference of the FP8 prefill matmul (kernels/cpu/fp8_ref.h): the e4m3 encoding on known
// answers and round trips, the block quantizers' scales, and the scheme against the f32 product
// within e4m3's rounding.
#include "kernels/cpu/fp8_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace ds::cpu {
namespace {

TEST(Fp8Ref, E4M3KnownAnswers) {
  EXPECT_EQ(F32ToE4M3(1.f), 0x38);
  EXPECT_EQ(F32ToE4M3(-1.5f), 0xBC);
  EXPECT_EQ(F32ToE4M3(448.f), 0x7E);
  EXPECT_EQ(F32ToE4M3(1e6f), 0x7E);    // saturated
  EXPECT_EQ(F32ToE4M3(-1e6f), 0xFE);
  EXPECT_EQ(F32ToE4M3(std::ldexp(1.f, -9)), 0x01);  // the smallest subnormal
  EXPECT_EQ(F32ToE4M3(std::ldexp(1.f, -10)), 0x00);   // halfway to 0: even
  EXPECT_EQ(F32ToE4M3(std::ldexp(3.f, -10)), 0x02);   // 1.5 steps: even (2)
  EXPECT_EQ(F32ToE4M3(1.0625f), 0x38);  // halfway between 1 and 1.125: even (1)
  EXPECT_EQ(F32ToE4M3(1.1875f), 0x3A);  // halfway between 1.125 and 1.25: even (1.25)
  EXPECT_EQ(F32ToE4M3(std::nanf("")), 0x7F);
  EXPECT_EQ(E4M3ToF32(0x7E), 448.f);
  EXPECT_EQ(E4M3ToF32(0x08), std::ldexp(1.f, -6));
  EXPECT_TRUE(std::isnan(E4M3ToF32(0x7F)));
}

TEST(Fp8Ref, EveryFiniteCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;  // NaN
    const float v = E4M3ToF32(static_cast<uint8_t>(b));
    const uint8_t back = F32ToE4M3(v);
    if (b == 0x80) {
      EXPECT_EQ(back, 0x80);  // -0 keeps its sign
      continue;
    }
    EXPECT_EQ(back, b) << b << " " << v;
  }
}

TEST(Fp8Ref, QuantizersUseTheBlockMaximum) {
  const int rows = 128, K = 256;
  std::vector<float> w(rows * K, 0.25f);
  w[5 * K + 3] = -896.f;   // block (0, 0): s = 2
  std::vector<uint8_t> q(w.size());
  std::vector<float> s(Fp8BlockScaleLd(K));
  QuantizeBlocksFp8(w.data(), rows, K, q.data(), s.data());
  EXPECT_EQ(s[0], 2.f);
  EXPECT_EQ(s[1], 0.25f / 448.f);
  EXPECT_EQ(q[5 * K + 3], 0xFE);  // -448
  EXPECT_EQ(E4M3ToF32(q[0]), 0.125f);
  EXPECT_EQ(E4M3ToF32(q[200]) * s[1], 0.25f);
  std::vector<float> x(2 * K, 0.f);
  x[K + 130] = 3.f;
  std::vector<uint8_t> xq(x.size());
  std::vector<float> xs(2 * 2);
  QuantizeTokensFp8(x.data(), 2, K, xq.data(), xs.data(), 2);
  EXPECT_EQ(xs[0], 0.f);  // token 0, block 0: zero
  EXPECT_EQ(xs[1 * 2 + 1], 3.f / 448.f);
  EXPECT_EQ(xq[K + 130], 0x7E);
}

TEST(Fp8Ref, SchemeWithinE4M3RoundingOfTheF32Product) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int M = 128, K = 512, T = 3;
  std::vector<float> wf(M * K), xf(T * K);
  for (auto& v : wf) v = 0.02f * nd(rng);
  for (auto& v : xf) v = nd(rng);
  xf[9] = 300.f;  // an outlier: e4m3 keeps the rest of its block to 3 significant bits
  std::vector<uint8_t> wq(wf.size()), xq(xf.size());
  std::vector<float> ws(M / 128 * Fp8BlockScaleLd(K)), xs(K / 128 * T), y(T * M);
  QuantizeBlocksFp8(wf.data(), M, K, wq.data(), ws.data());
  QuantizeTokensFp8(xf.data(), T, K, xq.data(), xs.data(), T);
  GemmFp8Ref(wq.data(), ws.data(), xq.data(), xs.data(), T, y.data(), M, K, T, M, false);
  double worst = 0;
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < M; ++r) {
      double exact = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        exact += static_cast<double>(wf[r * K + k]) * xf[t * K + k];
        mag += std::fabs(static_cast<double>(wf[r * K + k]) * xf[t * K + k]);
      }
      worst = std::max(worst, std::fabs(y[t * M + r] - exact) / mag);
    }
  }
  // Each factor within 2^-4 relative (half a step of a 3-bit mantissa): the sum of products
  // within ~1/8 of sum |w x| in the worst case, far less for independent roundings.
  EXPECT_LT(worst, 0.03);
  EXPECT_GT(worst, 1e-5);  // the rounding is there: this is not the f32 product
}

}  // namespace
}  // namespace ds::cpu
