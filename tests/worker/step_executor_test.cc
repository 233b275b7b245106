// StepExecutor (worker/process/step_executor.h) against a fake backend, through its plain-type API
// (worker/process/step_types.h): diffs of known tokens, releases, validation, host and device
// sampling, logprobs.
#include "worker/process/step_executor.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/sampling/rng.h"
#include "common/sampling/sampling_params.h"

namespace ds {
namespace {


// Logits: one-hot at (sum of the slot's tokens) % V, so the sampled token depends on every token
// the slot has seen (catches a wrong diff range). Validates like the real backend.
// device_sampling = true: offers device sampling; a kSample row's token is (hot + 1) % V (so a
// test can tell it from a host-sampled one) and logits come back only if a row is kLogits.
class FakeBackend final : public Backend {
 public:
  FakeBackend(int n_slots, int slot_ctx) : hist_(n_slots), n_slots_(n_slots), slot_ctx_(slot_ctx) {
    cfg_.n_vocab = 32;
  }
  std::string name() const override { return "fake"; }
  const ModelConfig& config() const override { return cfg_; }
  int n_slots() const override { return n_slots_; }
  int slot_ctx() const override { return slot_ctx_; }
  bool SupportsDeviceSampling() const override { return device_sampling; }
  absl::Status Forward(std::span<const SeqStep> batch, const StepOptions& opts,
                       StepOutput* out) override {
    ++forwards;
    if (fail_next) {
      fail_next = false;
      return absl::InternalError("injected failure");
    }
    for (const SeqStep& s : batch)
      if (s.pos0 != static_cast<int32_t>(hist_[s.slot].size()))
        return absl::InvalidArgumentError("pos0 mismatch");
    out->n_rows = static_cast<int>(batch.size());
    out->logits.assign(batch.size() * cfg_.n_vocab, 0.f);
    for (size_t i = 0; i < batch.size(); ++i) {
      auto& h = hist_[batch[i].slot];
      h.insert(h.end(), batch[i].tokens.begin(), batch[i].tokens.end());
      int64_t sum = 0;
      for (int32_t t : h) sum += t;
      out->logits[i * cfg_.n_vocab + sum % cfg_.n_vocab] = 10.f;
      hot.push_back(static_cast<int32_t>(sum % cfg_.n_vocab));
    }
    out->tokens.clear();
    if (!opts.device_sample.empty()) {
      bool host = false;
      out->tokens.assign(batch.size(), -1);
      for (size_t i = 0; i < batch.size(); ++i) {
        const DeviceSampleRow& d = opts.device_sample[i];
        seen.push_back({d.mode, d.uniform});
        if (d.mode == DeviceSampleRow::Mode::kSample)
          out->tokens[i] = (hot[hot.size() - batch.size() + i] + 1) % cfg_.n_vocab;
        host |= d.mode == DeviceSampleRow::Mode::kLogits;
      }
      if (!host) out->logits.clear();
    }
    return absl::OkStatus();
  }
  void ResetSlot(int slot) override { hist_[slot].clear(); }
  int32_t SlotLength(int slot) const override { return static_cast<int32_t>(hist_[slot].size()); }
  absl::StatusOr<SlotSnapshot> Snapshot(int) const override { return absl::UnimplementedError(""); }
  absl::Status Restore(int, const SlotSnapshot&) override { return absl::UnimplementedError(""); }
  MemoryFootprint memory() const override { return {}; }

  int forwards = 0;
  bool fail_next = false;
  bool device_sampling = false;
  std::vector<std::vector<int32_t>> hist_;
  std::vector<int32_t> hot;                                     // one-hot index per row, all steps
  std::vector<std::pair<DeviceSampleRow::Mode, double>> seen;  // device_sample rows, all steps

 private:
  ModelConfig cfg_;
  int n_slots_, slot_ctx_;
};

worker::Step MakeStep(uint64_t id) {
  worker::Step s;
  s.step_id = id;
  return s;
}
// Greedy unless the test changes it; lp = the request's `logprobs`.
void AddStart(worker::Step& s, uint64_t req, uint32_t slot, std::vector<int32_t> toks, int lp = 0) {
  worker::SequenceStart& st = s.started.emplace_back();
  st.request_id = req;
  st.slot = slot;
  st.tokens = std::move(toks);
  st.sampling.temperature = 0;
  st.sampling.n_logprobs = lp;
}
void AddWork(worker::Step& s, uint32_t slot, uint32_t pos0, uint32_t n, bool sample) {
  s.work.push_back(worker::SlotWork{slot, pos0, n, sample});
}

TEST(StepExecutor, ChunkedPrefillThenDecodeUsesKnownTokens) {
  FakeBackend be(3, 64);
  worker::StepExecutor ex(&be, 2);
  worker::Step s1 = MakeStep(1);
  AddStart(s1, 7, 0, {1, 2, 3, 4, 5});
  AddWork(s1, 0, 0, 3, false);  // first chunk: no sample
  worker::StepResult r1 = ex.Run(s1);
  ASSERT_EQ(r1.error, "");
  EXPECT_EQ(r1.step_id, 1u);
  EXPECT_EQ(r1.tokens.size(), 0u);

  worker::Step s2 = MakeStep(2);
  AddWork(s2, 0, 3, 2, true);  // rest of the prompt, then sample
  worker::StepResult r2 = ex.Run(s2);
  ASSERT_EQ(r2.error, "");
  ASSERT_EQ(r2.tokens.size(), 1u);
  EXPECT_EQ(r2.tokens[0].slot, 0u);
  EXPECT_EQ(r2.tokens[0].token, 15);  // 1+2+3+4+5
  EXPECT_FALSE(r2.tokens[0].logprob.has_value());
  EXPECT_EQ(ex.known(0), (std::vector<int32_t>{1, 2, 3, 4, 5, 15}));

  worker::Step s3 = MakeStep(3);
  AddWork(s3, 0, 5, 1, true);  // decode the sampled token
  AddStart(s3, 8, 1, {9}, /*lp=*/2);
  AddWork(s3, 1, 0, 1, true);
  worker::StepResult r3 = ex.Run(s3);
  ASSERT_EQ(r3.error, "");
  ASSERT_EQ(r3.tokens.size(), 2u);
  EXPECT_EQ(r3.tokens[0].token, 30 % 32);
  EXPECT_EQ(r3.tokens[1].token, 9);
  ASSERT_TRUE(r3.tokens[1].logprob.has_value());
  EXPECT_EQ(r3.tokens[1].logprob->token_id, 9);
  EXPECT_EQ(r3.tokens[1].logprob->top.size(), 2u);
  EXPECT_EQ(be.forwards, 3);  // one Forward per step
}

TEST(StepExecutor, ReleaseAndRebindInOneStepResets) {
  FakeBackend be(2, 64);
  worker::StepExecutor ex(&be, 1);
  worker::Step s1 = MakeStep(1);
  AddStart(s1, 1, 0, {3, 3});
  AddWork(s1, 0, 0, 2, true);
  ASSERT_EQ(ex.Run(s1).error, "");
  worker::Step s2 = MakeStep(2);
  s2.released.push_back(0);
  AddStart(s2, 2, 0, {4});
  AddWork(s2, 0, 0, 1, true);
  worker::StepResult r = ex.Run(s2);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.tokens[0].token, 4);
  EXPECT_EQ(be.hist_[0], (std::vector<int32_t>{4}));
}

TEST(StepExecutor, MalformedStepsAndBackendErrorsFailTheStepOnly) {
  FakeBackend be(2, 64);
  worker::StepExecutor ex(&be, 1);
  worker::Step bad = MakeStep(1);
  AddWork(bad, 0, 0, 1, true);  // idle slot
  EXPECT_NE(ex.Run(bad).error, "");
  worker::Step out_of_range = MakeStep(2);
  AddStart(out_of_range, 1, 0, {1, 2});
  AddWork(out_of_range, 0, 0, 3, true);  // beyond the known tokens
  EXPECT_NE(ex.Run(out_of_range).error, "");
  worker::Step slot_range = MakeStep(3);
  slot_range.released.push_back(5);
  EXPECT_NE(ex.Run(slot_range).error, "");
  // Work that follows (sent ahead) on an idle slot, or on a slot started in the same step.
  worker::Step follows_idle = MakeStep(5);
  follows_idle.work.push_back(worker::SlotWork{.slot = 0, .follows = true});
  EXPECT_NE(ex.Run(follows_idle).error, "");
  worker::Step follows_started = MakeStep(6);
  AddStart(follows_started, 1, 0, {1, 2});
  follows_started.work.push_back(worker::SlotWork{.slot = 0, .follows = true});
  EXPECT_NE(ex.Run(follows_started).error.find("pending token"), std::string::npos);
  EXPECT_EQ(be.forwards, 0);

  worker::Step ok = MakeStep(4);
  AddStart(ok, 1, 0, {1, 2});
  AddWork(ok, 0, 0, 2, true);
  be.fail_next = true;
  worker::StepResult r = ex.Run(ok);
  EXPECT_NE(r.error.find("injected failure"), std::string::npos);
  EXPECT_EQ(ex.known(0), (std::vector<int32_t>{1, 2}));  // nothing sampled
}

TEST(StepExecutor, DeviceSamplingTakesTheSeededUniformAndKeepsLogprobRowsOnTheHost) {
  using Mode = DeviceSampleRow::Mode;
  FakeBackend be(3, 64);
  be.device_sampling = true;
  worker::StepExecutor ex(&be, 3);
  // The uniforms of positions 2 and 3 (the tokens sampled after 2 and 3 known tokens).
  const double u1 = sampling::UniformAt(42, 2), u2 = sampling::UniformAt(42, 3);

  worker::Step s1 = MakeStep(1);
  AddStart(s1, 7, 0, {1, 2});
  s1.started[0].sampling.temperature = 1.0f;
  s1.started[0].sampling.seed = 42;
  AddStart(s1, 8, 1, {5}, /*lp=*/1);  // logprobs: host path
  AddStart(s1, 9, 2, {1, 2, 3});      // greedy; first chunk not sampled
  AddWork(s1, 0, 0, 2, true);
  AddWork(s1, 1, 0, 1, true);
  AddWork(s1, 2, 0, 2, false);
  worker::StepResult r1 = ex.Run(s1);
  ASSERT_EQ(r1.error, "");
  ASSERT_EQ(be.seen.size(), 3u);
  EXPECT_EQ(be.seen[0].first, Mode::kSample);
  EXPECT_EQ(be.seen[0].second, u1);  // the uniform Sampler::Sample would have drawn
  EXPECT_EQ(be.seen[1].first, Mode::kLogits);
  EXPECT_EQ(be.seen[2].first, Mode::kSkip);
  ASSERT_EQ(r1.tokens.size(), 2u);
  EXPECT_EQ(r1.tokens[0].token, 4);  // device: (1 + 2 + 1) % 32
  EXPECT_EQ(r1.tokens[1].token, 5);  // host argmax of the one-hot row
  EXPECT_TRUE(r1.tokens[1].logprob.has_value());

  // A failed step and its retry sample the same position: the same uniform.
  worker::Step s2 = MakeStep(2);
  AddWork(s2, 0, 2, 1, true);
  AddWork(s2, 2, 2, 1, true);
  be.fail_next = true;
  EXPECT_NE(ex.Run(s2).error, "");
  EXPECT_EQ(ex.known(0), (std::vector<int32_t>{1, 2, 4}));
  be.seen.clear();
  worker::StepResult r2 = ex.Run(s2);
  ASSERT_EQ(r2.error, "");
  ASSERT_EQ(be.seen.size(), 2u);
  EXPECT_EQ(be.seen[0].second, u2);
  EXPECT_EQ(be.seen[1].first, Mode::kSample);  // greedy rows sample on the device too
  EXPECT_EQ(be.seen[1].second, 0.0);
  EXPECT_EQ(r2.tokens[0].token, (1 + 2 + 4 + 1) % 32);
  EXPECT_EQ(r2.tokens[1].token, (1 + 2 + 3 + 1) % 32);
}

// `logprobs` beyond what the sampler returns gets the sampler's maximum, not an error.
TEST(StepExecutor, LogprobsAreCappedAtTheSamplersMaximum) {
  FakeBackend be(2, 64);
  worker::StepExecutor ex(&be, 1);
  worker::Step s = MakeStep(1);
  AddStart(s, 1, 0, {3}, /*lp=*/1000);
  AddWork(s, 0, 0, 1, true);
  worker::StepResult r = ex.Run(s);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.tokens.size(), 1u);
  ASSERT_TRUE(r.tokens[0].logprob.has_value());
  EXPECT_EQ(r.tokens[0].logprob->token_id, 3);
  ASSERT_EQ(r.tokens[0].logprob->top.size(), static_cast<size_t>(sampling::kMaxLogprobs));
  EXPECT_EQ(r.tokens[0].logprob->top[0].token_id, 3);  // most likely first
}

// A replay after failover (SequenceStart.n_generated = 2): the uniforms are keyed by position,
// so the next token draws the uniform of position 4, as the uninterrupted run did (seeded
// sampling continues exactly, however many draws the earlier tokens took, MTP included).
TEST(StepExecutor, ReplayedSequenceContinuesTheSeededRandomStream) {
  FakeBackend be(3, 64);
  be.device_sampling = true;
  worker::StepExecutor ex(&be, 2);
  const double third = sampling::UniformAt(42, 4);
  worker::Step s = MakeStep(1);
  AddStart(s, 7, 0, {1, 2, 30, 31});
  s.started[0].sampling.temperature = 1.0f;
  s.started[0].sampling.seed = 42;
  s.started[0].n_generated = 2;
  AddWork(s, 0, 0, 4, true);
  worker::StepResult r = ex.Run(s);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(be.seen.size(), 1u);
  EXPECT_EQ(be.seen[0].second, third);
}

}  // namespace
}  // namespace ds
