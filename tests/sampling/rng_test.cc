#include "common/sampling/rng.h"

#include <gtest/gtest.h>

#include <set>

namespace ds::sampling {
namespace {

TEST(SamplingRng, SplitMix64KnownAnswers) {
  // Reference outputs of splitmix64 (Vigna's splitmix64.c) from state 0.
  uint64_t s = 0;
  EXPECT_EQ(SplitMix64(s), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(SplitMix64(s), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(SplitMix64(s), 0x06c45d188009454fULL);
}

TEST(SamplingRng, SameSeedSameStreamDifferentSeedDifferent) {
  Rng a(42), b(42), c(43);
  int same_ac = 0;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = a.Next();
    EXPECT_EQ(x, b.Next());
    same_ac += x == c.Next();
  }
  EXPECT_EQ(same_ac, 0);
}

TEST(SamplingRng, UniformDoubleInUnitIntervalAndMeanHalf) {
  Rng r(7);
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = r.NextDouble();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  // sd of the mean = sqrt(1/12 / n) = 6.5e-4; 6 sd.
  EXPECT_NEAR(sum / n, 0.5, 6 * 6.5e-4);
}

}  // namespace
}  // namespace ds::sampling
