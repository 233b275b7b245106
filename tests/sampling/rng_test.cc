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

// UniformAt(seed, c) is element c of the splitmix64 sequence started from a mix of the seed.
TEST(SamplingRng, UniformAtIsASplitMixSequenceFromTheMixedSeed) {
  for (uint64_t seed : {0ULL, 1ULL, 42ULL, 0xffffffffffffffffULL}) {
    uint64_t key = seed;
    uint64_t state = SplitMix64(key);
    for (uint64_t c = 0; c < 100; ++c)
      ASSERT_EQ(UniformAt(seed, c), static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53);
  }
}

// Nearby seeds (what users pass: 1, 2, 3) name unrelated sequences, not shifted copies.
TEST(SamplingRng, UniformAtNearbySeedsAreNotShiftedCopies) {
  std::set<double> first;
  for (uint64_t c = 0; c < 1000; ++c) first.insert(UniformAt(1, c));
  int shared = 0;
  for (uint64_t seed = 2; seed < 10; ++seed)
    for (uint64_t c = 0; c < 1000; ++c) shared += first.count(UniformAt(seed, c)) > 0;
  EXPECT_EQ(shared, 0);
}

TEST(SamplingRng, UniformAtInUnitIntervalMeanHalfNoLagCorrelation) {
  const int n = 200000;
  double sum = 0, lag = 0, prev = UniformAt(7, 0);
  for (int i = 1; i <= n; ++i) {
    const double u = UniformAt(7, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    lag += (u - 0.5) * (prev - 0.5);
    prev = u;
  }
  EXPECT_NEAR(sum / n, 0.5, 6 * 6.5e-4);
  // Lag-1 covariance: sd = (1/12) / sqrt(n) = 1.9e-4; 6 sd.
  EXPECT_NEAR(lag / n, 0.0, 6 * 1.9e-4);
}

}  // namespace
}  // namespace ds::sampling
