// The scheduler's prefix tree (issue #17): seen paths, exact-position checkpoints and their
// states, radix splits, pruning under a token bound.
#include "scheduler/core/prefix_tree.h"

#include <gtest/gtest.h>

namespace ds::sched {
namespace {

using State = PrefixCheckpoint::State;

std::vector<int32_t> Seq(std::initializer_list<int32_t> a) { return a; }

TEST(PrefixTree, LongestSeenSharesAcrossSplitEdges) {
  PrefixTree t;
  EXPECT_EQ(t.LongestSeen(Seq({1, 2, 3})), 0);
  t.Insert(Seq({1, 2, 3, 4, 5}), 1);
  EXPECT_EQ(t.LongestSeen(Seq({1, 2, 3, 9})), 3);
  EXPECT_EQ(t.LongestSeen(Seq({1, 2, 3, 4, 5, 6})), 5);
  t.Insert(Seq({1, 2, 7}), 2);  // splits the first edge after 2
  EXPECT_EQ(t.LongestSeen(Seq({1, 2, 7, 8})), 3);
  EXPECT_EQ(t.LongestSeen(Seq({1, 2, 3, 4})), 4);
  EXPECT_EQ(t.LongestSeen(Seq({2})), 0);
  EXPECT_EQ(t.tokens(), 6);  // [1 2] [3 4 5] [7]
}

TEST(PrefixTree, CheckpointsAtExactPositionsAndTheirStates) {
  PrefixTree t;
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  const uint64_t c4 = t.Plan(a, 4, /*producer=*/11, 1);
  const uint64_t c7 = t.Plan(a, 7, 11, 1);
  ASSERT_NE(c4, 0u);
  ASSERT_NE(c7, 0u);
  EXPECT_NE(c4, c7);
  EXPECT_EQ(t.Plan(a, 4, 12, 2), 0u) << "one checkpoint per position";
  // Nothing ready yet: no resume point, but the planned ones are on the path.
  EXPECT_EQ(t.Longest(a, 8, State::kReady), nullptr);
  ASSERT_EQ(t.OnPath(a, 8).size(), 2u);
  EXPECT_EQ(t.Longest(a, 8, State::kPlanned)->id, c7);
  t.MarkSaving(c4);
  t.Confirm(c4, 1000);
  const PrefixCheckpoint* r = t.Longest(a, 8, State::kReady);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->id, c4);
  EXPECT_EQ(r->length, 4);
  EXPECT_EQ(t.ready_bytes(), 1000u);
  EXPECT_EQ(t.ready_checkpoints(), 1);
  // The limit bounds the match: a prompt of exactly 4 tokens cannot resume at 4 with limit 3.
  EXPECT_EQ(t.Longest(a, 3, State::kReady), nullptr);
  // Another prompt that shares only 5 tokens resumes at 4.
  const std::vector<int32_t> b = {1, 2, 3, 4, 5, 99, 98};
  EXPECT_EQ(t.Longest(b, 6, State::kReady)->id, c4);
  t.Confirm(c7, 2000);
  EXPECT_EQ(t.Longest(b, 6, State::kReady)->id, c4);
  EXPECT_EQ(t.Longest(a, 7, State::kReady)->id, c7);
  t.Remove(c7);  // evicted by the worker
  EXPECT_EQ(t.Longest(a, 8, State::kReady)->id, c4);
  EXPECT_EQ(t.ready_bytes(), 1000u);
  EXPECT_EQ(t.Find(c7), nullptr);
  t.Remove(c7);  // twice: ignored
  t.Confirm(c7, 5);  // unknown: ignored
  EXPECT_EQ(t.ready_checkpoints(), 1);
}

TEST(PrefixTree, PruneDropsOldBarePathsKeepsCheckpoints) {
  PrefixTree t(/*max_tokens=*/12);
  const std::vector<int32_t> keep = {1, 2, 3, 4, 5};
  const uint64_t c = t.Plan(keep, 5, 1, 1);
  t.Confirm(c, 10);
  t.Insert(Seq({7, 7, 7, 7, 7}), 2);
  t.Insert(Seq({8, 8, 8, 8, 8}), 3);  // 15 tokens > 12: the oldest bare path goes
  EXPECT_LE(t.tokens(), 12);
  EXPECT_EQ(t.LongestSeen(Seq({7, 7})), 0);
  EXPECT_EQ(t.LongestSeen(Seq({8, 8, 8})), 3);
  ASSERT_NE(t.Longest(keep, 5, State::kReady), nullptr);
  EXPECT_EQ(t.Longest(keep, 5, State::kReady)->id, c);
  // A path through the checkpoint's node: pruning its tail keeps the checkpoint.
  t.Insert(Seq({1, 2, 3, 4, 5, 6, 6, 6}), 4);
  t.Insert(Seq({9, 9, 9, 9, 9, 9}), 5);
  EXPECT_LE(t.tokens(), 12);
  EXPECT_EQ(t.Longest(keep, 5, State::kReady)->id, c);
}

TEST(PrefixTree, ClearForgetsEverything) {
  PrefixTree t;
  const std::vector<int32_t> a = {1, 2, 3};
  t.Confirm(t.Plan(a, 2, 1, 1), 7);
  t.Clear();
  EXPECT_EQ(t.ready_checkpoints(), 0);
  EXPECT_EQ(t.ready_bytes(), 0u);
  EXPECT_EQ(t.LongestSeen(a), 0);
  EXPECT_EQ(t.Longest(a, 3, State::kReady), nullptr);
}

}  // namespace
}  // namespace ds::sched
