// `--mtp auto`'s cost side (worker/spec/draft_cost.h): the default until the worker has timed a
// plain step and a cycle of one sequence, then the per-draft cost those give; unclean samples
// (drafts verified != drafts made, hiccups outside the bounds) do not move it; plain steps are
// asked for two in a row, twice per kPlainEvery decisions; and a costly draft at low acceptance
// is not taken (DraftPolicy::Next with the measured cost).
#include "worker/spec/draft_cost.h"

#include <gtest/gtest.h>

#include "worker/spec/draft_policy.h"

namespace ds::spec {
namespace {

TEST(DraftCost, DefaultUntilAPlainStepAndACycleAreTimed) {
  DraftCostEstimator e;
  EXPECT_DOUBLE_EQ(e.Cost(), DraftPolicy::kDraftCost);
  e.Record(3, 3, 2.5e-3);  // a cycle before any plain step: nothing to compare it with
  EXPECT_FALSE(e.measured());
  e.Record(0, 0, 1.0e-3);
  EXPECT_FALSE(e.measured());
  EXPECT_DOUBLE_EQ(e.Cost(), DraftPolicy::kDraftCost);
  e.Record(3, 3, 2.5e-3);  // (2.5 / 1.0 - 1) / 3
  ASSERT_TRUE(e.measured());
  EXPECT_NEAR(e.Cost(), 0.5, 1e-12);
  e.Record(4, 4, 1.52e-3);  // (1.52 - 1) / 4 = 0.13: the average moves a fifth of the way
  EXPECT_NEAR(e.Cost(), 0.5 + DraftCostEstimator::kWeight * (0.13 - 0.5), 1e-12);
}

TEST(DraftCost, UncleanSamplesAreIgnored) {
  DraftCostEstimator e;
  e.Record(0, 3, 1.0e-3);  // plain verify, but drafts made after it: not a plain step
  e.Record(2, 0, 1.0e-3);
  EXPECT_DOUBLE_EQ(e.plain_seconds(), 0.0);
  e.Record(0, 0, 1.0e-3);
  e.Record(3, 2, 9.0e-3);   // verified 3, made 2: not a cycle of one k
  e.Record(3, 3, 0.9e-3);   // faster than a plain step: a hiccup, below kMinCost
  e.Record(2, 2, 20.0e-3);  // (20 - 1) / 2 = 9.5 per draft: above kMaxCost
  EXPECT_FALSE(e.measured());
  e.Record(0, 0, 3.0e-3);   // plain steps average too
  EXPECT_NEAR(e.plain_seconds(), 1.0e-3 + DraftCostEstimator::kWeight * 2.0e-3, 1e-15);
}

TEST(DraftCost, PlainStepsComeInPairsTwicePerPeriod) {
  DraftCostEstimator e;
  int plain = 0, first = -1;
  for (int i = 0; i < 3 * DraftCostEstimator::kPlainEvery; ++i) {
    if (!e.WantPlainStep()) continue;
    ++plain;
    if (first < 0) first = i;
  }
  EXPECT_EQ(plain, 6);
  EXPECT_EQ(first, DraftCostEstimator::kPlainEvery - 3);  // then the next decision too
  EXPECT_FALSE(e.WantPlainStep());  // the pattern restarts
}

TEST(DraftCost, ACostlyDraftAtLowAcceptanceIsNotTaken) {
  DraftPolicy p;
  for (int i = 0; i < 40; ++i) p.Record(3, i % 5 < 2 ? 1 : 0);  // the first draft ~40% of the time
  ASSERT_GT(p.rate(0), 0.2);
  ASSERT_LT(p.rate(0), 0.5);
  EXPECT_GE(p.Next(3, DraftPolicy::kDraftCost), 1);  // at the 27B's cost one draft pays
  EXPECT_EQ(p.Next(3, 0.5), 0);                      // at the demo's it does not
  DraftPolicy q;  // every draft accepted: four pay even at 0.5 (5 tokens for 3 steps' cost)
  for (int i = 0; i < 40; ++i) q.Record(4, 4);
  EXPECT_EQ(q.Next(4, 0.5), 4);
}

}  // namespace
}  // namespace ds::spec
