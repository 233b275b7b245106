// The worker's checkpoint store (issue #17) over the CPU backend and the tiny synth model: a checkpoint
// taken mid-generation resumes exactly (the same next tokens, greedy and seeded, as the sequence
// that was checkpointed), LRU eviction under the byte budget never drops a pinned checkpoint, and
// the executor's protocol checks (a resume the store cannot serve is refused before any change).
#include "worker/runner/checkpoint_store.h"

#include <gtest/gtest.h>

#include "tests/model/test_util.h"
#include "worker/backend_factory.h"
#include "worker/process/step_executor.h"

namespace ds {
namespace {

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 53 + salt * 17) % 240 + 5));
  return p;
}

std::unique_ptr<Backend> Demo(int n_slots) {
  BackendOptions bo;
  bo.n_slots = n_slots;
  bo.slot_ctx = 512;
  bo.n_threads = 2;
  auto be = CreateBackend("cpu", testing::TinyModelPath(), bo);
  EXPECT_TRUE(be.ok()) << be.status();
  return be.ok() ? std::move(*be) : nullptr;
}

worker::SequenceStart Start(uint32_t slot, std::vector<int32_t> tokens, float temp, uint64_t seed,
                            uint32_t n_generated = 0) {
  worker::SequenceStart s;
  s.request_id = 100 + slot;
  s.slot = slot;
  s.tokens = std::move(tokens);
  s.sampling.temperature = temp;
  s.sampling.seed = seed;
  s.n_generated = n_generated;
  s.max_new_tokens = 64;
  return s;
}

// Slot 0 prefills a prompt and decodes 20 tokens, saving a checkpoint after decode 8 (the
// state after prompt + 8 generated tokens... up to the 8th fed token). Slot 1 then resumes from
// it with the same known tokens and decodes on: its tokens equal slot 0's from there.
void MidGenerationResume(float temp) {
  auto be = Demo(2);
  ASSERT_NE(be, nullptr);
  CheckpointStore store(be.get(), CheckpointStoreOptions{uint64_t{64} << 20});
  worker::StepExecutor ex(be.get(), 2);
  ex.SetCheckpointStore(&store);
  const std::vector<int32_t> prompt = Prompt(70, 1);
  uint64_t step_id = 1;
  worker::Step st;
  st.step_id = step_id++;
  st.started.push_back(Start(0, prompt, temp, 42));
  st.work.push_back({0, 0, static_cast<uint32_t>(prompt.size()), true, false, 0});
  worker::StepResult r = ex.Run(st);
  ASSERT_TRUE(r.error.empty()) << r.error;
  const uint64_t kCk = 77;
  int32_t ck_len = -1;
  for (int i = 0; i < 20; ++i) {
    worker::Step d;
    d.step_id = step_id++;
    const uint32_t pos = static_cast<uint32_t>(ex.known(0).size() - 1);
    d.work.push_back({0, pos, 1, true, true, i == 8 ? kCk : 0});
    r = ex.Run(d);
    ASSERT_TRUE(r.error.empty()) << r.error;
    if (i == 8) {
      ASSERT_EQ(r.checkpoints_saved.size(), 1u);
      EXPECT_EQ(r.checkpoints_saved[0].id, kCk);
      EXPECT_GT(r.checkpoints_saved[0].bytes, 0u);
      ck_len = static_cast<int32_t>(pos + 1);
    }
  }
  ASSERT_EQ(store.Length(kCk), ck_len);
  const std::vector<int32_t> full = ex.known(0);  // prompt + 21 generated
  // Slot 1: the tokens up to one past the checkpoint, resumed there; it computes the token at
  // ck_len and samples, exactly as slot 0 did in decode 9.
  const std::vector<int32_t> head(full.begin(), full.begin() + ck_len + 1);
  const uint32_t n_gen = static_cast<uint32_t>(head.size() - prompt.size());
  worker::Step s1;
  s1.step_id = step_id++;
  worker::SequenceStart start = Start(1, head, temp, 42, n_gen);
  start.resume_checkpoint = kCk;
  start.resume_len = static_cast<uint32_t>(ck_len);
  s1.started.push_back(start);
  s1.work.push_back({1, static_cast<uint32_t>(ck_len), 1, true, true, 0});
  r = ex.Run(s1);
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(be->SlotLength(1), ck_len + 1);
  while (ex.known(1).size() < full.size()) {
    worker::Step d;
    d.step_id = step_id++;
    d.work.push_back({1, static_cast<uint32_t>(ex.known(1).size() - 1), 1, true, true, 0});
    r = ex.Run(d);
    ASSERT_TRUE(r.error.empty()) << r.error;
  }
  EXPECT_EQ(ex.known(1), full) << "temperature " << temp;
  EXPECT_EQ(store.stats().restores, 1u);
}

TEST(CheckpointStore, MidGenerationCheckpointResumesExactlyGreedy) { MidGenerationResume(0.0f); }
TEST(CheckpointStore, MidGenerationCheckpointResumesExactlySeeded) { MidGenerationResume(0.9f); }

TEST(CheckpointStore, LruEvictionRespectsBudgetAndPins) {
  auto be = Demo(2);
  ASSERT_NE(be, nullptr);
  StepOutput out;
  const std::vector<int32_t> p = Prompt(40, 2);
  ASSERT_TRUE(be->Forward(std::vector<SeqStep>{{0, 0, p}}, {}, &out).ok());
  // The size of one checkpoint of 40 positions, then a budget for two of them.
  CheckpointStore probe(be.get(), CheckpointStoreOptions{uint64_t{1} << 30});
  auto one = probe.Save(1, 0, {}, nullptr);
  ASSERT_TRUE(one.ok()) << one.status();
  CheckpointStore store(be.get(), CheckpointStoreOptions{*one * 2});
  std::vector<uint64_t> evicted;
  ASSERT_TRUE(store.Save(1, 0, {}, &evicted).ok());
  ASSERT_TRUE(store.Save(2, 0, {}, &evicted).ok());
  EXPECT_TRUE(evicted.empty());
  EXPECT_TRUE(absl::IsAlreadyExists(store.Save(2, 0, {}, &evicted).status()));
  ASSERT_TRUE(store.Restore(1, 1).ok());  // 1 is now the most recently used
  ASSERT_TRUE(store.Save(3, 0, {}, &evicted).ok());
  EXPECT_EQ(evicted, std::vector<uint64_t>{2});
  // With 3 pinned, saving 4 evicts 1 (not 3).
  evicted.clear();
  const uint64_t pin[] = {3};
  ASSERT_TRUE(store.Save(4, 0, pin, &evicted).ok());
  EXPECT_EQ(evicted, std::vector<uint64_t>{1});
  EXPECT_LE(store.stats().used_bytes, *one * 2);
  EXPECT_EQ(store.stats().checkpoints, 2);
  EXPECT_EQ(store.stats().evictions, 2u);
  // Both pinned: a fifth does not fit and nothing is dropped.
  evicted.clear();
  const uint64_t both[] = {3, 4};
  EXPECT_TRUE(absl::IsResourceExhausted(store.Save(5, 0, both, &evicted).status()));
  EXPECT_TRUE(evicted.empty());
  EXPECT_TRUE(store.Contains(3) && store.Contains(4) && !store.Contains(5));
  EXPECT_TRUE(absl::IsNotFound(store.Restore(99, 1)));
  // Larger than the whole budget: refused.
  CheckpointStore tiny(be.get(), CheckpointStoreOptions{*one / 2});
  EXPECT_TRUE(absl::IsResourceExhausted(tiny.Save(1, 0, {}, nullptr).status()));
  EXPECT_EQ(tiny.stats().failures, 1u);
}

TEST(CheckpointStore, ExecutorRefusesUnknownResumesAndComputesAFailedOne) {
  auto be = Demo(2);
  ASSERT_NE(be, nullptr);
  worker::StepExecutor ex(be.get(), 2);
  const std::vector<int32_t> p = Prompt(30, 3);
  worker::Step st;
  st.step_id = 1;
  worker::SequenceStart s = Start(0, p, 0.0f, 1);
  s.resume_checkpoint = 5;
  s.resume_len = 10;
  st.started.push_back(s);
  st.work.push_back({0, 10, 20, true, false, 0});
  // No store at all; then a store without that checkpoint: refused before anything changes.
  worker::StepResult r = ex.Run(st);
  EXPECT_NE(r.error.find("prefix cache is off"), std::string::npos) << r.error;
  EXPECT_FALSE(ex.active(0));
  CheckpointStore store(be.get(), CheckpointStoreOptions{uint64_t{16} << 20});
  ex.SetCheckpointStore(&store);
  r = ex.Run(st);
  EXPECT_NE(r.error.find("resumes from checkpoint 5"), std::string::npos) << r.error;
  EXPECT_FALSE(ex.active(0));
  EXPECT_EQ(be->SlotLength(0), 0);
  // The plain run's first token.
  worker::Step plain;
  plain.step_id = 2;
  plain.started.push_back(Start(1, p, 0.0f, 1));
  plain.work.push_back({1, 0, 30, true, false, 0});
  r = ex.Run(plain);
  ASSERT_TRUE(r.error.empty()) << r.error;
  const int32_t want = r.tokens.at(0).token;
  // A resume from a checkpoint this step saves (slot 1 at 31 positions) that the store cannot
  // hold (budget too small): the slot computes the prefix itself and samples the same token as
  // a run with the checkpoint would.
  CheckpointStore tiny(be.get(), CheckpointStoreOptions{1024});
  ex.SetCheckpointStore(&tiny);
  worker::Step both;
  both.step_id = 3;
  both.saves.push_back({1, 9, 30});
  worker::SequenceStart again = Start(0, p, 0.0f, 1);
  again.resume_checkpoint = 9;
  again.resume_len = 29;
  both.saves[0].n_past = 29;  // the length the scheduler expects; slot 1 holds 30: not saved
  both.started.push_back(again);
  both.work.push_back({0, 29, 1, true, false, 0});
  r = ex.Run(both);
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.checkpoints_failed, std::vector<uint64_t>{9});
  ASSERT_EQ(r.tokens.size(), 1u);
  EXPECT_EQ(r.tokens[0].token, want);
  EXPECT_EQ(be->SlotLength(0), 30);
}

}  // namespace
}  // namespace ds
