// The scheduler with an MTP worker (issue #15): a decode may answer with its kept drafts plus the
// model's own token. Positions stay in step with the worker's state, no request gets more than
// max_new_tokens, a stop id inside an answer ends it there, decodes count their drafts in the
// token budget, nothing is scheduled ahead, and malformed answers are refused.
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "tests/scheduler/test_util.h"

namespace ds::sched::testing {
namespace {

// A worker that speculates: each sampled entry answers with 1 + kept tokens, where kept cycles
// through 0..drafts; kept drafts enter its state (the worker verified them in the same Forward).
class MtpFakeWorker {
 public:
  explicit MtpFakeWorker(int drafts) : drafts_(drafts) {}
  StepResults Run(const StepPlan& plan) {
    StepResults r;
    r.step_id = plan.step_id;
    for (int slot : plan.released) state_.erase(slot);
    for (const SeqStart& st : plan.started) {
      state_[st.slot].clear();
      EXPECT_GT(st.max_new_tokens, 0);
    }
    for (const PlanEntry& e : plan.entries) {
      EXPECT_FALSE(e.ahead);
      std::vector<int32_t>& st = state_[e.slot];
      EXPECT_EQ(e.pos0, static_cast<int32_t>(st.size())) << "request " << e.id;
      st.insert(st.end(), e.tokens.begin(), e.tokens.end());
      if (!e.sample) continue;
      const int kept = turn_++ % (drafts_ + 1);
      for (int j = 0; j <= kept; ++j) {
        r.tokens.push_back(FakeToken(e.id, static_cast<int32_t>(st.size())));
        if (j < kept) st.push_back(r.tokens.back());  // a kept draft: computed on the worker
      }
      r.counts.push_back(kept + 1);
    }
    return r;
  }

 private:
  int drafts_;
  int turn_ = 0;
  std::map<int, std::vector<int32_t>> state_;
};

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
    auto ahead = s->ScheduleAhead(T(i));
    ASSERT_TRUE(ahead.ok());
    EXPECT_TRUE(ahead->empty()) << "nothing is scheduled ahead of an MTP step";
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
  ASSERT_EQ(done.size(), 5u);
  for (RequestId id = 1; id <= 5; ++id) {
    EXPECT_EQ(done[id], FinishReason::kLength);
    ASSERT_EQ(got[id].size(), static_cast<size_t>(17 + id)) << "request " << id;
    // Token j sits at position prompt + j: FakeToken of the position the worker sampled it at.
    for (size_t j = 0; j < got[id].size(); ++j)
      EXPECT_EQ(got[id][j], FakeToken(id, static_cast<int32_t>(5 + 3 * id + j)))
          << "request " << id << " token " << j;
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
