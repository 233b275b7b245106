// The scheduler with an MTP worker (issue #15): a decode may answer with its kept drafts plus the
// model's own token. Positions stay in step with the worker's state, no request gets more than
// max_new_tokens, a stop id inside an answer ends it there, decodes count their drafts in the
// token budget, steps sent ahead follow the in-flight answer (PlanEntry::follows) with the same
// tokens as one step at a time, and malformed answers are refused.
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/scheduler/test_util.h"

namespace ds::sched::testing {
namespace {

// A worker that speculates: each sampled entry answers with 1 + kept tokens, where kept cycles
// through 0..drafts; kept drafts enter its state (the worker verified them in the same Forward).
// An entry that follows (sent ahead) names no position: the worker continues the slot from its
// pending token (the last one it answered), as StepExecutor::Run does.
class MtpFakeWorker {
 public:
  explicit MtpFakeWorker(int drafts) : drafts_(drafts) {}
  StepResults Run(const StepPlan& plan) {
    StepResults r;
    r.step_id = plan.step_id;
    for (int slot : plan.released) state_.erase(slot);
    for (const SeqStart& st : plan.started) {
      state_[st.slot].clear();
      pending_.erase(st.slot);
      EXPECT_GT(st.max_new_tokens, 0);
    }
    for (const PlanEntry& e : plan.entries) {
      EXPECT_EQ(e.ahead, e.follows) << "an MTP step sent ahead follows its answers";
      std::vector<int32_t>& st = state_[e.slot];
      std::vector<int32_t> input = e.tokens;
      if (e.follows) {
        // pos0 is a lower bound, short by at most the drafts the previous answer kept.
        EXPECT_LE(e.pos0, static_cast<int32_t>(st.size())) << "request " << e.id;
        EXPECT_LE(static_cast<int32_t>(st.size()) - e.pos0, drafts_) << "request " << e.id;
        EXPECT_EQ(pending_.count(e.slot), 1u) << "slot " << e.slot << " has no pending token";
        input = {pending_[e.slot]};
      } else {
        EXPECT_EQ(e.pos0, static_cast<int32_t>(st.size())) << "request " << e.id;
        if (e.sample && pending_.count(e.slot) && e.tokens.size() == 1)
          EXPECT_EQ(e.tokens[0], pending_[e.slot]) << "request " << e.id;
      }
      st.insert(st.end(), input.begin(), input.end());
      ++computed_;
      if (!e.sample) continue;
      const int kept = turn_++ % (drafts_ + 1);
      for (int j = 0; j <= kept; ++j) {
        r.tokens.push_back(FakeToken(e.id, static_cast<int32_t>(st.size())));
        if (j < kept) st.push_back(r.tokens.back());  // a kept draft: computed on the worker
      }
      pending_[e.slot] = r.tokens.back();
      r.counts.push_back(kept + 1);
      r.drafts_offered.push_back(drafts_);  // every verify offers all its drafts
      kept_[e.id].push_back(kept);
    }
    return r;
  }
  // The drafts kept by each answer of a request, in order.
  const std::vector<int>& kept(RequestId id) { return kept_[id]; }
  int64_t entries() const { return computed_; }

 private:
  int drafts_;
  int turn_ = 0;
  int64_t computed_ = 0;
  std::map<int, std::vector<int32_t>> state_;
  std::map<int, int32_t> pending_;  // the last token answered per slot
  std::map<RequestId, std::vector<int>> kept_;
};

// Drives `s` as the daemon's loop does: Schedule() with nothing in flight, then (lookahead)
// ScheduleAhead() while one plan is in flight; the worker runs the plans in the order sent and
// the results are applied oldest first. Collects the tokens and finish reasons; returns the number
// of plans sent ahead.
int Drive(Scheduler& s, MtpFakeWorker& w, bool lookahead, int iterations, size_t n_requests,
          std::map<RequestId, std::vector<int32_t>>* got,
          std::map<RequestId, FinishReason>* done) {
  std::deque<std::pair<StepPlan, StepResults>> flight;
  int ahead = 0;
  for (int i = 0; i < iterations && done->size() < n_requests; ++i) {
    if (flight.empty()) {
      auto plan = s.Schedule(T(i));
      EXPECT_TRUE(plan.ok()) << plan.status();
      if (plan.ok() && !plan->empty()) flight.emplace_back(*plan, w.Run(*plan));
    }
    if (lookahead && flight.size() == 1) {
      auto plan = s.ScheduleAhead(T(i));
      EXPECT_TRUE(plan.ok()) << plan.status();
      if (plan.ok() && !plan->empty()) {
        ++ahead;
        flight.emplace_back(*plan, w.Run(*plan));
      }
    }
    if (flight.empty()) continue;
    auto ev = s.Apply(flight.front().first, flight.front().second, T(i));
    flight.pop_front();
    EXPECT_TRUE(ev.ok()) << ev.status();
    if (!ev.ok()) break;
    for (const Event& e : *ev) {
      if (e.kind == Event::Kind::kToken) (*got)[e.id].push_back(e.token);
      if (e.kind == Event::Kind::kFinished) {
        (*done)[e.id] = e.reason;
        EXPECT_EQ(e.n_generated, static_cast<int32_t>((*got)[e.id].size()));
      }
    }
  }
  return ahead;
}

// Requests 1..5 (prompt 5 + 3 id, 17 + id tokens) all ended by length, token j at position
// prompt + j: FakeToken of the position the worker sampled it at.
void ExpectFullLengthsAtTheirPositions(std::map<RequestId, std::vector<int32_t>>& got,
                                       std::map<RequestId, FinishReason>& done) {
  ASSERT_EQ(done.size(), 5u);
  for (RequestId id = 1; id <= 5; ++id) {
    EXPECT_EQ(done[id], FinishReason::kLength);
    ASSERT_EQ(got[id].size(), static_cast<size_t>(17 + id)) << "request " << id;
    for (size_t j = 0; j < got[id].size(); ++j)
      EXPECT_EQ(got[id][j], FakeToken(id, static_cast<int32_t>(5 + 3 * id + j)))
          << "request " << id << " token " << j;
  }
}

TEST(SchedulerMtp, SeveralTokensPerDecodeKeepPositionsAndLengths) {
  SchedulerConfig c = Config(3, 64, 16, Pool(1000, 300));
  c.mtp_drafts = 3;
  auto s = Make(c);
  for (RequestId id = 1; id <= 5; ++id) ASSERT_TRUE(s->Add(Req(id, 5 + 3 * id, 17 + id)).ok());
  MtpFakeWorker w(3);
  std::map<RequestId, std::vector<int32_t>> got;
  std::map<RequestId, FinishReason> done;
  for (int i = 0; i < 200 && done.size() < 5; ++i) {
    auto plan = s->Schedule(T(i));
    ASSERT_TRUE(plan.ok()) << plan.status();
    if (plan->empty()) continue;
    // Decodes count 1 + 3 rows against the budget of 64.
    int32_t rows = 0;
    for (const PlanEntry& e : plan->entries) rows += e.tokens.size() == 1 && e.sample ? 4 : 0;
    EXPECT_LE(rows, 64 + 3);
    auto ev = s->Apply(*plan, w.Run(*plan), T(i));
    ASSERT_TRUE(ev.ok()) << ev.status();
    for (const Event& e : *ev) {
      if (e.kind == Event::Kind::kToken) got[e.id].push_back(e.token);
      if (e.kind == Event::Kind::kFinished) {
        done[e.id] = e.reason;
        EXPECT_EQ(e.n_generated, static_cast<int32_t>(got[e.id].size()));
      }
    }
  }
  ExpectFullLengthsAtTheirPositions(got, done);
}

// With lookahead (the daemon's default) the steps sent ahead follow the in-flight answers: every
// request gets the tokens of one step at a time, at the positions the worker sampled them.
TEST(SchedulerMtp, StepsSentAheadFollowTheAnswersWithTheSameTokens) {
  for (int drafts : {1, 3}) {
    SchedulerConfig c = Config(3, 64, 16, Pool(1000, 300));
    c.mtp_drafts = drafts;
    auto s = Make(c);
    for (RequestId id = 1; id <= 5; ++id) ASSERT_TRUE(s->Add(Req(id, 5 + 3 * id, 17 + id)).ok());
    MtpFakeWorker w(drafts);
    std::map<RequestId, std::vector<int32_t>> got;
    std::map<RequestId, FinishReason> done;
    const int ahead = Drive(*s, w, /*lookahead=*/true, 400, 5, &got, &done);
    EXPECT_GT(ahead, 10) << "drafts " << drafts;
    ExpectFullLengthsAtTheirPositions(got, done);
    EXPECT_EQ(s->Status().running, 0);
    EXPECT_FALSE(s->Status().plan_in_flight);
  }
}

// A stop id inside an answer while a step sent ahead is already running on the slot: the request
// ends at the stop id, the ahead step's answer for it is dropped, and the slot is freed after it.
TEST(SchedulerMtp, StopInsideAnAnswerWithAStepSentAhead) {
  SchedulerConfig c = Config(1, 64, 64, Pool(1000, 300));
  c.mtp_drafts = 3;
  auto s = Make(c);
  const int32_t stop = FakeToken(1, 9);  // the second answer (kept = 1): tokens at 9 and 10
  ASSERT_TRUE(s->Add(Req(1, 8, 50, 0, {stop})).ok());
  ASSERT_TRUE(s->Add(Req(2, 6, 5)).ok());  // queued behind it (one slot)
  MtpFakeWorker w(3);
  std::map<RequestId, std::vector<int32_t>> got;
  std::map<RequestId, FinishReason> done;
  const int ahead = Drive(*s, w, /*lookahead=*/true, 40, 2, &got, &done);
  EXPECT_GT(ahead, 0);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[1], FinishReason::kStop);
  ASSERT_EQ(got[1].size(), 2u);  // the first token, then the stop id
  EXPECT_EQ(got[1].back(), stop);
  // The next request ran in the freed slot from position 0, with its own positions.
  EXPECT_EQ(done[2], FinishReason::kLength);
  ASSERT_EQ(got[2].size(), 5u);
  for (size_t j = 0; j < got[2].size(); ++j)
    EXPECT_EQ(got[2][j], FakeToken(2, static_cast<int32_t>(6 + j)));
}

// Near max_new_tokens an answer of several tokens may be the last one: nothing is sent ahead for
// a request whose in-flight answer could reach its length.
TEST(SchedulerMtp, NothingAheadWhenTheAnswerMayBeTheLast) {
  SchedulerConfig c = Config(1, 64, 64, Pool(1000, 300));
  c.mtp_drafts = 3;
  auto s = Make(c);
  ASSERT_TRUE(s->Add(Req(1, 8, 4)).ok());  // 4 tokens: the first decode may answer all of them
  auto prefill = s->Schedule(T(0));
  ASSERT_TRUE(prefill.ok());
  StepResults r;
  r.step_id = prefill->step_id;
  r.tokens = {FakeToken(1, 8)};
  ASSERT_TRUE(s->Apply(*prefill, r, T(0)).ok());
  auto decode = s->Schedule(T(1));
  ASSERT_TRUE(decode.ok());
  ASSERT_EQ(decode->entries.size(), 1u);
  auto ahead = s->ScheduleAhead(T(1));
  ASSERT_TRUE(ahead.ok());
  EXPECT_TRUE(ahead->empty()) << "1 generated + up to 4 in flight >= 4";
}

// Finished timings count the drafts by position from the worker's drafts_offered and the answers'
// lengths: a verify that kept k of K judged positions 0..min(K, k + 1) - 1 and accepted 0..k - 1.
TEST(SchedulerMtp, FinishedTimingsCountDraftsByPosition) {
  SchedulerConfig c = Config(2, 64, 64, Pool(1000, 300));
  c.mtp_drafts = 3;
  auto s = Make(c);
  ASSERT_TRUE(s->Add(Req(1, 6, 30)).ok());
  ASSERT_TRUE(s->Add(Req(2, 9, 25)).ok());
  MtpFakeWorker w(3);
  std::map<RequestId, RequestTimings> timings;
  for (int i = 0; i < 100 && timings.size() < 2; ++i) {
    auto plan = s->Schedule(T(i));
    ASSERT_TRUE(plan.ok());
    if (plan->empty()) continue;
    auto ev = s->Apply(*plan, w.Run(*plan), T(i));
    ASSERT_TRUE(ev.ok()) << ev.status();
    for (const Event& e : *ev)
      if (e.kind == Event::Kind::kFinished) timings[e.id] = e.timings;
  }
  ASSERT_EQ(timings.size(), 2u);
  for (RequestId id : {1, 2}) {
    std::vector<int32_t> judged(3, 0), accepted(3, 0);
    for (int k : w.kept(id)) {
      for (int j = 0; j < std::min(3, k + 1); ++j) ++judged[j];
      for (int j = 0; j < k; ++j) ++accepted[j];
    }
    EXPECT_EQ(timings[id].drafts_judged, judged) << "request " << id;
    EXPECT_EQ(timings[id].drafts_accepted, accepted) << "request " << id;
    EXPECT_GT(accepted[0], 0);
  }
}

TEST(SchedulerMtp, StopInsideAnAnswerEndsItThere) {
  SchedulerConfig c = Config(1, 64, 64, Pool(1000, 300));
  c.mtp_drafts = 3;
  auto s = Make(c);
  // The worker's second answer (kept = 1) holds two tokens; make the first of them a stop id.
  const int32_t stop = FakeToken(1, 9);  // prompt 8: first token at pos 8, next at 9
  ASSERT_TRUE(s->Add(Req(1, 8, 50, 0, {stop})).ok());
  MtpFakeWorker w(3);
  std::vector<int32_t> got;
  bool finished = false;
  for (int i = 0; i < 10 && !finished; ++i) {
    auto plan = s->Schedule(T(i));
    ASSERT_TRUE(plan.ok());
    if (plan->empty()) continue;
    auto ev = s->Apply(*plan, w.Run(*plan), T(i));
    ASSERT_TRUE(ev.ok()) << ev.status();
    for (const Event& e : *ev) {
      if (e.kind == Event::Kind::kToken) got.push_back(e.token);
      if (e.kind == Event::Kind::kFinished) {
        finished = true;
        EXPECT_EQ(e.reason, FinishReason::kStop);
      }
    }
  }
  EXPECT_TRUE(finished);
  ASSERT_EQ(got.size(), 2u);  // the first token, then the stop id; the token after it is dropped
  EXPECT_EQ(got.back(), stop);
  EXPECT_EQ(s->Status().running, 0);
}

// Malformed answers: too many tokens, counts that do not add up, more drafts kept than offered,
// drafts_offered not one per sampled entry.
TEST(SchedulerMtp, MalformedCountsAreRefused) {
  SchedulerConfig c = Config(2, 64, 64, Pool(1000, 300));
  c.mtp_drafts = 2;
  auto s = Make(c);
  ASSERT_TRUE(s->Add(Req(1, 4, 10)).ok());
  auto plan = s->Schedule(T(0));
  ASSERT_TRUE(plan.ok());
  StepResults r;
  r.step_id = plan->step_id;
  r.tokens = {11, 12, 13, 14};
  r.counts = {4};  // more than 1 + mtp_drafts
  EXPECT_EQ(s->Apply(*plan, r, T(0)).status().code(), absl::StatusCode::kInvalidArgument);
  r.tokens = {11, 12};
  r.counts = {3};  // counts do not add up to the tokens
  EXPECT_EQ(s->Apply(*plan, r, T(0)).status().code(), absl::StatusCode::kInvalidArgument);
  r.counts = {2};
  r.drafts_offered = {0};  // kept a draft it never offered
  EXPECT_EQ(s->Apply(*plan, r, T(0)).status().code(), absl::StatusCode::kInvalidArgument);
  r.drafts_offered = {1, 1};  // one per sampled entry
  EXPECT_EQ(s->Apply(*plan, r, T(0)).status().code(), absl::StatusCode::kInvalidArgument);
  r.drafts_offered = {2};
  EXPECT_TRUE(s->Apply(*plan, r, T(0)).ok());
  // Without MTP, several tokens for one entry are a protocol error.
  auto plain = Make(Config(2, 64, 64, Pool(1000, 300)));
  ASSERT_TRUE(plain->Add(Req(1, 4, 10)).ok());
  auto p2 = plain->Schedule(T(0));
  ASSERT_TRUE(p2.ok());
  StepResults r2;
  r2.step_id = p2->step_id;
  r2.tokens = {11, 12};
  r2.counts = {2};
  EXPECT_EQ(plain->Apply(*p2, r2, T(0)).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ds::sched::testing
