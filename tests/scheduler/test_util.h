// Helpers for the scheduler tests: request builders, a fake worker that enforces the backend
// contract (worker/model/backend.h: pos0 == slot length, distinct slots) and fabricates tokens, and
// a compact form of plan entries for iteration tables.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "scheduler/core/scheduler.h"

namespace ds::sched::testing {

inline absl::Time T(int64_t ms) { return absl::FromUnixMillis(1'700'000'000'000 + ms); }

// Prompt tokens are distinct per request so a misplaced chunk shows up in the fake worker.
inline Request Req(RequestId id, int prompt_len, int max_new, int priority = 0,
                   std::vector<int32_t> stop = {}) {
  Request r;
  r.id = id;
  for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(static_cast<int32_t>(id * 1000 + i));
  r.max_new_tokens = max_new;
  r.priority = priority;
  r.stop_ids = std::move(stop);
  r.arrival = T(0);
  return r;
}

inline ContextPolicy Pool(int64_t n_ctx, int32_t slot_cap) {
  return {ContextPolicy::Kind::kPool, n_ctx, slot_cap};
}
inline ContextPolicy Static(int64_t n_ctx) { return {ContextPolicy::Kind::kStatic, n_ctx, 0}; }

inline SchedulerConfig Config(int n_slots, int32_t budget, int32_t max_chunk, ContextPolicy ctx,
                              int32_t max_queue = 64) {
  SchedulerConfig c;
  c.n_slots = n_slots;
  c.max_num_batched_tokens = budget;
  c.max_chunk = max_chunk;
  c.max_queue = max_queue;
  c.context = ctx;
  return c;
}

inline std::unique_ptr<Scheduler> Make(const SchedulerConfig& c) {
  auto s = Scheduler::Create(c);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

// The token the fake worker samples for request `id` at position `pos`; >= 10 so that stop ids
// below 10 only appear when a test asks for them.
inline int32_t FakeToken(RequestId id, int32_t pos) {
  return static_cast<int32_t>((id * 31 + static_cast<uint64_t>(pos) * 7) % 1000 + 10);
}

// Mirrors what a worker keeps per slot and checks every plan against it. Like the proto worker
// (cluster.proto), it learns a slot's known tokens only from `started` and from what it samples,
// and checks that each entry's tokens are exactly the next known ones.
class FakeWorker {
 public:
  // Prefix cache (issue #17): keep checkpoints (a slot's state tokens at a save), check every
  // resume against them, and drop a random one (not restored by the plan) with probability
  // 1 / evict_one_in per step, reporting it as the worker's store would.
  void EnableCheckpoints(uint32_t seed, int evict_one_in) {
    checkpoints_on_ = true;
    rng_.seed(seed);
    evict_one_in_ = evict_one_in;
  }
  int resumes() const { return resumes_; }
  int evictions() const { return evictions_; }

  StepResults Run(const StepPlan& plan) {
    StepResults r;
    r.step_id = plan.step_id;
    std::set<uint64_t> pinned;
    for (const CheckpointSave& c : plan.saves) {
      EXPECT_TRUE(checkpoints_on_) << "save without a prefix cache";
      EXPECT_EQ(static_cast<int32_t>(state_[c.slot].size()), c.n_past) << "save of slot " << c.slot;
      checkpoints_[c.id] = state_[c.slot];
      r.checkpoints_saved.emplace_back(c.id, 100 + c.n_past);
    }
    for (const SeqStart& st : plan.started)
      if (st.resume_checkpoint) pinned.insert(st.resume_checkpoint);
    for (int slot : plan.released) {
      state_.erase(slot);
      known_.erase(slot);
    }
    for (const SeqStart& st : plan.started) {
      EXPECT_EQ(known_.count(st.slot), 0u) << "slot " << st.slot << " started but not released";
      known_[st.slot] = st.tokens;
      state_[st.slot].clear();
      if (st.resume_checkpoint) {
        auto it = checkpoints_.find(st.resume_checkpoint);
        EXPECT_TRUE(it != checkpoints_.end()) << "resume from a checkpoint the worker lacks";
        if (it == checkpoints_.end()) continue;
        EXPECT_EQ(static_cast<int32_t>(it->second.size()), st.resume_len);
        EXPECT_LT(static_cast<size_t>(st.resume_len), st.tokens.size());
        EXPECT_TRUE(std::equal(it->second.begin(), it->second.end(), st.tokens.begin()))
            << "request " << st.id << " resumes from the state of other tokens";
        state_[st.slot] = it->second;
        ++resumes_;
      }
    }
    std::set<int> seen;
    int32_t n_tokens = 0;
    for (const PlanEntry& e : plan.entries) {
      EXPECT_TRUE(seen.insert(e.slot).second)
          << "slot " << e.slot << " twice in step " << plan.step_id;
      EXPECT_GE(e.tokens.size(), 1u);
      EXPECT_EQ(known_.count(e.slot), 1u) << "slot " << e.slot << " has no sequence";
      std::vector<int32_t>& st = state_[e.slot];
      const std::vector<int32_t>& kn = known_[e.slot];
      // An entry scheduled ahead names its input by position only: the token this worker sampled
      // for the slot in the previous step (what the proto worker does for every SlotWork).
      PlanEntry ahead_entry;
      if (e.ahead) {
        EXPECT_EQ(e.tokens.size(), 1u);
        EXPECT_TRUE(e.sample);
        EXPECT_EQ(static_cast<size_t>(e.pos0) + 1, kn.size()) << "ahead entry of " << e.id;
        if (static_cast<size_t>(e.pos0) < kn.size()) {
          ahead_entry = e;
          ahead_entry.tokens = {kn[e.pos0]};
        }
      }
      const PlanEntry& en = e.ahead ? ahead_entry : e;
      if (e.reset) {
        EXPECT_TRUE(st.empty()) << "reset entry on a slot that was not restarted";
      }
      EXPECT_EQ(e.pos0, static_cast<int32_t>(st.size()))
          << "request " << e.id << " slot " << e.slot << " step " << plan.step_id;
      EXPECT_LE(e.pos0 + en.tokens.size(), kn.size());
      if (e.pos0 + en.tokens.size() <= kn.size()) {
        EXPECT_TRUE(std::equal(en.tokens.begin(), en.tokens.end(), kn.begin() + e.pos0))
            << "request " << e.id << " chunk differs from its known tokens";
        EXPECT_EQ(e.sample, e.pos0 + en.tokens.size() == kn.size());
      }
      st.insert(st.end(), en.tokens.begin(), en.tokens.end());
      n_tokens += static_cast<int32_t>(en.tokens.size());
      if (e.checkpoint) {
        EXPECT_TRUE(checkpoints_on_);
        checkpoints_[e.checkpoint] = st;
        r.checkpoints_saved.emplace_back(e.checkpoint, 100 + st.size());
      }
      if (e.sample) {
        r.tokens.push_back(FakeToken(e.id, static_cast<int32_t>(st.size())));
        known_[e.slot].push_back(r.tokens.back());
      }
    }
    EXPECT_EQ(n_tokens, plan.n_tokens);
    EXPECT_EQ(static_cast<int32_t>(r.tokens.size()), plan.n_sampled);
    if (checkpoints_on_ && !checkpoints_.empty() &&
        std::uniform_int_distribution<int>(1, evict_one_in_)(rng_) == 1) {
      auto it = std::next(checkpoints_.begin(), std::uniform_int_distribution<int>(
                                                    0, static_cast<int>(checkpoints_.size()) - 1)(rng_));
      if (!pinned.contains(it->first)) {
        r.checkpoints_evicted.push_back(it->first);
        checkpoints_.erase(it);
        ++evictions_;
      }
    }
    return r;
  }
  // Tokens the worker knows for a slot (empty when none).
  std::vector<int32_t> known(int slot) const {
    auto it = known_.find(slot);
    return it == known_.end() ? std::vector<int32_t>{} : it->second;
  }

 private:
  std::map<int, std::vector<int32_t>> state_;  // tokens in the slot's state
  std::map<int, std::vector<int32_t>> known_;  // tokens the worker knows for the slot
  bool checkpoints_on_ = false;
  std::map<uint64_t, std::vector<int32_t>> checkpoints_;  // id -> the state's tokens
  std::mt19937 rng_;
  int evict_one_in_ = 8;
  int resumes_ = 0, evictions_ = 0;
};

// Compact plan entry for iteration tables.
struct E {
  RequestId id;
  int slot;
  int32_t pos0;
  int32_t n;
  bool sample;
  bool operator==(const E&) const = default;
};
inline std::ostream& operator<<(std::ostream& os, const E& e) {
  return os << "{id " << e.id << " slot " << e.slot << " pos0 " << e.pos0 << " n " << e.n
            << (e.sample ? " sample}" : "}");
}
inline std::vector<E> Entries(const StepPlan& p) {
  std::vector<E> out;
  for (const PlanEntry& e : p.entries) {
    out.push_back({e.id, e.slot, e.pos0, static_cast<int32_t>(e.tokens.size()), e.sample});
  }
  return out;
}

inline std::string Str(const Event& e) {
  switch (e.kind) {
    case Event::Kind::kStarted:
      return absl::StrCat("start ", e.id, "@", e.slot);
    case Event::Kind::kToken:
      return absl::StrCat("tok ", e.id, ":", e.token);
    case Event::Kind::kFinished:
      return absl::StrCat("fin ", e.id, " ", FinishReasonName(e.reason), " gen ", e.n_generated,
                          e.detail.empty() ? "" : " (" + e.detail + ")");
  }
  return "?";
}

// Finished events among `events`, id -> event.
inline std::map<RequestId, Event> Finished(const std::vector<Event>& events) {
  std::map<RequestId, Event> out;
  for (const Event& e : events) {
    if (e.kind == Event::Kind::kFinished) out[e.id] = e;
  }
  return out;
}

// Drives Schedule -> FakeWorker -> Apply, one step; returns the plan, appends events.
inline StepPlan Step(Scheduler& s, FakeWorker& w, absl::Time now, std::vector<Event>* events) {
  absl::StatusOr<StepPlan> plan = s.Schedule(now);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  if (plan->empty()) {
    std::vector<Event> ev = s.TakeEvents();
    if (events) events->insert(events->end(), ev.begin(), ev.end());
    return *plan;
  }
  absl::StatusOr<std::vector<Event>> ev = s.Apply(*plan, w.Run(*plan), now);
  EXPECT_TRUE(ev.ok()) << ev.status();
  if (ev.ok() && events) events->insert(events->end(), ev->begin(), ev->end());
  return *plan;
}

}  // namespace ds::sched::testing
