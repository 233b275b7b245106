// response_format json_object in the StepExecutor: a constrained slot is sampled on the host
// under the mask even when the backend offers device sampling (its row asks for logits), ends
// with an EOS id only once its text is one complete JSON object, shares steps with
// unconstrained slots, and a replay (failover: prompt + generated tokens, n_generated) goes on
// with exactly the tokens of the uninterrupted run.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/sampling/json_constraint.h"
#include "common/sampling/rng.h"
#include "worker/process/step_executor.h"

namespace ds {
namespace {

constexpr int kVocab = 48;
constexpr int32_t kEos = 47;

// Token bytes of the test vocabulary: JSON pieces; ids 40..46 are prompt-only words, 47 is EOS.
std::vector<std::string> VocabBytes() {
  std::vector<std::string> b = {"{",     "}",  "[",    "]",    "\"",      ":",        ",",   " ",
                                "\n",    "a",  "b",    "k",    "0",       "1",        "-",   ".",
                                "e",     "+",  "true", "null", "false",   "{\"",      "\":", "\",",
                                "\"}",   "}}", "]}",   "\\n",  "\\u00e9", "\xc3\xa9", "x y", "12",
                                "\"a\"", "[{", "},",   "],",   "\":\"",   "  ",       "ab",  "\\"};
  while (b.size() < 40) b.push_back("zz");
  for (int i = 40; i < 47; ++i) b.push_back("word" + std::to_string(i));
  b.push_back("");  // EOS: a control token, no text
  return b;
}

// Logits drawn from a hash of the slot's whole history: a different "model output" at every
// position, the same for the same history (so a replay sees what the first run saw).
class RandomBackend final : public Backend {
 public:
  RandomBackend(int n_slots, bool device) : hist_(n_slots), device_(device) {
    cfg_.n_vocab = kVocab;
  }
  std::string name() const override { return "random"; }
  const ModelConfig& config() const override { return cfg_; }
  int n_slots() const override { return static_cast<int>(hist_.size()); }
  int slot_ctx() const override { return 4096; }
  bool SupportsDeviceSampling() const override { return device_; }
  absl::Status Forward(std::span<const SeqStep> batch, const StepOptions& opts,
                       StepOutput* out) override {
    out->n_rows = static_cast<int>(batch.size());
    out->logits.assign(batch.size() * kVocab, 0.f);
    out->tokens.assign(opts.device_sample.empty() ? 0 : batch.size(), -1);
    for (size_t i = 0; i < batch.size(); ++i) {
      auto& h = hist_[batch[i].slot];
      h.insert(h.end(), batch[i].tokens.begin(), batch[i].tokens.end());
      uint64_t x = 1469598103934665603ULL;
      for (int32_t t : h) x = (x ^ static_cast<uint64_t>(t)) * 1099511628211ULL;
      sampling::Rng rng(x);
      for (int v = 0; v < kVocab; ++v)
        out->logits[i * kVocab + v] = static_cast<float>(rng.NextDouble() * 6.0 - 3.0);
      out->logits[i * kVocab + 1] += 1.0f;  // '}' a little likelier: objects close in time
      out->logits[i * kVocab + 4] += 1.0f;  // '"'
      out->logits[i * kVocab + kEos] += 2.0f;
      if (!opts.device_sample.empty()) {
        modes.push_back(opts.device_sample[i].mode);
        if (opts.device_sample[i].mode == DeviceSampleRow::Mode::kSample)
          out->tokens[i] = kEos;  // an unconstrained device sample: EOS at once
      }
    }
    return absl::OkStatus();
  }
  void ResetSlot(int slot) override { hist_[slot].clear(); }
  int32_t SlotLength(int slot) const override { return static_cast<int32_t>(hist_[slot].size()); }
  absl::StatusOr<SlotSnapshot> Snapshot(int) const override { return absl::UnimplementedError(""); }
  absl::Status Restore(int, const SlotSnapshot&) override { return absl::UnimplementedError(""); }
  MemoryFootprint memory() const override { return {}; }

  std::vector<DeviceSampleRow::Mode> modes;  // device_sample rows, all steps

 private:
  ModelConfig cfg_;
  std::vector<std::vector<int32_t>> hist_;
  bool device_;
};

worker::StepExecutor::JsonVocabLoader Loader(int* calls) {
  return [calls]() -> absl::StatusOr<std::shared_ptr<sampling::JsonVocab>> {
    ++*calls;
    const std::vector<std::string> b = VocabBytes();
    const std::vector<int32_t> eos = {kEos};
    return std::make_shared<sampling::JsonVocab>(b, eos);
  };
}

worker::SequenceStart Start(uint64_t req, uint32_t slot, std::vector<int32_t> toks, bool json,
                            uint64_t seed) {
  worker::SequenceStart st;
  st.request_id = req;
  st.slot = slot;
  st.tokens = std::move(toks);
  st.sampling.temperature = seed == 0 ? 0.0f : 0.9f;
  st.sampling.seed = seed;
  st.sampling.json_object = json;
  return st;
}

// Runs slot 0 to EOS or `max_new` tokens, starting with `start` (prefill in one work item).
std::vector<int32_t> RunToEnd(worker::StepExecutor& ex, worker::SequenceStart start, int max_new) {
  std::vector<int32_t> out;
  worker::Step s;
  s.step_id = 1;
  const uint32_t n = static_cast<uint32_t>(start.tokens.size());
  s.started.push_back(std::move(start));
  s.work.push_back(worker::SlotWork{0, 0, n, true});
  uint32_t pos = n;
  for (int i = 0; i < max_new; ++i) {
    worker::StepResult r = ex.Run(s);
    EXPECT_EQ(r.error, "");
    if (!r.error.empty() || r.tokens.empty()) break;
    out.push_back(r.tokens[0].token);
    if (r.tokens[0].token == kEos) break;
    s = worker::Step{};
    s.step_id = static_cast<uint64_t>(i) + 2;
    s.work.push_back(worker::SlotWork{0, pos, 1, true});
    ++pos;
  }
  return out;
}

std::string Text(const std::vector<int32_t>& toks) {
  const std::vector<std::string> b = VocabBytes();
  std::string s;
  for (int32_t t : toks) s += b[static_cast<size_t>(t)];
  return s;
}

TEST(StepExecutorJson, ConstrainedRowsAreHostSampledAndEndWithOneObject) {
  int completed = 0;
  for (bool device : {false, true})
    for (uint64_t seed : {0, 1, 2, 3, 4, 5, 6, 7}) {
      RandomBackend be(2, device);
      worker::StepExecutor ex(&be, 2);
      int loads = 0;
      ex.SetJsonVocabLoader(Loader(&loads));
      const std::vector<int32_t> toks = RunToEnd(ex, Start(9, 0, {40, 41, 42}, true, seed), 300);
      EXPECT_EQ(loads, 1);
      for (DeviceSampleRow::Mode m : be.modes) EXPECT_NE(m, DeviceSampleRow::Mode::kSample);
      ASSERT_FALSE(toks.empty());
      if (toks.back() != kEos) continue;  // cut at 300: a prefix
      ++completed;
      const std::string text = Text(toks);
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << "seed " << seed << ": " << text;
      EXPECT_TRUE(j.is_object()) << text;
    }
  EXPECT_GE(completed, 12);
}

TEST(StepExecutorJson, UnconstrainedNeighbourKeepsDeviceSampling) {
  RandomBackend be(2, /*device=*/true);
  worker::StepExecutor ex(&be, 2);
  int loads = 0;
  ex.SetJsonVocabLoader(Loader(&loads));
  worker::Step s;
  s.step_id = 1;
  s.started.push_back(Start(1, 0, {40, 41}, true, 3));
  s.started.push_back(Start(2, 1, {42, 43}, false, 3));
  s.work.push_back(worker::SlotWork{0, 0, 2, true});
  s.work.push_back(worker::SlotWork{1, 0, 2, true});
  worker::StepResult r = ex.Run(s);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.tokens.size(), 2u);
  ASSERT_EQ(be.modes.size(), 2u);
  EXPECT_EQ(be.modes[0], DeviceSampleRow::Mode::kLogits);
  EXPECT_EQ(be.modes[1], DeviceSampleRow::Mode::kSample);
  EXPECT_NE(r.tokens[0].token, kEos);  // the object has not started: EOS is masked
  sampling::JsonGrammar g;
  EXPECT_TRUE(g.Feed(Text({r.tokens[0].token}))) << r.tokens[0].token;
  EXPECT_EQ(r.tokens[1].token, kEos);
  // Without a loader the step fails with the reason, and nothing changed.
  RandomBackend be2(2, false);
  worker::StepExecutor bare(&be2, 2);
  worker::Step t;
  t.step_id = 1;
  t.started.push_back(Start(5, 0, {40}, true, 1));
  t.work.push_back(worker::SlotWork{0, 0, 1, true});
  worker::StepResult e = bare.Run(t);
  EXPECT_NE(e.error.find("json_object"), std::string::npos) << e.error;
  EXPECT_FALSE(bare.active(0));
}

// Failover replay: the uninterrupted run's first k tokens become part of a new start
// (n_generated = k) on a fresh executor and backend; the rest of the tokens are identical.
TEST(StepExecutorJson, ReplayContinuesWithTheSameTokens) {
  size_t longest = 0;
  for (uint64_t seed : {0, 11, 12, 13, 14, 15}) {
    RandomBackend be(1, false);
    worker::StepExecutor ex(&be, 1);
    int loads = 0;
    ex.SetJsonVocabLoader(Loader(&loads));
    const std::vector<int32_t> prompt = {40, 44, 45};
    const std::vector<int32_t> full = RunToEnd(ex, Start(3, 0, prompt, true, seed), 120);
    ASSERT_GE(full.size(), 2u);
    longest = std::max(longest, full.size());
    for (size_t k : {size_t{1}, full.size() / 2, full.size() - 1}) {
      RandomBackend be2(1, false);
      worker::StepExecutor ex2(&be2, 1);
      ex2.SetJsonVocabLoader(Loader(&loads));
      std::vector<int32_t> known = prompt;
      known.insert(known.end(), full.begin(), full.begin() + static_cast<long>(k));
      worker::SequenceStart st = Start(3, 0, known, true, seed);
      st.n_generated = static_cast<uint32_t>(k);
      std::vector<int32_t> rest = RunToEnd(ex2, st, static_cast<int>(full.size() - k));
      std::vector<int32_t> joined(full.begin(), full.begin() + static_cast<long>(k));
      joined.insert(joined.end(), rest.begin(), rest.end());
      EXPECT_EQ(joined, full) << "seed " << seed << ", replay after " << k << " tokens";
    }
  }
  EXPECT_GT(longest, 10u);  // some replays start deep inside the object
}

}  // namespace
}  // namespace ds
