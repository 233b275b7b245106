#include "common/sampling/kernels.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <vector>

#include "common/sampling/rng.h"

namespace ds::sampling::internal {
namespace {

TEST(SamplingKernels, ExpMatchesLibmWithinTwoUlp) {
  EXPECT_EQ(Exp(0.0f), 1.0f);
  EXPECT_EQ(Exp(-INFINITY), 0.0f);
  EXPECT_EQ(Exp(NAN), 0.0f);
  EXPECT_EQ(Exp(-100.0f), 0.0f);  // below ln(FLT_MIN): flushed
  double worst = 0;
  for (float s = -87.0f; s <= 0.0f; s += 0.0013f) {
    const double ref = std::exp(static_cast<double>(s));
    const double rel = std::fabs(Exp(s) - ref) / ref;
    worst = std::max(worst, rel);
  }
  EXPECT_LT(worst, 2.5e-7) << "2 ulp of float is 2.4e-7";
}

TEST(SamplingKernels, VectorAndScalarAreBitIdentical) {
  // Sizes cover whole blocks, a ragged last block and a tail shorter than one vector.
  for (size_t n : {1u, 7u, 8u, 255u, 256u, 257u, 1003u, 4099u}) {
    Rng rng(n);
    std::vector<float> x(n);
    for (float& v : x) v = static_cast<float>(rng.NextDouble() * 40.0 - 30.0);
    if (n > 5) {
      x[3] = -INFINITY;
      x[5] = NAN;
    }
    std::vector<float> a(n), b(n);
    const float ma = CopySanitizedMax(x.data(), n, a.data());
    const float mb = CopySanitizedMaxScalar(x.data(), n, b.data());
    ASSERT_EQ(ma, mb);
    ASSERT_EQ(a, b);
    if (n > 5) {
      EXPECT_EQ(a[5], -INFINITY);
    }
    EXPECT_EQ(Max(a.data(), n), ma);

    const size_t nb = (n + kSumBlock - 1) / kSumBlock;
    std::vector<float> wa(n), wb(n);
    std::vector<double> ba(nb), bb(nb);
    const double ta = ExpSum(a.data(), n, ma, 1.0f / 0.7f, wa.data(), ba.data());
    const double tb = ExpSumScalar(a.data(), n, ma, 1.0f / 0.7f, wb.data(), bb.data());
    EXPECT_EQ(ta, tb) << n;
    EXPECT_EQ(ba, bb) << n;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(wa[i]), std::bit_cast<uint32_t>(wb[i])) << i;
    }
    // The sum agrees with a double reference.
    double ref = 0;
    for (float v : a) ref += std::exp((static_cast<double>(v) - ma) / 0.7);
    EXPECT_NEAR(ta, ref, ref * 1e-6);
    // Without the output array the total is unchanged.
    EXPECT_EQ(ExpSum(a.data(), n, ma, 1.0f / 0.7f, nullptr, nullptr), ta);
  }
}

TEST(SamplingKernels, CollectAndHistogramMatchBruteForce) {
  for (size_t n : {3u, 8u, 1001u}) {
    Rng rng(n + 1);
    std::vector<float> w(n);
    for (float& v : w) v = static_cast<float>(rng.NextDouble());
    w[1] = 0.0f;
    std::vector<int32_t> got;
    CollectAtLeast(w.data(), n, 0.5f, got);
    std::vector<int32_t> want;
    for (size_t i = 0; i < n; ++i) {
      if (w[i] >= 0.5f) want.push_back(static_cast<int32_t>(i));
    }
    EXPECT_EQ(got, want);
    got.clear();
    CollectAtLeast(w.data(), n, 0.0f, got);  // threshold 0 still excludes zero weights
    EXPECT_EQ(got.size(), n - 1);
    const size_t stride = 1040;
    std::vector<double> h(4 * stride, 0.0), ref(4 * stride, 0.0);
    MassHistogram(w.data(), n, h.data(), stride);
    for (size_t i = 0; i < n; ++i)
      ref[(i & 3) * stride + (std::bit_cast<uint32_t>(w[i]) >> 20)] += w[i];
    EXPECT_EQ(h, ref);
  }
}

TEST(SamplingKernels, SanitizeClampsInfinities) {
  std::vector<float> x = {1.0f, INFINITY, -INFINITY, NAN};
  std::vector<float> y(4);
  EXPECT_EQ(CopySanitizedMax(x.data(), 4, y.data()), FLT_MAX);
  EXPECT_EQ(y[1], FLT_MAX);
  EXPECT_EQ(y[2], -INFINITY);
  EXPECT_EQ(y[3], -INFINITY);
}

}  // namespace
}  // namespace ds::sampling::internal
