// Prefix cache under tensor parallelism (issue #17): two ranks (threads, each a CPU backend over
// its shard of the tiny synth model, a StepExecutor and its own CheckpointStore, meeting through
// Gloo) run the same steps as the scheduler would send them. Each rank keeps its shard's
// checkpoints; the ranks agree, so that a resume gives the tokens of a run without the cache —
// also when one rank lost the checkpoint (every rank then computes the prefix) — and a
// checkpoint that one rank could not save exists on no rank and is reported failed.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tests/model/test_util.h"
#include "tests/tp/gloo_ranks.h"
#include "worker/backend_factory.h"
#include "worker/process/step_executor.h"
#include "worker/runner/checkpoint_store.h"

namespace ds {
namespace {

using worker::SequenceStart;
using worker::SlotWork;
using worker::Step;
using worker::StepResult;

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + salt * 101) % 240 + 5));
  return p;
}

// One rank: its backend, executor and store.
struct Rank {
  std::unique_ptr<Backend> be;
  std::unique_ptr<worker::StepExecutor> ex;
  std::unique_ptr<CheckpointStore> store;
};

// A greedy request of `prompt` in `slot`: the prefill (resuming from `resume` at `resume_len`
// when set, saving checkpoint `save_at_end` of the prompt when set), then decodes to `n_new`.
// Returns the generated tokens; every step's result in *results (rank 0's are the scheduler's).
std::vector<int32_t> Request(Rank& r, uint32_t slot, const std::vector<int32_t>& prompt,
                             int n_new, uint64_t resume, uint32_t resume_len,
                             uint64_t save_at_end, std::vector<StepResult>* results,
                             uint64_t* step_id) {
  std::vector<int32_t> out;
  Step st;
  st.step_id = ++*step_id;
  SequenceStart s;
  s.request_id = 1000 + *step_id;
  s.slot = slot;
  s.tokens = prompt;
  s.sampling.temperature = 0.0f;
  s.max_new_tokens = static_cast<uint32_t>(n_new);
  s.resume_checkpoint = resume;
  s.resume_len = resume_len;
  st.started.push_back(s);
  SlotWork w{slot, resume_len, static_cast<uint32_t>(prompt.size()) - resume_len, true, false};
  w.checkpoint = save_at_end;
  st.work.push_back(w);
  uint32_t known = static_cast<uint32_t>(prompt.size());
  for (int i = 0; i < n_new; ++i) {
    const StepResult res = r.ex->Run(st);
    EXPECT_TRUE(res.error.empty()) << res.error;
    results->push_back(res);
    if (!res.error.empty()) break;
    ++known;
    st = Step{};
    st.step_id = ++*step_id;
    st.work.push_back(SlotWork{slot, known - 1, 1, true, false});
  }
  // Every rank's tokens: rank 0 samples, the others append the ids it broadcasts.
  const std::vector<int32_t>& all = r.ex->known(static_cast<int>(slot));
  out.assign(all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), prompt.size())), all.end());
  Step rel;
  rel.step_id = ++*step_id;
  rel.released.push_back(slot);
  results->push_back(r.ex->Run(rel));
  return out;
}

// Runs `body(rank, Rank&)` on two ranks; `budget[r]` is rank r's cache budget.
void TwoRanks(const std::string& name, std::array<uint64_t, 2> budget,
              const std::function<void(int, Rank&)>& body) {
  RunRanks<GlooCollective>(
      2, name, [](int, std::unique_ptr<GlooCollective> g) { return g; },
      [&](int rank, GlooCollective& g) {
        BackendOptions bo;
        bo.n_slots = 2;
        bo.slot_ctx = 512;
        bo.n_threads = 1;
        bo.tp_rank = rank;
        bo.tp_world = 2;
        bo.collective = &g;
        auto be = CreateBackend("cpu", testing::TinyModelPath(), bo);
        ASSERT_TRUE(be.ok()) << be.status();
        Rank r;
        r.be = std::move(*be);
        r.ex = std::make_unique<worker::StepExecutor>(r.be.get(), 2);
        r.ex->SetGroup(&g);
        r.store = std::make_unique<CheckpointStore>(r.be.get(),
                                                    CheckpointStoreOptions{budget[rank], false});
        r.ex->SetCheckpointStore(r.store.get());
        body(rank, r);
      });
}

TEST(PrefixCacheTp, EveryRankResumesItsShardAndTokensEqualNoCache) {
  const std::vector<int32_t> p1 = Tokens(60, 1);
  std::vector<int32_t> p2 = p1;
  const std::vector<int32_t> more = Tokens(20, 2);
  p2.insert(p2.end(), more.begin(), more.end());
  // lose_on_rank1: rank 1 drops the checkpoint before the resume (its store evicted it).
  for (const bool lose_on_rank1 : {false, true}) {
    SCOPED_TRACE(lose_on_rank1 ? "rank 1 lost the checkpoint" : "both ranks hold it");
    std::array<std::vector<int32_t>, 2> resumed, plain;
    std::array<bool, 2> saved{}, held{};
    std::array<uint64_t, 2> restores{};
    TwoRanks("pc_tp_resume", {64u << 20, 64u << 20}, [&](int rank, Rank& r) {
      std::vector<StepResult> res;
      uint64_t id = 0;
      Request(r, 0, p1, 4, 0, 0, /*save_at_end=*/77, &res, &id);
      for (const StepResult& x : res)
        for (const auto& c : x.checkpoints_saved) saved[rank] = saved[rank] || c.id == 77;
      if (lose_on_rank1 && rank == 1) r.store->Drop(77);
      held[rank] = r.store->Contains(77);
      resumed[rank] = Request(r, 1, p2, 6, 77, 60, 0, &res, &id);
      restores[rank] = r.store->stats().restores;
      plain[rank] = Request(r, 0, p2, 6, 0, 0, 0, &res, &id);
    });
    EXPECT_TRUE(saved[0] && saved[1]);
    EXPECT_TRUE(held[0]);
    EXPECT_EQ(held[1], !lose_on_rank1);
    // Rank 0 loaded its shard either way; when rank 1 could not, the agreement undid it.
    EXPECT_EQ(restores[0], 1u);
    EXPECT_EQ(restores[1], lose_on_rank1 ? 0u : 1u);
    ASSERT_EQ(plain[0].size(), 6u);
    EXPECT_EQ(resumed[0], plain[0]);
    EXPECT_EQ(resumed[1], plain[0]);
  EXPECT_EQ(plain[1], plain[0]);
  }
}

TEST(PrefixCacheTp, ACheckpointOneRankCannotSaveExistsOnNone) {
  std::array<bool, 2> saved{}, failed{}, held{};
  // Rank 1's budget is too small for any checkpoint of its shard.
  TwoRanks("pc_tp_fail", {64u << 20, 1024}, [&](int rank, Rank& r) {
    std::vector<StepResult> res;
    uint64_t id = 0;
    Request(r, 0, Tokens(60, 3), 2, 0, 0, /*save_at_end=*/91, &res, &id);
    for (const StepResult& x : res) {
      for (const auto& c : x.checkpoints_saved) saved[rank] = saved[rank] || c.id == 91;
      for (uint64_t f : x.checkpoints_failed) failed[rank] = failed[rank] || f == 91;
    }
    held[rank] = r.store->Contains(91);
  });
  EXPECT_FALSE(saved[0]);
  EXPECT_TRUE(failed[0]);  // what the scheduler hears
  EXPECT_FALSE(held[0]);
  EXPECT_FALSE(held[1]);
}

}  // namespace
}  // namespace ds
