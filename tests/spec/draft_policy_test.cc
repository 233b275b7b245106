// `--mtp auto`'s per-sequence drafts (worker/spec/draft_policy.h): a new sequence drafts the cap,
// a sequence whose drafts are rejected stops drafting but still probes, and one whose drafts are
// accepted again goes back up; a position that is rarely reached is not drafted.
#include "worker/spec/draft_policy.h"

#include <gtest/gtest.h>

namespace ds::spec {
namespace {

TEST(DraftPolicy, ANewSequenceDraftsTheCap) {
  DraftPolicy p;
  EXPECT_EQ(p.Next(3), 3);
  EXPECT_EQ(p.Next(1), 1);
  EXPECT_EQ(p.Next(0), 0);
  EXPECT_DOUBLE_EQ(p.rate(0), DraftPolicy::kPriorRate);
}

TEST(DraftPolicy, RejectedDraftsStopButProbe) {
  DraftPolicy p;
  int verifies = 0;
  while (p.Next(3) > 0 && verifies < 100) {
    p.Record(3, 0);
    ++verifies;
  }
  EXPECT_LT(verifies, 20) << "should stop drafting after a run of rejections";
  EXPECT_LT(p.rate(0), DraftPolicy::kDraftCost);
  // Idle: one probe of a single draft every kProbeEvery steps.
  int probes = 0;
  for (int step = 0; step < 4 * DraftPolicy::kProbeEvery; ++step) {
    const int k = p.Next(3);
    EXPECT_LE(k, 1);
    if (k == 1) {
      ++probes;
      p.Record(1, 0);
    }
  }
  EXPECT_EQ(probes, 4);
}

TEST(DraftPolicy, AcceptedProbesBringTheDraftsBack) {
  DraftPolicy p;
  for (int i = 0; i < 30; ++i) p.Record(3, 0);
  ASSERT_EQ(p.Next(3), 0);
  int steps = 0, k = 0;
  while (k < 3 && steps < 400) {
    k = p.Next(3);
    if (k > 0) p.Record(k, k);  // every offered draft accepted
    ++steps;
  }
  EXPECT_EQ(k, 3);
}

TEST(DraftPolicy, APositionRarelyAcceptedIsNotDrafted) {
  DraftPolicy p;
  for (int i = 0; i < 40; ++i) p.Record(3, 1);  // the first draft always, the second never
  EXPECT_GT(p.rate(0), 0.99);
  EXPECT_LT(p.rate(1), 0.01);
  EXPECT_DOUBLE_EQ(p.rate(2), DraftPolicy::kPriorRate);  // never judged
  EXPECT_EQ(p.Next(3), 1);
}

}  // namespace
}  // namespace ds::spec
