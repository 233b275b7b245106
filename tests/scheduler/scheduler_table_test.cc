// Iteration tables (after TensorRT-LLM capacitySchedulerTest): a scripted workload, and the exact
// plan of every step. Each row is {request id, slot, pos0, tokens in the chunk, sampled?}.
#include <vector>

#include "gtest/gtest.h"
#include "tests/scheduler/test_util.h"

namespace ds::sched::testing {
namespace {

using Rows = std::vector<std::vector<E>>;

// Steps through `rows`, asserting each plan; then asserts that nothing is left to run.
std::vector<Event> RunTable(Scheduler& s, const Rows& rows) {
  FakeWorker w;
  std::vector<Event> events;
  for (size_t i = 0; i < rows.size(); ++i) {
    StepPlan p = Step(s, w, T(static_cast<int64_t>(i) * 10), &events);
    EXPECT_EQ(Entries(p), rows[i]) << "step " << i;
    int32_t n = 0;
    for (const E& e : rows[i]) n += e.n;
    EXPECT_LE(n, s.config().max_num_batched_tokens) << "step " << i;
  }
  EXPECT_TRUE(Step(s, w, T(100000), &events).empty());
  EXPECT_TRUE(s.Idle());
  return events;
}

TEST(SchedulerTable, DecodeFirstThenChunkedPrefillUnderBudget) {
  auto s = Make(Config(/*slots=*/4, /*budget=*/8, /*max_chunk=*/8, Pool(1000, 500)));
  ASSERT_TRUE(s->Add(Req(1, /*prompt=*/3, /*max_new=*/4)).ok());
  ASSERT_TRUE(s->Add(Req(2, /*prompt=*/20, /*max_new=*/2)).ok());
  std::vector<Event> ev = RunTable(
      *s, {
              // Both admitted: 1 takes its whole prompt (3), 2 gets what is left of the budget (5).
              {{1, 0, 0, 3, true}, {2, 1, 0, 5, false}},
              // 1 decodes first (1 token); 2's chunk is the remaining budget, 7.
              {{1, 0, 3, 1, true}, {2, 1, 5, 7, false}},
              {{1, 0, 4, 1, true}, {2, 1, 12, 7, false}},
              // 1 samples its 4th token and ends; 2's last prompt token samples its first.
              {{1, 0, 5, 1, true}, {2, 1, 19, 1, true}},
              {{2, 1, 20, 1, true}},
          });
  auto fin = Finished(ev);
  EXPECT_EQ(fin[1].reason, FinishReason::kLength);
  EXPECT_EQ(fin[1].n_generated, 4);
  EXPECT_EQ(fin[2].n_generated, 2);
}

TEST(SchedulerTable, LongPromptChunkedWhileShortOneDecodes) {
  // Budget is plenty; max_chunk bounds each prefill chunk.
  auto s = Make(Config(4, 16, /*max_chunk=*/4, Pool(1000, 500)));
  ASSERT_TRUE(s->Add(Req(1, 2, 5)).ok());
  ASSERT_TRUE(s->Add(Req(2, 10, 1)).ok());
  RunTable(*s, {
                   {{1, 0, 0, 2, true}, {2, 1, 0, 4, false}},
                   {{1, 0, 2, 1, true}, {2, 1, 4, 4, false}},
                   {{1, 0, 3, 1, true}, {2, 1, 8, 2, true}},  // 2 ends: max_new 1
                   {{1, 0, 4, 1, true}},
                   {{1, 0, 5, 1, true}},  // 1's 5th token
               });
}

TEST(SchedulerTable, BudgetGoesToDecodesBeforeNewAdmissions) {
  // Budget 3, three decoding sequences: a 4th request waits for budget although a slot is free.
  auto s = Make(Config(4, 3, 8, Pool(1000, 500)));
  for (RequestId id : {1, 2, 3}) ASSERT_TRUE(s->Add(Req(id, 1, 3)).ok());
  FakeWorker w;
  StepPlan p = Step(*s, w, T(0), nullptr);
  EXPECT_EQ(Entries(p),
            (std::vector<E>{{1, 0, 0, 1, true}, {2, 1, 0, 1, true}, {3, 2, 0, 1, true}}));
  ASSERT_TRUE(s->Add(Req(4, 2, 1)).ok());
  p = Step(*s, w, T(1), nullptr);
  EXPECT_EQ(Entries(p),
            (std::vector<E>{{1, 0, 1, 1, true}, {2, 1, 1, 1, true}, {3, 2, 1, 1, true}}));
  EXPECT_EQ(s->Status().queued, 1);
  p = Step(*s, w, T(2), nullptr);  // third tokens: 1..3 end
  EXPECT_EQ(Entries(p),
            (std::vector<E>{{1, 0, 2, 1, true}, {2, 1, 2, 1, true}, {3, 2, 2, 1, true}}));
  p = Step(*s, w, T(3), nullptr);
  EXPECT_EQ(Entries(p), (std::vector<E>{{4, 0, 0, 2, true}}));
}

TEST(SchedulerTable, PriorityThenFifo) {
  auto s = Make(Config(1, 100, 100, Pool(1000, 500)));
  ASSERT_TRUE(s->Add(Req(1, 2, 1, /*priority=*/0)).ok());
  ASSERT_TRUE(s->Add(Req(2, 2, 1, 5)).ok());
  ASSERT_TRUE(s->Add(Req(3, 2, 1, 5)).ok());
  ASSERT_TRUE(s->Add(Req(4, 2, 1, 0)).ok());
  ASSERT_TRUE(s->Add(Req(5, 2, 1, 9)).ok());
  EXPECT_EQ(s->Status().queued_by_priority,
            (std::vector<std::pair<int, int>>{{9, 1}, {5, 2}, {0, 2}}));
  RunTable(*s, {
                   {{5, 0, 0, 2, true}},
                   {{2, 0, 0, 2, true}},
                   {{3, 0, 0, 2, true}},
                   {{1, 0, 0, 2, true}},
                   {{4, 0, 0, 2, true}},
               });
}

TEST(SchedulerTable, GrowSlotsTakesEffectAtOnce) {
  auto s = Make(Config(2, 100, 100, Pool(1000, 500)));
  for (RequestId id : {1, 2, 3, 4}) ASSERT_TRUE(s->Add(Req(id, 4, 3)).ok());
  FakeWorker w;
  absl::StatusOr<StepPlan> p = s->Schedule(T(0));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Entries(*p), (std::vector<E>{{1, 0, 0, 4, true}, {2, 1, 0, 4, true}}));
  ASSERT_TRUE(s->SetSlots(4).ok());  // while step 1 is in flight
  ASSERT_TRUE(s->Apply(*p, w.Run(*p), T(1)).ok());
  StepPlan p2 = Step(*s, w, T(2), nullptr);
  EXPECT_EQ(Entries(p2),
            (std::vector<E>{
                {1, 0, 4, 1, true}, {2, 1, 4, 1, true}, {3, 2, 0, 4, true}, {4, 3, 0, 4, true}}));
}

TEST(SchedulerTable, ShrinkSlotsUnderLoadNeverKills) {
  auto s = Make(Config(4, 100, 100, Pool(1000, 500)));
  for (RequestId id : {1, 2, 3, 4}) ASSERT_TRUE(s->Add(Req(id, 2, /*max_new=*/1 + id)).ok());
  ASSERT_TRUE(s->Add(Req(5, 2, 2)).ok());
  FakeWorker w;
  std::vector<Event> ev;
  StepPlan p = Step(*s, w, T(0), &ev);
  EXPECT_EQ(p.entries.size(), 4u);
  ASSERT_TRUE(s->SetSlots(1).ok());
  SchedulerStatus st = s->Status();
  ASSERT_EQ(st.slots.size(), 4u);
  EXPECT_FALSE(st.slots[0].retiring);
  for (int i = 1; i < 4; ++i) EXPECT_TRUE(st.slots[i].retiring && st.slots[i].busy) << i;

  Rows rows = {
      // Request 1 (max_new 2) ends here; slot 0 frees.
      {{1, 0, 2, 1, true}, {2, 1, 2, 1, true}, {3, 2, 2, 1, true}, {4, 3, 2, 1, true}},
      // 5 reuses slot 0, the only slot below the target.
      {{2, 1, 3, 1, true}, {3, 2, 3, 1, true}, {4, 3, 3, 1, true}, {5, 0, 0, 2, true}},
      {{3, 2, 4, 1, true}, {4, 3, 4, 1, true}, {5, 0, 2, 1, true}},
      {{4, 3, 5, 1, true}},
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    p = Step(*s, w, T(10 + static_cast<int64_t>(i)), &ev);
    EXPECT_EQ(Entries(p), rows[i]) << "step " << i;
  }
  auto fin = Finished(ev);
  ASSERT_EQ(fin.size(), 5u);
  for (RequestId id : {1, 2, 3, 4}) {
    EXPECT_EQ(fin[id].reason, FinishReason::kLength) << id;
    EXPECT_EQ(fin[id].n_generated, 1 + static_cast<int>(id)) << id;
  }
  st = s->Status();
  ASSERT_EQ(st.slots.size(), 1u);  // retired slots are gone
  EXPECT_FALSE(st.slots[0].busy);
}

TEST(SchedulerTable, PoolWaitsWhenFullAndNeverTruncates) {
  auto s = Make(Config(4, 200, 200, Pool(/*n_ctx=*/100, /*slot_cap=*/60)));
  ASSERT_TRUE(s->Add(Req(1, 40, 10)).ok());  // reserves 50
  ASSERT_TRUE(s->Add(Req(2, 30, 10)).ok());  // 40 -> 90
  ASSERT_TRUE(s->Add(Req(3, 20, 10)).ok());  // 30: waits, though two slots are free
  FakeWorker w;
  std::vector<Event> ev;
  StepPlan p = Step(*s, w, T(0), &ev);
  EXPECT_EQ(Entries(p), (std::vector<E>{{1, 0, 0, 40, true}, {2, 1, 0, 30, true}}));
  SchedulerStatus st = s->Status();
  EXPECT_EQ(st.pool_reserved, 90);
  EXPECT_EQ(st.pool_used, 70);
  EXPECT_EQ(st.queued, 1);
  EXPECT_EQ(st.slots[0].ctx_reserved, 50);
  // 9 more steps: both generate their 10 tokens in full; 3 is admitted the step after they end.
  for (int i = 1; i <= 9; ++i) {
    p = Step(*s, w, T(i), &ev);
    EXPECT_EQ(Entries(p), (std::vector<E>{{1, 0, 39 + i, 1, true}, {2, 1, 29 + i, 1, true}})) << i;
  }
  auto fin = Finished(ev);
  EXPECT_EQ(fin[1].reason, FinishReason::kLength);
  EXPECT_EQ(fin[1].n_generated, 10);
  EXPECT_EQ(fin[2].n_generated, 10);
  p = Step(*s, w, T(20), &ev);
  EXPECT_EQ(Entries(p), (std::vector<E>{{3, 0, 0, 20, true}}));
}

TEST(SchedulerTable, HeadOfLineBlocksSmallerLaterRequests) {
  auto s = Make(Config(3, 200, 200, Pool(100, 100)));
  ASSERT_TRUE(s->Add(Req(1, 50, 20)).ok());  // reserves 70
  FakeWorker w;
  StepPlan p = Step(*s, w, T(0), nullptr);
  ASSERT_EQ(p.entries.size(), 1u);
  ASSERT_TRUE(s->Add(Req(2, 30, 10)).ok());  // head: 40, does not fit next to 70
  ASSERT_TRUE(s->Add(Req(3, 5, 5)).ok());    // 10 would fit, but waits behind the head
  for (int i = 1; i <= 19; ++i) {
    p = Step(*s, w, T(i), nullptr);
    EXPECT_EQ(Entries(p), (std::vector<E>{{1, 0, 49 + i, 1, true}})) << i;
  }
  p = Step(*s, w, T(20), nullptr);
  EXPECT_EQ(Entries(p), (std::vector<E>{{2, 0, 0, 30, true}, {3, 1, 0, 5, true}}));
}

TEST(SchedulerTable, StaticSplitReservesTheWholeShare) {
  auto s = Make(Config(2, 200, 200, Static(100)));  // 50 per slot
  ASSERT_TRUE(s->Add(Req(1, 10, 3)).ok());
  ASSERT_TRUE(s->Add(Req(2, 10, 3)).ok());
  FakeWorker w;
  StepPlan p = Step(*s, w, T(0), nullptr);
  EXPECT_EQ(Entries(p), (std::vector<E>{{1, 0, 0, 10, true}, {2, 1, 0, 10, true}}));
  SchedulerStatus st = s->Status();
  EXPECT_EQ(st.per_slot_cap, 50);
  EXPECT_EQ(st.slots[0].ctx_reserved, 50);
  EXPECT_EQ(st.pool_reserved, 100);

  // Four slots: shares of 25 for new admissions. A queued request of 30 can no longer fit and
  // fails; one of 20 is admitted into a new slot only once the pool has 25 free (the running two
  // hold 100).
  ASSERT_TRUE(s->Add(Req(3, 20, 10)).ok());  // 30 <= 50 now
  ASSERT_TRUE(s->Add(Req(4, 15, 5)).ok());   // 20
  ASSERT_TRUE(s->SetSlots(4).ok());
  std::vector<Event> ev = s->TakeEvents();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(Str(ev[0]).substr(0, 15), "fin 3 error gen");
  p = Step(*s, w, T(1), &ev);
  EXPECT_EQ(Entries(p), (std::vector<E>{{1, 0, 10, 1, true}, {2, 1, 10, 1, true}}));
  p = Step(*s, w, T(2), &ev);  // 1 and 2 end (3 tokens)
  EXPECT_EQ(p.entries.size(), 2u);
  p = Step(*s, w, T(3), &ev);
  EXPECT_EQ(Entries(p), (std::vector<E>{{4, 0, 0, 15, true}}));
  EXPECT_EQ(s->Status().slots[0].ctx_reserved, 25);
}

TEST(SchedulerTable, PolicyShrinkKeepsRunningReservations) {
  auto s = Make(Config(2, 200, 200, Pool(100, 100)));
  ASSERT_TRUE(s->Add(Req(1, 40, 20)).ok());  // 60
  FakeWorker w;
  std::vector<Event> ev;
  Step(*s, w, T(0), &ev);
  ASSERT_TRUE(s->Add(Req(2, 10, 10)).ok());  // 20
  ASSERT_TRUE(s->Add(Req(3, 40, 20)).ok());  // 60
  ASSERT_TRUE(s->SetContextPolicy(Pool(50, 50)).ok());
  auto fin = Finished(s->TakeEvents());
  ASSERT_EQ(fin.size(), 1u);
  EXPECT_EQ(fin[3].reason, FinishReason::kError);  // 60 > new cap 50
  SchedulerStatus st = s->Status();
  EXPECT_EQ(st.pool_total, 50);
  EXPECT_EQ(st.pool_reserved, 60);  // 1 keeps what it reserved
  for (int i = 1; i <= 19; ++i) {
    StepPlan p = Step(*s, w, T(i), &ev);
    EXPECT_EQ(Entries(p), (std::vector<E>{{1, 0, 39 + i, 1, true}})) << i;  // 2 waits
  }
  fin = Finished(ev);
  EXPECT_EQ(fin[1].reason, FinishReason::kLength);
  EXPECT_EQ(fin[1].n_generated, 20);
  StepPlan p = Step(*s, w, T(30), &ev);
  EXPECT_EQ(Entries(p), (std::vector<E>{{2, 0, 0, 10, true}}));
}

}  // namespace
}  // namespace ds::sched::testing
