// StepExecutor with MTP speculative decoding (issue #15) over the real CPU backend and the trained
// demo model: driven by steps as the scheduler sends them (tests/worker/mtp_drive.h: a prefill,
// then one decode SlotWork per slot and step, new sequences joining mid-way), every slot's tokens
// equal those of the same steps without MTP, while slots answer with several tokens per step.
#include <gtest/gtest.h>

#include "common/util/model_alias.h"
#include "tests/model/test_util.h"
#include "tests/worker/mtp_drive.h"
#include "worker/backend_factory.h"
#include "worker/process/step_executor.h"

namespace ds::worker {
namespace {

using mtp_test::Outcome;
using mtp_test::Prompt;
using mtp_test::DriveOneRank;

TEST(StepExecutorMtp, GreedyTokensEqualPlainStepsAndTakeFewerSteps) {
  const Outcome plain = DriveOneRank(0, 0.0f);
  const Outcome mtp = DriveOneRank(3, 0.0f);
  ASSERT_EQ(plain.generated.size(), 3u);
  EXPECT_EQ(mtp.generated, plain.generated);
  EXPECT_GT(mtp.stats.accepted[0], 0);
  EXPECT_LT(mtp.steps, plain.steps);
}

// Decodes sent ahead (SlotWork::follows: no position, the scheduler does not know how many tokens
// the previous answer held): the executor continues each slot from its pending token, with the
// tokens and steps of the same schedule with positions.
TEST(StepExecutorMtp, WorkThatFollowsContinuesFromThePendingToken) {
  const Outcome named = DriveOneRank(3, 0.8f);
  const Outcome follows = DriveOneRank(3, 0.8f, "demo", /*automatic=*/false, /*follows=*/true);
  EXPECT_EQ(follows.generated, named.generated);
  EXPECT_EQ(follows.steps, named.steps);
  EXPECT_GT(follows.stats.accepted[0], 0);
}

// Two routes to the same drafts: the same tokens, steps and acceptance at every position, and
// drafts that were kept.
void ExpectSameOutcome(const Outcome& got, const Outcome& want) {
  ASSERT_EQ(want.generated.size(), 3u);
  EXPECT_EQ(got.generated, want.generated);
  EXPECT_EQ(got.steps, want.steps);
  EXPECT_EQ(got.stats.offered, want.stats.offered);
  EXPECT_EQ(got.stats.accepted, want.stats.accepted);
  EXPECT_GT(got.stats.accepted[0], 0);
}

// Deferred drafts (StepExecutor::SetDeferredDrafts): each slot's drafts stay on the backend until
// its next verify, which takes them there; the tokens, the steps and the acceptance at every
// position are those of drafts waited for, greedy and sampled, with positions and sent ahead.
TEST(StepExecutorMtp, DeferredDraftsGiveTheSameTokensStepsAndAcceptance) {
  for (const float temperature : {0.0f, 0.8f}) {
    for (const bool follows : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "temperature " << temperature << " follows " << follows);
      const Outcome waited = DriveOneRank(3, temperature, "demo", false, follows, false);
      const Outcome deferred = DriveOneRank(3, temperature, "demo", false, follows, true);
      ExpectSameOutcome(deferred, waited);
    }
  }
}

// Chains after the verify (StepOptions::chain_after): with the verify rows sampled where the
// logits are (the CPU twin of device sampling) and deferred drafts, each verify's Forward queues
// the slot's next chain itself, except near max_new (the draft count then depends on the
// verdict) and where a step's micro-steps leave the rows elsewhere; the tokens, steps and
// acceptance are those of chains queued after the Forward, greedy and sampled.
TEST(StepExecutorMtp, ChainsAfterTheVerifyGiveTheSameTokensStepsAndAcceptance) {
  for (const float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << temperature);
    int64_t none = -1, queued = -1;
    const Outcome after = DriveOneRank(3, temperature, "demo", false, true, true, false, &none);
    const Outcome in_forward =
        DriveOneRank(3, temperature, "demo", false, true, true, true, &queued);
    ExpectSameOutcome(in_forward, after);
    EXPECT_EQ(none, 0);
    int64_t verifies = 0;
    for (int64_t x : in_forward.stats.offered) verifies = std::max(verifies, x);
    EXPECT_GE(queued, verifies / 2) << "of " << verifies << " verifies";
  }
}

// `--mtp auto` (worker/spec/draft_policy.h): on the tiny random-weight model, whose drafts are
// rejected, sequences soon stop drafting (far fewer verifies offer a draft than with a fixed K);
// on the trained demo model they keep drafting and accepting. Tokens equal plain steps on both.
TEST(StepExecutorMtp, AutoDraftsWhatTheSequenceAccepts) {
  const std::string& tiny = testing::TinyModelPath();
  const Outcome plain = DriveOneRank(0, 0.0f, tiny);
  const Outcome fixed = DriveOneRank(3, 0.0f, tiny);
  const Outcome adaptive = DriveOneRank(3, 0.0f, tiny, /*automatic=*/true);
  EXPECT_EQ(fixed.generated, plain.generated);
  EXPECT_EQ(adaptive.generated, plain.generated);
  ASSERT_GT(fixed.stats.offered[0], 0);
  EXPECT_LT(2 * adaptive.stats.offered[0], fixed.stats.offered[0])
      << "auto offered drafts in " << adaptive.stats.offered[0] << " verifies, fixed K in "
      << fixed.stats.offered[0];
  const Outcome demo_plain = DriveOneRank(0, 0.0f);
  const Outcome demo_auto = DriveOneRank(3, 0.0f, "demo", /*automatic=*/true);
  EXPECT_EQ(demo_auto.generated, demo_plain.generated);
  EXPECT_GT(demo_auto.stats.accepted[0], 0);
  EXPECT_LT(demo_auto.steps, demo_plain.steps);
}

// Sampled requests: per seed, the tokens of the same steps without MTP (each verify row draws the
// uniform of its position; worker/spec/speculative_rule.h), while drafts are kept.
TEST(StepExecutorMtp, SampledTokensEqualPlainStepsPerSeed) {
  const Outcome plain = DriveOneRank(0, 0.8f);
  const Outcome a = DriveOneRank(2, 0.8f), b = DriveOneRank(2, 0.8f);
  ASSERT_EQ(a.generated.size(), 3u);
  EXPECT_EQ(a.generated, b.generated);
  EXPECT_EQ(a.generated, plain.generated);
  EXPECT_GT(a.stats.accepted[0], 0);
  EXPECT_LT(a.steps, plain.steps);
}

// A prompt prefilled in two chunks (the second one sampled) leaves the slot's MTP layer with K/V
// over the whole prompt: the backend's state equals that of a reference that ran the same chunks
// with every row's hidden state and then MtpRows over the prompt plus the first token, and drew
// the same drafts (the old way, MtpSpeculator's host path).
TEST(StepExecutorMtp, PromptChunksFillTheMtpLayersKv) {
  const int k = 2;
  BackendOptions bo;
  bo.n_slots = 1;
  bo.slot_ctx = 128;
  bo.n_threads = 2;
  auto be = CreateBackend("cpu", ResolveModelAlias("demo"), bo, SpeculativeRoom{k + 1, 1});
  auto ref = CreateBackend("cpu", ResolveModelAlias("demo"), bo, SpeculativeRoom{k + 1, 1});
  ASSERT_TRUE(be.ok() && ref.ok());
  StepExecutor ex(be->get(), 1);
  ASSERT_TRUE(ex.SetMtp(spec::MtpSetting{k, false}).ok());
  const std::vector<int32_t> prompt = Prompt(29, 3);
  const uint32_t cut = 12, n = static_cast<uint32_t>(prompt.size());
  Step first;
  first.step_id = 1;
  SequenceStart st;
  st.request_id = 9;
  st.tokens = prompt;
  st.max_new_tokens = 40;
  st.sampling.temperature = 0.0f;
  first.started.push_back(st);
  first.work.push_back(SlotWork{0, 0, cut, false, false});
  ASSERT_TRUE(ex.Run(first).error.empty());
  Step second;
  second.step_id = 2;
  second.work.push_back(SlotWork{0, cut, n - cut, true, false});
  const StepResult r = ex.Run(second);
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_EQ(r.tokens.size(), 1u);

  Backend& b = **ref;
  std::vector<float> hidden, logits;
  for (const auto& [c0, c1] : {std::pair{0u, cut}, std::pair{cut, n}}) {
    SeqStep q;
    q.pos0 = static_cast<int32_t>(c0);
    q.tokens.assign(prompt.begin() + c0, prompt.begin() + c1);
    q.all_logits = true;
    StepOptions want;
    want.want_hidden = true;
    StepOutput out;
    ASSERT_TRUE(b.Forward({&q, 1}, want, &out).ok());
    hidden.insert(hidden.end(), out.hidden.begin(), out.hidden.end());
    logits.assign(out.logits.end() - b.config().n_vocab, out.logits.end());
  }
  sampling::SamplingParams greedy_params;
  greedy_params.temperature = 0.0f;
  sampling::Sampler greedy(greedy_params);
  std::vector<int32_t> tokens = prompt;
  tokens.push_back(greedy.Sample(logits, tokens).token);
  EXPECT_EQ(r.tokens[0].token, tokens.back());
  spec::MtpDrafter drafter(b.config());
  spec::Drafts drafts;
  ASSERT_TRUE(drafter.Draft(b, 0, tokens, 0, hidden, static_cast<int>(n), k, greedy, &drafts).ok());
  auto sa = (*be)->Snapshot(0), sb = b.Snapshot(0);
  ASSERT_TRUE(sa.ok() && sb.ok());
  ASSERT_EQ(sa->bytes.size(), sb->bytes.size());
  size_t i = 0;
  while (i < sa->bytes.size() && sa->bytes[i] == sb->bytes[i]) ++i;
  EXPECT_EQ(i, sa->bytes.size()) << "first difference at byte " << i << " of " << sa->bytes.size();
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
