// Scheduler API semantics: admission errors, abort in every state, stop, deadlines, drain, history
// and replay, step protocol errors, timings.
#include <vector>

#include "gtest/gtest.h"
#include "tests/scheduler/test_util.h"

namespace ds::sched::testing {
namespace {

TEST(Scheduler, CreateRejectsBadConfig) {
  EXPECT_EQ(Scheduler::Create(Config(0, 8, 8, Pool(100, 50))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create(Config(2, 0, 8, Pool(100, 50))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create(Config(2, 8, 8, Pool(100, -1))).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto uncapped = Scheduler::Create(Config(2, 8, 8, Pool(100, 0)));  // 0: capped by n_ctx only
  ASSERT_TRUE(uncapped.ok());
  EXPECT_EQ((*uncapped)->Status().per_slot_cap, 100);
  EXPECT_EQ(Scheduler::Create(Config(4, 8, 8, Static(3))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Scheduler::Create(Config(4, 8, 8, Static(4))).ok());
}

TEST(Scheduler, BoundedQueueFailsFast) {
  auto s = Make(Config(1, 100, 100, Pool(1000, 500), /*max_queue=*/2));
  ASSERT_TRUE(s->Add(Req(1, 2, 2)).ok());
  ASSERT_TRUE(s->Add(Req(2, 2, 2)).ok());
  absl::Status st = s->Add(Req(3, 2, 2));
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  FakeWorker w;
  Step(*s, w, T(0), nullptr);  // 1 leaves the queue for the slot; running does not count
  EXPECT_TRUE(s->Add(Req(3, 2, 2)).ok());
  EXPECT_EQ(s->Add(Req(4, 2, 2)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s->Status().queued, 2);
}

TEST(Scheduler, NeverFitsIsInvalidArgument) {
  auto st = Make(Config(4, 100, 100, Static(100)));  // 25 per slot
  EXPECT_EQ(st->Add(Req(1, 20, 6)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(st->Add(Req(2, 20, 5)).ok());
  auto pool = Make(Config(4, 100, 100, Pool(100, 40)));
  EXPECT_EQ(pool->Add(Req(1, 30, 11)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(pool->Add(Req(2, 30, 10)).ok());
  auto small = Make(Config(4, 100, 100, Pool(/*n_ctx=*/50, /*slot_cap=*/500)));  // cap = n_ctx
  EXPECT_EQ(small->Add(Req(1, 40, 11)).code(), absl::StatusCode::kInvalidArgument);
  // Never-fits wins over a full queue: it is the client's error, not load.
  auto full = Make(Config(1, 100, 100, Pool(100, 100), 1));
  ASSERT_TRUE(full->Add(Req(1, 2, 2)).ok());
  EXPECT_EQ(full->Add(Req(2, 99, 2)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Scheduler, MalformedRequests) {
  auto s = Make(Config(1, 100, 100, Pool(1000, 500)));
  EXPECT_EQ(s->Add(Req(1, 0, 2)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Add(Req(1, 2, 0)).code(), absl::StatusCode::kInvalidArgument);
  Request neg = Req(1, 3, 2);
  neg.prompt[1] = -5;
  absl::Status st = s->Add(neg);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("-5"), std::string_view::npos) << st;
  Request replay = Req(1, 3, 2);
  replay.generated = {11, 12};  // already max_new_tokens
  EXPECT_EQ(s->Add(replay).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s->Add(Req(1, 2, 2)).ok());
  EXPECT_EQ(s->Add(Req(1, 2, 2)).code(), absl::StatusCode::kAlreadyExists);
}

TEST(Scheduler, AbortWhileQueued) {
  auto s = Make(Config(1, 100, 100, Pool(1000, 500)));
  ASSERT_TRUE(s->Add(Req(1, 2, 2)).ok());
  ASSERT_TRUE(s->Add(Req(2, 2, 2)).ok());
  ASSERT_TRUE(s->Abort(2, "client gone").ok());
  std::vector<Event> ev = s->TakeEvents();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(Str(ev[0]), "fin 2 aborted gen 0 (client gone)");
  EXPECT_EQ(s->Abort(2, "again").code(), absl::StatusCode::kNotFound);
  FakeWorker w;
  for (int i = 0; i < 3; ++i) {
    for (const E& e : Entries(Step(*s, w, T(i), nullptr))) EXPECT_EQ(e.id, 1u);
  }
  EXPECT_TRUE(s->Idle());
}

TEST(Scheduler, AbortWhileRunningFreesSlotAtOnce) {
  auto s = Make(Config(1, 100, 100, Pool(1000, 500)));
  ASSERT_TRUE(s->Add(Req(1, 2, 10)).ok());
  ASSERT_TRUE(s->Add(Req(2, 3, 1)).ok());
  FakeWorker w;
  std::vector<Event> ev;
  Step(*s, w, T(0), &ev);
  ASSERT_TRUE(s->Abort(1, "deadline").ok());  // no plan in flight
  ev = s->TakeEvents();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(Str(ev[0]), "fin 1 aborted gen 1 (deadline)");
  EXPECT_FALSE(s->Status().slots[0].busy);
  EXPECT_EQ(s->Status().pool_reserved, 0);
  StepPlan p = Step(*s, w, T(1), nullptr);
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_EQ(p.entries[0].id, 2u);
  EXPECT_EQ(p.entries[0].slot, 0);
  EXPECT_TRUE(p.entries[0].reset);
  // The worker hears of the release and of the new sequence with its full data once.
  EXPECT_EQ(p.released, std::vector<int>{0});
  ASSERT_EQ(p.started.size(), 1u);
  EXPECT_EQ(p.started[0].id, 2u);
  EXPECT_EQ(p.started[0].tokens, (std::vector<int32_t>{2000, 2001, 2002}));
}

TEST(Scheduler, AbortWhileInFlightIgnoresItsResult) {
  auto s = Make(Config(2, 100, 100, Pool(1000, 500)));
  ASSERT_TRUE(s->Add(Req(1, 2, 5)).ok());
  ASSERT_TRUE(s->Add(Req(2, 2, 5)).ok());
  ASSERT_TRUE(s->Add(Req(3, 4, 1)).ok());
  FakeWorker w;
  absl::StatusOr<StepPlan> p = s->Schedule(T(0));
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->entries.size(), 2u);
  ASSERT_TRUE(s->Abort(1, "cancelled").ok());
  EXPECT_TRUE(s->TakeEvents().size() == 2);  // only the two Started events; no Finished yet
  EXPECT_TRUE(s->Get(1)->in_flight);
  EXPECT_TRUE(s->Status().slots[0].busy);  // the worker is still writing slot 0
  absl::StatusOr<std::vector<Event>> ev = s->Apply(*p, w.Run(*p), T(1));
  ASSERT_TRUE(ev.ok());
  std::vector<std::string> got;
  for (const Event& e : *ev) got.push_back(Str(e));
  EXPECT_EQ(got, (std::vector<std::string>{"fin 1 aborted gen 0 (cancelled)",
                                           absl::StrCat("tok 2:", FakeToken(2, 2))}));
  EXPECT_EQ(s->Get(1).status().code(), absl::StatusCode::kNotFound);
  StepPlan p2 = Step(*s, w, T(2), nullptr);
  EXPECT_EQ(Entries(p2), (std::vector<E>{{2, 1, 2, 1, true}, {3, 0, 0, 4, true}}));
  EXPECT_TRUE(p2.entries[1].reset);
}

TEST(Scheduler, GatewayFinishInFlightAndStopIds) {
  auto s = Make(Config(2, 100, 100, Pool(1000, 500)));
  // Request 1 stops on the token the fake worker samples at slot length 4 (its 2nd token).
  ASSERT_TRUE(s->Add(Req(1, 3, 10, 0, {FakeToken(1, 4)})).ok());
  ASSERT_TRUE(s->Add(Req(2, 3, 10)).ok());
  FakeWorker w;
  Step(*s, w, T(0), nullptr);
  absl::StatusOr<StepPlan> p = s->Schedule(T(1));
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(s->Finish(2, FinishReason::kStop, "stop string").ok());  // gateway matched text
  absl::StatusOr<std::vector<Event>> ev = s->Apply(*p, w.Run(*p), T(2));
  ASSERT_TRUE(ev.ok());
  std::vector<std::string> got;
  for (const Event& e : *ev) got.push_back(Str(e));
  EXPECT_EQ(got, (std::vector<std::string>{absl::StrCat("tok 1:", FakeToken(1, 4)),
                                           "fin 1 stop gen 2", "fin 2 stop gen 1 (stop string)"}));
  EXPECT_TRUE(s->Idle());
}

TEST(Scheduler, DeadlineExpiresInSchedule) {
  auto s = Make(Config(1, 100, 100, Pool(1000, 500)));
  Request r = Req(1, 2, 10);
  r.deadline = T(50);
  ASSERT_TRUE(s->Add(r).ok());
  Request q = Req(2, 2, 1);
  q.deadline = T(5);  // expires while queued
  ASSERT_TRUE(s->Add(q).ok());
  FakeWorker w;
  std::vector<Event> ev;
  Step(*s, w, T(10), &ev);
  Step(*s, w, T(20), &ev);
  auto fin = Finished(ev);
  ASSERT_EQ(fin.size(), 1u);
  EXPECT_EQ(Str(fin[2]), "fin 2 aborted gen 0 (deadline exceeded)");
  ev.clear();
  StepPlan p = Step(*s, w, T(50), &ev);
  EXPECT_TRUE(p.empty());
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(Str(ev[0]), "fin 1 aborted gen 2 (deadline exceeded)");
  EXPECT_EQ(ev[0].timings.finished, T(50));
  EXPECT_TRUE(s->Idle());
}

TEST(Scheduler, DrainRejectsNewButFinishesAccepted) {
  auto s = Make(Config(1, 100, 100, Pool(1000, 500)));
  ASSERT_TRUE(s->Add(Req(1, 2, 2)).ok());
  ASSERT_TRUE(s->Add(Req(2, 2, 2)).ok());
  s->Drain();
  EXPECT_TRUE(s->Status().draining);
  EXPECT_EQ(s->Add(Req(3, 2, 2)).code(), absl::StatusCode::kUnavailable);
  FakeWorker w;
  std::vector<Event> ev;
  for (int i = 0; i < 10 && !s->Idle(); ++i) Step(*s, w, T(i), &ev);
  auto fin = Finished(ev);
  ASSERT_EQ(fin.size(), 2u);
  EXPECT_EQ(fin[1].reason, FinishReason::kLength);
  EXPECT_EQ(fin[2].reason, FinishReason::kLength);
  EXPECT_TRUE(s->Idle());
  s->Resume();
  EXPECT_TRUE(s->Add(Req(3, 2, 2)).ok());
}

TEST(Scheduler, FailedStepFinishesItsRequestsWithError) {
  auto s = Make(Config(2, 100, 100, Pool(1000, 500)));
  ASSERT_TRUE(s->Add(Req(1, 2, 5)).ok());
  ASSERT_TRUE(s->Add(Req(2, 2, 5)).ok());
  absl::StatusOr<StepPlan> p = s->Schedule(T(0));
  ASSERT_TRUE(p.ok());
  StepResults r;
  r.step_id = p->step_id;
  r.status = absl::InternalError("cuda: out of memory");
  absl::StatusOr<std::vector<Event>> ev = s->Apply(*p, r, T(1));
  ASSERT_TRUE(ev.ok());
  auto fin = Finished(*ev);
  ASSERT_EQ(fin.size(), 2u);
  EXPECT_EQ(Str(fin[1]), "fin 1 error gen 0 (step failed: cuda: out of memory)");
  EXPECT_EQ(fin[2].reason, FinishReason::kError);
  EXPECT_EQ(s->Status().pool_reserved, 0);
  EXPECT_TRUE(s->Idle());
}

TEST(Scheduler, StepProtocolErrors) {
  auto s = Make(Config(2, 100, 100, Pool(1000, 500)));
  ASSERT_TRUE(s->Add(Req(1, 2, 5)).ok());
  FakeWorker w;
  StepPlan none;
  EXPECT_EQ(s->Apply(none, {}, T(0)).status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<StepPlan> p = s->Schedule(T(0));
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(s->plan_in_flight());
  EXPECT_EQ(s->Schedule(T(0)).status().code(), absl::StatusCode::kFailedPrecondition);
  StepResults r = w.Run(*p);
  StepResults wrong_step = r;
  wrong_step.step_id += 1;
  EXPECT_EQ(s->Apply(*p, wrong_step, T(1)).status().code(), absl::StatusCode::kFailedPrecondition);
  StepResults missing = r;
  missing.tokens.clear();
  EXPECT_EQ(s->Apply(*p, missing, T(1)).status().code(), absl::StatusCode::kInvalidArgument);
  // Nothing changed on error: the right results still apply.
  EXPECT_TRUE(s->plan_in_flight());
  absl::StatusOr<std::vector<Event>> ev = s->Apply(*p, r, T(1));
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(s->Get(1)->tokens.size(), 3u);
  EXPECT_FALSE(s->plan_in_flight());
  // A negative sampled id is the worker's bug: the request ends with an error, others go on.
  p = s->Schedule(T(2));
  ASSERT_TRUE(p.ok());
  r = w.Run(*p);
  r.tokens[0] = -1;
  ev = s->Apply(*p, r, T(3));
  ASSERT_TRUE(ev.ok());
  ASSERT_EQ(ev->size(), 1u);
  EXPECT_EQ(Str((*ev)[0]), "fin 1 error gen 1 (worker sampled invalid token id -1)");
}

TEST(Scheduler, KeepsFullHistoryAndReplaysElsewhere) {
  auto a = Make(Config(2, 100, 100, Pool(1000, 500)));
  ASSERT_TRUE(a->Add(Req(7, 3, 4, /*priority=*/2, {1})).ok());
  FakeWorker wa;
  Step(*a, wa, T(0), nullptr);
  Step(*a, wa, T(1), nullptr);
  absl::StatusOr<RequestInfo> info = a->Get(7);
  ASSERT_TRUE(info.ok());
  const std::vector<int32_t> want = {7000, 7001, 7002, FakeToken(7, 3), FakeToken(7, 4)};
  EXPECT_EQ(info->tokens, want);
  EXPECT_EQ(info->n_prompt, 3);
  EXPECT_EQ(info->computed, 4);
  EXPECT_EQ(info->state, RequestInfo::State::kRunning);

  // Worker A dies: replay on B with the history; B re-prefills the prompt as A cut it (one piece
  // of 3), then the 2 generated tokens as a decode-path piece, and generates the last 2.
  absl::StatusOr<Request> replay = a->ExportForReplay(7);
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->generated, (std::vector<int32_t>{FakeToken(7, 3), FakeToken(7, 4)}));
  EXPECT_EQ(replay->prompt_pieces, (std::vector<int32_t>{3}));
  EXPECT_EQ(replay->priority, 2);
  auto b = Make(Config(1, 100, 100, Pool(1000, 500)));
  ASSERT_TRUE(b->Add(*replay).ok());
  FakeWorker wb;
  std::vector<Event> ev;
  StepPlan p = Step(*b, wb, T(10), &ev);
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_EQ(p.entries[0].tokens, std::vector<int32_t>(want.begin(), want.begin() + 3));
  EXPECT_FALSE(p.entries[0].sample);
  EXPECT_FALSE(p.entries[0].decode_path);
  p = Step(*b, wb, T(11), &ev);
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_EQ(p.entries[0].tokens, std::vector<int32_t>(want.begin() + 3, want.end()));
  EXPECT_TRUE(p.entries[0].sample);
  EXPECT_TRUE(p.entries[0].decode_path);
  p = Step(*b, wb, T(12), &ev);
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_TRUE(p.entries[0].decode_path);  // a plain decode: generated tokens always are
  std::vector<std::string> got;
  for (const Event& e : ev) got.push_back(Str(e));
  EXPECT_EQ(got, (std::vector<std::string>{"start 7@0", absl::StrCat("tok 7:", FakeToken(7, 5)),
                                           absl::StrCat("tok 7:", FakeToken(7, 6)),
                                           "fin 7 length gen 4"}));
}

// A replay cuts the prompt where the first worker did (its numbers on a GPU depend on the
// pieces), whatever the new worker's budget would have chosen, unless a recorded piece does not
// fit the step: then the ordinary cut (no stall).
TEST(Scheduler, ReplayCutsThePromptAsTheFirstRunDid) {
  // First run: budget 10 with a decode of another request in the step cuts prompt 2 in 9 + 9 + 2.
  auto a = Make(Config(2, 10, 100, Pool(1000, 500)));
  ASSERT_TRUE(a->Add(Req(1, 2, 50)).ok());
  FakeWorker wa;
  Step(*a, wa, T(0), nullptr);
  ASSERT_TRUE(a->Add(Req(2, 20, 5)).ok());
  for (int i = 1; i <= 4; ++i) Step(*a, wa, T(i), nullptr);
  absl::StatusOr<Request> replay = a->ExportForReplay(2);
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->prompt_pieces, (std::vector<int32_t>{9, 9, 2}));
  ASSERT_FALSE(replay->generated.empty());
  // The new worker has room for the whole prompt at once, yet cuts it 9 + 9 + 2.
  auto b = Make(Config(1, 100, 100, Pool(1000, 500)));
  ASSERT_TRUE(b->Add(*replay).ok());
  FakeWorker wb;
  std::vector<int32_t> cuts;
  for (int i = 0; i < 4; ++i) {
    StepPlan p = Step(*b, wb, T(10 + i), nullptr);
    ASSERT_EQ(p.entries.size(), 1u);
    cuts.push_back(static_cast<int32_t>(p.entries[0].tokens.size()));
    EXPECT_EQ(p.entries[0].decode_path, i == 3) << i;
  }
  EXPECT_EQ(cuts, (std::vector<int32_t>{9, 9, 2, static_cast<int32_t>(replay->generated.size())}));
  // A worker whose step cannot take a recorded piece of 9 cuts by its own budget instead.
  auto c = Make(Config(1, 5, 100, Pool(1000, 500)));
  ASSERT_TRUE(c->Add(*replay).ok());
  FakeWorker wc;
  StepPlan p = Step(*c, wc, T(20), nullptr);
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_EQ(p.entries[0].tokens.size(), 5u);
}

TEST(Scheduler, RequeueReplaysFromPositionZeroKeepingItsPlace) {
  auto s = Make(Config(1, 100, 100, Pool(1000, 500)));
  ASSERT_TRUE(s->Add(Req(1, 3, 5)).ok());
  ASSERT_TRUE(s->Add(Req(2, 2, 1)).ok());
  FakeWorker w;
  Step(*s, w, T(0), nullptr);
  Step(*s, w, T(1), nullptr);
  ASSERT_TRUE(s->Requeue(1).ok());
  EXPECT_EQ(s->Get(1)->state, RequestInfo::State::kQueued);
  EXPECT_EQ(s->Status().pool_reserved, 0);
  // 1 was accepted before 2, so it is admitted again first, with its 3 + 2 known tokens: the
  // prompt as first cut, then its generated tokens on the decode path.
  StepPlan p = Step(*s, w, T(2), nullptr);
  EXPECT_EQ(Entries(p), (std::vector<E>{{1, 0, 0, 3, false}}));
  EXPECT_TRUE(p.entries[0].reset);
  p = Step(*s, w, T(3), nullptr);
  EXPECT_EQ(Entries(p), (std::vector<E>{{1, 0, 3, 2, true}}));
  EXPECT_TRUE(p.entries[0].decode_path);
  EXPECT_EQ(s->Get(1)->tokens.size(), 6u);
}

TEST(Scheduler, TimingsAndStatus) {
  auto s = Make(Config(2, 100, 100, Pool(1000, 500)));
  Request r = Req(1, 4, 2, /*priority=*/3);
  r.arrival = T(0);
  ASSERT_TRUE(s->Add(r).ok());
  ASSERT_TRUE(s->Add(Req(2, 4, 2, 1)).ok());
  ASSERT_TRUE(s->SetSlots(1).ok());
  FakeWorker w;
  std::vector<Event> ev;
  Step(*s, w, T(5), &ev);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev[0].kind, Event::Kind::kStarted);
  EXPECT_EQ(ev[0].timings.admitted - ev[0].timings.arrival, absl::Milliseconds(5));  // queue wait
  SchedulerStatus st = s->Status();
  EXPECT_EQ(st.running, 1);
  EXPECT_EQ(st.queued, 1);
  EXPECT_EQ(st.queued_by_priority, (std::vector<std::pair<int, int>>{{1, 1}}));
  ASSERT_EQ(st.slots.size(), 1u);
  EXPECT_EQ(st.slots[0].id, 1u);
  EXPECT_EQ(st.slots[0].ctx_used, 4);
  EXPECT_EQ(st.slots[0].ctx_reserved, 6);
  EXPECT_EQ(st.steps_applied, 1u);
  Step(*s, w, T(20), &ev);
  auto fin = Finished(ev);
  ASSERT_EQ(fin.count(1), 1u);
  const RequestTimings& t = fin[1].timings;
  EXPECT_EQ(t.arrival, T(0));
  EXPECT_EQ(t.admitted, T(5));
  EXPECT_EQ(t.first_token, T(5));
  EXPECT_EQ(t.last_token, T(20));
  EXPECT_EQ(t.finished, T(20));
  EXPECT_EQ(fin[1].n_prompt, 4);
}

}  // namespace
}  // namespace ds::sched::testing
