// Scheduler::ScheduleAhead (docs/async_scheduling.md): a second plan in flight that continues the
// decodes of the first, so the worker never waits for the scheduler between two decode steps.
#include <deque>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "tests/scheduler/test_util.h"

namespace ds::sched::testing {
namespace {

// Keeps up to two plans in flight, as the daemon loop does with lookahead on: Schedule() when
// nothing is in flight, ScheduleAhead() when one is; the fake worker runs plans in issue order.
struct Pipeline {
  Scheduler& s;
  FakeWorker& w;
  std::deque<StepPlan> flight;
  int ahead_issued = 0;

  void Issue(absl::Time now) {
    if (flight.empty()) {
      absl::StatusOr<StepPlan> p = s.Schedule(now);
      ASSERT_TRUE(p.ok()) << p.status();
      if (!p->empty()) flight.push_back(*p);
    }
    if (flight.size() == 1) {
      absl::StatusOr<StepPlan> a = s.ScheduleAhead(now);
      ASSERT_TRUE(a.ok()) << a.status();
      if (!a->empty()) {
        for (const PlanEntry& e : a->entries) EXPECT_TRUE(e.ahead);
        flight.push_back(*a);
        ++ahead_issued;
      }
    }
  }
  // Applies the oldest plan; false when nothing was in flight.
  bool ApplyOne(absl::Time now, std::vector<Event>* events, absl::Status fail = absl::OkStatus()) {
    if (flight.empty()) return false;
    StepPlan p = flight.front();
    flight.pop_front();
    StepResults r = w.Run(p);
    if (!fail.ok()) {
      r.status = fail;
      r.tokens.clear();
    }
    absl::StatusOr<std::vector<Event>> ev = s.Apply(p, r, now);
    EXPECT_TRUE(ev.ok()) << ev.status();
    if (ev.ok()) events->insert(events->end(), ev->begin(), ev->end());
    return true;
  }
  void RunToIdle(absl::Time now, std::vector<Event>* events) {
    for (int i = 0; i < 1000 && !(s.Idle() && flight.empty()); ++i) {
      Issue(now);
      if (!ApplyOne(now, events)) {
        std::vector<Event> ev = s.TakeEvents();
        events->insert(events->end(), ev.begin(), ev.end());
      }
    }
  }
};

// A small scheduler (budget 16, chunk 16, pool 100 with a 50-position cap), its fake worker and
// the pipeline driver; tests unpack it: auto& [s, w, p, ev] = rig.
struct Rig {
  explicit Rig(int n_slots) : s(Make(Config(n_slots, 16, 16, Pool(100, 50)))) {}
  std::unique_ptr<Scheduler> s;
  FakeWorker w;
  Pipeline p{*s, w, {}, 0};
  std::vector<Event> ev;
};

// What the clients saw: id -> tokens streamed, id -> finish reason.
struct Seen {
  std::map<RequestId, std::vector<int32_t>> toks;
  std::map<RequestId, FinishReason> fin;
};
Seen Collect(const std::vector<Event>& events) {
  Seen out;
  for (const Event& e : events) {
    if (e.kind == Event::Kind::kToken) {
      EXPECT_EQ(out.fin.count(e.id), 0u) << "token after Finished: " << Str(e);
      out.toks[e.id].push_back(e.token);
    }
    if (e.kind == Event::Kind::kFinished) {
      EXPECT_TRUE(out.fin.emplace(e.id, e.reason).second) << "finished twice: " << e.id;
    }
  }
  return out;
}

TEST(SchedulerAhead, SameTokensAsOneStepAtATime) {
  // Mixed lengths, a stop id that hits mid-stream, more requests than slots (admissions between
  // pipelined runs).
  auto add_all = [](Scheduler& s) {
    ASSERT_TRUE(s.Add(Req(1, 5, 12)).ok());
    ASSERT_TRUE(s.Add(Req(2, 30, 3)).ok());
    ASSERT_TRUE(s.Add(Req(3, 2, 9, 0, {FakeToken(3, 6)})).ok());  // stops at its 5th token
    ASSERT_TRUE(s.Add(Req(4, 7, 1)).ok());
    ASSERT_TRUE(s.Add(Req(5, 4, 20)).ok());
  };
  Seen one, two;
  {
    auto s = Make(Config(2, 16, 8, Pool(200, 64)));
    FakeWorker w;
    add_all(*s);
    std::vector<Event> ev;
    for (int i = 0; i < 200 && !s->Idle(); ++i) Step(*s, w, T(i), &ev);
    one = Collect(ev);
  }
  {
    auto s = Make(Config(2, 16, 8, Pool(200, 64)));
    FakeWorker w;
    add_all(*s);
    Pipeline p{*s, w, {}, 0};
    std::vector<Event> ev;
    p.RunToIdle(T(0), &ev);
    two = Collect(ev);
    EXPECT_GT(p.ahead_issued, 10);
    EXPECT_TRUE(s->Idle());
  }
  EXPECT_EQ(one.toks, two.toks);
  EXPECT_EQ(one.fin, two.fin);
  EXPECT_EQ(two.fin[3], FinishReason::kStop);
  EXPECT_EQ(two.toks[3].size(), 5u);
  EXPECT_EQ(two.toks[5].size(), 20u);
}

TEST(SchedulerAhead, StopInTheFirstPlanKeepsTheSlotUntilTheSecondIsApplied) {
  Rig rig(1);
  auto& [s, w, p, ev] = rig;
  // Prompt of 3: the prefill samples the token for position 3, which is a stop id.
  ASSERT_TRUE(s->Add(Req(7, 3, 10, 0, {FakeToken(7, 3)})).ok());
  ASSERT_TRUE(s->Add(Req(8, 2, 2)).ok());  // queued: one slot
  p.Issue(T(0));  // prefill of 7; ahead: nothing (8 is queued but no slot is free)
  ASSERT_EQ(p.flight.size(), 2u);
  ASSERT_TRUE(p.ApplyOne(T(1), &ev));
  auto [toks, fin] = Collect(ev);
  EXPECT_EQ(fin[7], FinishReason::kStop);
  EXPECT_EQ(toks[7].size(), 1u);
  // Finished for its client, but the ahead plan still runs on its slot.
  EXPECT_FALSE(s->Get(7).ok());
  EXPECT_FALSE(s->Abort(7, "late").ok());
  EXPECT_TRUE(s->Status().slots[0].busy);
  EXPECT_FALSE(s->Schedule(T(2)).ok());  // a plan is still in flight
  ev.clear();
  ASSERT_TRUE(p.ApplyOne(T(2), &ev));
  EXPECT_TRUE(ev.empty()) << Str(ev[0]);  // its result is dropped silently
  EXPECT_FALSE(s->Status().slots[0].busy);
  // The freed slot goes to the queued request, released first.
  absl::StatusOr<StepPlan> next = s->Schedule(T(3));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->released, std::vector<int>{0});
  ASSERT_EQ(next->started.size(), 1u);
  EXPECT_EQ(next->started[0].id, 8u);
}

TEST(SchedulerAhead, AbortBetweenDropsBothResults) {
  Rig rig(2);
  auto& [s, w, p, ev] = rig;
  ASSERT_TRUE(s->Add(Req(1, 4, 10)).ok());
  p.Issue(T(0));
  ASSERT_EQ(p.flight.size(), 2u);
  ASSERT_TRUE(s->Abort(1, "client left").ok());
  p.ApplyOne(T(1), &ev);
  p.ApplyOne(T(2), &ev);
  auto [toks, fin] = Collect(ev);
  EXPECT_EQ(fin[1], FinishReason::kAborted);
  EXPECT_TRUE(toks[1].empty());
  EXPECT_TRUE(s->Idle());
}

TEST(SchedulerAhead, NothingAheadForTheLastTokenOrWhileAdmissionsWait) {
  {
    Rig rig(2);
    auto& [s, w, p, ev] = rig;
    ASSERT_TRUE(s->Add(Req(1, 4, 1)).ok());  // its prefill token is its last
    ASSERT_TRUE(s->Schedule(T(0)).ok());
    absl::StatusOr<StepPlan> a = s->ScheduleAhead(T(0));
    ASSERT_TRUE(a.ok());
    EXPECT_TRUE(a->empty());
    EXPECT_EQ(s->plans_in_flight(), 1);
  }
  {
    Rig rig(2);
    auto& s = rig.s;
    ASSERT_TRUE(s->Add(Req(1, 4, 10)).ok());
    ASSERT_TRUE(s->Schedule(T(0)).ok());
    ASSERT_TRUE(s->Add(Req(2, 4, 10)).ok());  // a free slot and room: Schedule() would admit it
    absl::StatusOr<StepPlan> a = s->ScheduleAhead(T(0));
    ASSERT_TRUE(a.ok());
    EXPECT_TRUE(a->empty());
  }
  {
    Rig rig(2);
    auto& s = rig.s;
    ASSERT_TRUE(s->Add(Req(1, 40, 10)).ok());  // prompt over max_chunk: still prefilling
    ASSERT_TRUE(s->Schedule(T(0)).ok());
    absl::StatusOr<StepPlan> a = s->ScheduleAhead(T(0));
    ASSERT_TRUE(a.ok());
    EXPECT_TRUE(a->empty());
  }
  {
    Rig rig(2);
    auto& s = rig.s;
    EXPECT_FALSE(s->ScheduleAhead(T(0)).ok());  // nothing in flight
    ASSERT_TRUE(s->Add(Req(1, 4, 10)).ok());
    ASSERT_TRUE(s->Schedule(T(0)).ok());
    ASSERT_TRUE(s->ScheduleAhead(T(0)).ok());
    EXPECT_EQ(s->plans_in_flight(), 2);
    EXPECT_FALSE(s->ScheduleAhead(T(0)).ok());  // two in flight already
  }
}

TEST(SchedulerAhead, FailedStepsWithRequeueReplayTheWholeHistory) {
  // The failover pattern: requests are requeued, then both in-flight plans fail.
  Rig rig(2);
  auto& [s, w, p, ev] = rig;
  ASSERT_TRUE(s->Add(Req(1, 4, 10)).ok());
  p.Issue(T(0));
  p.ApplyOne(T(1), &ev);  // prefill token
  p.Issue(T(1));          // a second ahead plan behind the first one
  ASSERT_EQ(p.flight.size(), 2u);
  ASSERT_TRUE(s->Requeue(1).ok());
  p.ApplyOne(T(2), &ev, absl::UnavailableError("worker lost"));
  p.ApplyOne(T(3), &ev, absl::UnavailableError("worker lost"));
  absl::StatusOr<RequestInfo> info = s->Get(1);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, RequestInfo::State::kQueued);
  EXPECT_EQ(info->tokens.size(), 5u);  // prompt + the one token applied before the requeue
  EXPECT_FALSE(s->Status().slots[0].busy);
  // A new worker: replayed from position 0 and finished with the same tokens as without failure.
  FakeWorker w2;
  Pipeline p2{*s, w2, {}, 0};
  p2.RunToIdle(T(4), &ev);
  auto [toks, fin] = Collect(ev);
  EXPECT_EQ(fin[1], FinishReason::kLength);
  ASSERT_EQ(toks[1].size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(toks[1][i], FakeToken(1, 4 + i)) << i;
}

TEST(SchedulerAhead, FailedFirstPlanFinishesWithErrorAndFreesTheSlotAfterTheSecond) {
  Rig rig(1);
  auto& [s, w, p, ev] = rig;
  ASSERT_TRUE(s->Add(Req(1, 4, 10)).ok());
  p.Issue(T(0));
  ASSERT_EQ(p.flight.size(), 2u);
  p.ApplyOne(T(1), &ev, absl::InternalError("oom"));
  auto [toks, fin] = Collect(ev);
  EXPECT_EQ(fin[1], FinishReason::kError);
  EXPECT_TRUE(s->Status().slots[0].busy);
  ev.clear();
  p.ApplyOne(T(2), &ev);
  EXPECT_TRUE(ev.empty());
  EXPECT_TRUE(s->Idle());
}

TEST(SchedulerAhead, DeadlineWhileInFlightAbortsAtTheNextApply) {
  Rig rig(1);
  auto& [s, w, p, ev] = rig;
  Request r = Req(1, 4, 10);
  r.deadline = T(5);
  ASSERT_TRUE(s->Add(r).ok());
  ASSERT_TRUE(s->Schedule(T(0)).ok());
  absl::StatusOr<StepPlan> a = s->ScheduleAhead(T(6));  // past the deadline: nothing ahead
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->empty());
}

}  // namespace
}  // namespace ds::sched::testing
