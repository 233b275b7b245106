// The prefix-cache harness of tests/worker/prefix_cache_test.cc (CPU, CI) and
// prefix_cache_gpu_test.cc (CUDA): the scheduler core (prefix tree, checkpoint planning, resumes)
// drives a StepExecutor over a backend and the tiny synth model, step by step as the daemon would
// (plan -> worker::Step -> Run -> StepResults -> Apply).
#pragma once
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/core/scheduler.h"
#include "tests/model/test_util.h"
#include "worker/backend_factory.h"
#include "worker/process/step_executor.h"
#include "worker/runner/checkpoint_store.h"

namespace ds::prefix_test {

using sched::RequestId;

inline std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + salt * 101) % 240 + 5));
  return p;
}

struct Spec {
  sched::Request req;
  float temperature = 0.0f;
  uint64_t seed = 0;
};

struct Outcome {
  std::map<RequestId, std::vector<int32_t>> out;
  sched::PrefixCacheStats cache;
  CheckpointStoreStats store;
  std::map<RequestId, int32_t> resumed_at;  // resume_len of each admission that resumed
};

class Harness {
 public:
  // cache_bytes 0 = no prefix cache.
  // backend: "cpu" (CI) or "cuda" (tests/worker/prefix_cache_gpu_test.cc); the tiny synth model.
  Harness(uint64_t cache_bytes, int n_slots = 2, int32_t max_batch = 96, int32_t max_chunk = 64,
          const std::string& backend = "cpu") {
    BackendOptions bo;
    bo.n_slots = n_slots;
    bo.slot_ctx = 1024;
    bo.n_threads = 2;
    auto be = CreateBackend(backend, testing::TinyModelPath(), bo);
    EXPECT_TRUE(be.ok()) << be.status();
    be_ = std::move(*be);
    ex_ = std::make_unique<worker::StepExecutor>(be_.get(), n_slots);
    if (cache_bytes > 0) {
      store_ = std::make_unique<CheckpointStore>(be_.get(), CheckpointStoreOptions{cache_bytes});
      ex_->SetCheckpointStore(store_.get());
    }
    sched::SchedulerConfig c;
    c.n_slots = n_slots;
    c.max_num_batched_tokens = max_batch;
    c.max_chunk = max_chunk;
    c.context = {sched::ContextPolicy::Kind::kPool, int64_t{n_slots} * 1024, 1024};
    core_ = std::move(sched::Scheduler::Create(c)).value();
    sched::PrefixCacheConfig pc;
    pc.enabled = cache_bytes > 0;
    pc.min_tokens = 8;
    pc.interval = 128;
    pc.wait_gain = 32;
    pc.budget_bytes = cache_bytes;
    core_->SetPrefixCache(pc);
  }

  void Add(const Spec& s) {
    specs_[s.req.id] = s;
    ASSERT_TRUE(core_->Add(s.req).ok());
  }
  // Aborts `id` after the step in which it first computed something.
  void AbortAfterFirstStep(RequestId id) { abort_after_first_ = id; }

  // Runs until every added request finished; returns false on any error.
  bool RunToEnd(Outcome* o) {
    for (int guard = 0; guard < 5000; ++guard) {
      auto plan = core_->Schedule(absl::Now());
      if (!plan.ok()) return false;
      if (plan->empty()) return core_->Idle();
      worker::Step st;
      st.step_id = plan->step_id;
      for (const sched::CheckpointSave& c : plan->saves)
        st.saves.push_back({static_cast<uint32_t>(c.slot), c.id, static_cast<uint32_t>(c.n_past)});
      for (int s : plan->released) st.released.push_back(static_cast<uint32_t>(s));
      for (const sched::SeqStart& s : plan->started) {
        worker::SequenceStart w;
        w.request_id = s.id;
        w.slot = static_cast<uint32_t>(s.slot);
        w.tokens = s.tokens;
        w.sampling.temperature = specs_[s.id].temperature;
        w.sampling.seed = specs_[s.id].seed;
        w.max_new_tokens = static_cast<uint32_t>(s.max_new_tokens);
        w.resume_checkpoint = s.resume_checkpoint;
        w.resume_len = static_cast<uint32_t>(s.resume_len);
        if (s.resume_checkpoint) o->resumed_at[s.id] = s.resume_len;
        st.started.push_back(std::move(w));
      }
      bool abort_now = false;
      for (const sched::PlanEntry& e : plan->entries) {
        st.work.push_back({static_cast<uint32_t>(e.slot), static_cast<uint32_t>(e.pos0),
                           static_cast<uint32_t>(e.tokens.size()), e.sample, e.decode_path,
                           e.checkpoint});
        abort_now |= e.id == abort_after_first_;
      }
      const worker::StepResult r = ex_->Run(st);
      EXPECT_TRUE(r.error.empty()) << r.error;
      if (!r.error.empty()) return false;
      sched::StepResults res;
      res.step_id = r.step_id;
      for (const worker::SampledToken& t : r.tokens) res.tokens.push_back(t.token);
      res.checkpoints_saved.reserve(r.checkpoints_saved.size());
      for (const worker::CheckpointSaved& c : r.checkpoints_saved)
        res.checkpoints_saved.emplace_back(c.id, c.bytes);
      res.checkpoints_evicted = r.checkpoints_evicted;
      res.checkpoints_failed = r.checkpoints_failed;
      auto events = core_->Apply(*plan, res, absl::Now());
      if (!events.ok()) return false;
      for (const sched::Event& e : *events) {
        if (e.kind == sched::Event::Kind::kToken) o->out[e.id].push_back(e.token);
        if (e.kind == sched::Event::Kind::kFinished) finished_[e.id] = true;
      }
      if (abort_now) {
        core_->Abort(abort_after_first_, "test").IgnoreError();
        abort_after_first_ = 0;
      }
    }
    return false;
  }

  void Finish(Outcome* o) {
    o->cache = core_->Status().prefix_cache;
    if (store_) o->store = store_->stats();
  }
  bool finished(RequestId id) const { return finished_.contains(id); }

 private:
  std::unique_ptr<Backend> be_;
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<worker::StepExecutor> ex_;
  std::unique_ptr<sched::Scheduler> core_;
  std::map<RequestId, Spec> specs_;
  std::map<RequestId, bool> finished_;
  RequestId abort_after_first_ = 0;
};

inline Spec Make(RequestId id, std::vector<int32_t> prompt, int max_new, float temp = 0.0f) {
  Spec s;
  s.req.id = id;
  s.req.prompt = std::move(prompt);
  s.req.max_new_tokens = max_new;
  s.req.arrival = absl::Now();
  s.temperature = temp;
  s.seed = 1000 + id;
  return s;
}

// A chat of three turns: each turn's prompt is the previous prompt + its answer + a new message.
inline Outcome Chat(uint64_t cache_bytes, float temp, const std::string& backend = "cpu") {
  Outcome o;
  Harness h(cache_bytes, 2, 96, 64, backend);
  std::vector<int32_t> prompt = Tokens(150, 1);
  for (RequestId turn = 1; turn <= 3; ++turn) {
    h.Add(Make(turn, prompt, 10, temp));
    EXPECT_TRUE(h.RunToEnd(&o));
    prompt.insert(prompt.end(), o.out[turn].begin(), o.out[turn].end());
    const std::vector<int32_t> user = Tokens(20, 10 + static_cast<int>(turn));
    prompt.insert(prompt.end(), user.begin(), user.end());
  }
  h.Finish(&o);
  return o;
}

// Six requests with one 200-token prefix and different suffixes, all queued at once on two
// slots: the first prefills the prefix once and saves it; the others wait for that checkpoint
// and resume exactly at the end of the shared prefix.
inline Outcome Agents(uint64_t cache_bytes, RequestId abort_producer = 0,
                      const std::string& backend = "cpu") {
  Outcome o;
  Harness h(cache_bytes, 2, 96, 64, backend);
  const std::vector<int32_t> prefix = Tokens(200, 3);
  for (RequestId id = 1; id <= 6; ++id) {
    std::vector<int32_t> p = prefix;
    // Suffixes differ from their first token on.
    std::vector<int32_t> suffix = Tokens(10 + 7 * static_cast<int>(id), 20 + static_cast<int>(id));
    suffix[0] = static_cast<int32_t>(245 + id);
    p.insert(p.end(), suffix.begin(), suffix.end());
    h.Add(Make(id, p, 6));
  }
  if (abort_producer) h.AbortAfterFirstStep(abort_producer);
  EXPECT_TRUE(h.RunToEnd(&o));
  for (RequestId id = 1; id <= 6; ++id) EXPECT_TRUE(h.finished(id)) << id;
  h.Finish(&o);
  return o;
}

}  // namespace ds::prefix_test
