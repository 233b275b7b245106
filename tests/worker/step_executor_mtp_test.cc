// StepExecutor with MTP speculative decoding (issue #15) over the real CPU backend and the trained
// demo model: driven by steps as the scheduler sends them (a prefill, then one decode SlotWork per
// slot and step, new sequences joining mid-way), every slot's tokens equal those of the same
// steps without MTP, while slots answer with several tokens per step.
#include <gtest/gtest.h>

#include <map>

#include "common/util/model_alias.h"
#include "worker/backend_factory.h"
#include "worker/process/step_executor.h"

namespace ds::worker {
namespace {

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + salt * 101) % 2000 + 5));
  return p;
}

struct Outcome {
  std::map<uint32_t, std::vector<int32_t>> generated;  // by slot
  int steps = 0;
  spec::SpecStats stats;
};

// Three sequences: slots 0 and 1 start together; slot 2 joins at step 3 with its prompt prefilled
// in the same Forward as the others' decodes (or verifies). Each generates max_new tokens.
Outcome Drive(int mtp_drafts, float temperature) {
  Outcome o;
  BackendOptions bo;
  bo.n_slots = 3;
  bo.slot_ctx = 256;
  bo.n_threads = 2;
  auto be = CreateBackend("cpu", ResolveModelAlias("demo"), bo, SpeculativeRoom{mtp_drafts + 1, 3});
  EXPECT_TRUE(be.ok()) << be.status();
  if (!be.ok()) return o;
  StepExecutor ex(be->get(), 3);
  EXPECT_TRUE(ex.SetMtp(spec::MtpSetting{mtp_drafts, false}).ok());
  const uint32_t kMaxNew = 40;
  std::map<uint32_t, size_t> known;  // tokens the slot has (prompt + generated)
  auto start = [&](Step& st, uint32_t slot, std::vector<int32_t> prompt) {
    SequenceStart s;
    s.request_id = 100 + slot;
    s.slot = slot;
    s.tokens = prompt;
    s.sampling.temperature = temperature;
    s.sampling.seed = 7 + slot;
    s.max_new_tokens = kMaxNew;
    st.started.push_back(s);
    st.work.push_back(SlotWork{slot, 0, static_cast<uint32_t>(prompt.size()), true, false});
    known[slot] = prompt.size();
  };
  uint64_t id = 1;
  for (int step = 0; step < 200; ++step) {
    Step st;
    st.step_id = id++;
    if (step == 0) {
      start(st, 0, Prompt(11, 0));
      start(st, 1, Prompt(23, 1));
    }
    for (uint32_t slot = 0; slot < 3; ++slot) {
      if (!known.count(slot) || o.generated[slot].size() >= kMaxNew) continue;
      if (step == 0) continue;
      st.work.push_back(SlotWork{slot, static_cast<uint32_t>(known[slot] - 1), 1, true, true});
    }
    if (step == 3) start(st, 2, Prompt(17, 2));
    if (st.work.empty()) break;
    const StepResult r = ex.Run(st);
    EXPECT_TRUE(r.error.empty()) << r.error;
    if (!r.error.empty()) break;
    for (const SampledToken& t : r.tokens) {
      o.generated[t.slot].push_back(t.token);
      ++known[t.slot];
    }
    ++o.steps;
  }
  for (auto& [slot, g] : o.generated) {
    EXPECT_GE(g.size(), kMaxNew) << "slot " << slot;
    if (g.size() > kMaxNew) g.resize(kMaxNew);  // a scheduler drops tokens past max_new
  }
  o.stats = ex.mtp_stats();
  return o;
}

TEST(StepExecutorMtp, GreedyTokensEqualPlainStepsAndTakeFewerSteps) {
  const Outcome plain = Drive(0, 0.0f);
  const Outcome mtp = Drive(3, 0.0f);
  ASSERT_EQ(plain.generated.size(), 3u);
  EXPECT_EQ(mtp.generated, plain.generated);
  EXPECT_GT(mtp.stats.accepted[0], 0);
  EXPECT_LT(mtp.steps, plain.steps);
}

TEST(StepExecutorMtp, SampledRequestsRepeatPerSeed) {
  const Outcome a = Drive(2, 0.8f), b = Drive(2, 0.8f);
  ASSERT_EQ(a.generated.size(), 3u);
  EXPECT_EQ(a.generated, b.generated);
  EXPECT_GT(a.stats.steps, 0);
}

TEST(StepExecutorMtp, RefusesWhatTheBackendCannotDo) {
  BackendOptions bo;
  bo.n_slots = 1;
  bo.slot_ctx = 64;
  auto be = CreateBackend("cpu", ResolveModelAlias("demo"), bo);
  ASSERT_TRUE(be.ok());
  StepExecutor ex(be->get(), 1);
  EXPECT_EQ(ex.SetMtp(spec::MtpSetting{99, false}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ex.SetMtp(spec::MtpSetting{}).ok());
}

}  // namespace
}  // namespace ds::worker
