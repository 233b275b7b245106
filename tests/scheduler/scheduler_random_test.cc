// Randomized workloads (seeded): invariants after every step, and determinism (same script, same
// plans and events, byte for byte).
#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/scheduler/test_util.h"

namespace ds::sched::testing {
namespace {

struct Tracked {
  int32_t max_new = 0;
  std::vector<int32_t> stop;
  int tokens = 0;  // Token events seen
  bool started = false;
  bool finished = false;
};

// Runs a random script of Add / Abort / Finish / Requeue / SetSlots / SetContextPolicy / steps and
// returns a trace of every plan and event. Checks invariants as it goes.
// `seen` counts what the script exercised (finish reasons, add status codes, in-flight aborts).
// `ahead`: the daemon's lookahead (docs/async_scheduling.md): up to two plans in flight, the second
// from ScheduleAhead(), controls and arrivals between any of them.
// `headroom` > 0: the pool over-commits (ContextPolicy::overcommit_headroom) on a smaller pool, so
// reservations grow and the youngest requests are preempted; the same invariants hold (nothing
// truncated, reservations within the pool, every slot within its reservation).
// `prefix`: the prefix cache is on (issue #17): prompts share prefixes of three "documents" (or
// repeat an earlier prompt), the fake worker keeps checkpoints, checks every resume against them
// and evicts at random; the same invariants hold.
std::string RunScript(uint32_t seed, ContextPolicy::Kind kind, std::map<std::string, int>* seen,
                      bool ahead = false, int32_t headroom = 0, bool prefix = false) {
  std::mt19937 rng(seed);
  auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto pool_policy = [headroom](int64_t n_ctx) {
    ContextPolicy p = Pool(n_ctx, 120);
    p.overcommit_headroom = headroom;
    return p;
  };
  const ContextPolicy policy =
      kind == ContextPolicy::Kind::kPool ? pool_policy(headroom > 0 ? 200 : 400) : Static(480);
  SchedulerConfig cfg = Config(4, 48, 16, policy, /*max_queue=*/12);
  auto s = Make(cfg);
  FakeWorker w;
  std::vector<std::vector<int32_t>> prompts;  // prefix mode: every prompt added, for repeats
  if (prefix) {
    s->SetPrefixCache(PrefixCacheConfig{.enabled = true, .min_tokens = 4, .interval = 24,
                                        .wait_gain = 8, .budget_bytes = 1});
    w.EnableCheckpoints(seed, 6);
  }
  std::map<RequestId, Tracked> reqs;
  std::string trace;
  RequestId next_id = 1;
  int policy_shrinks = 0;
  std::deque<StepPlan> flight;  // issued, not applied (ahead mode)

  for (int step = 0; step < 400; ++step) {
    const absl::Time now = T(step);
    // Arrivals.
    for (int k = rnd(0, 2); k > 0; --k) {
      Request r = Req(next_id++, rnd(1, 70), rnd(1, 40), rnd(0, 2));
      if (prefix) {
        if (!prompts.empty() && rnd(0, 4) == 0) {
          r.prompt = prompts[rnd(0, static_cast<int>(prompts.size()) - 1)];
        } else {
          const int doc = rnd(0, 2), shared = rnd(0, 60);
          std::vector<int32_t> p;
          for (int i = 0; i < shared; ++i) p.push_back(500000 + doc * 1000 + i);
          for (int i = rnd(1, 20); i > 0; --i) p.push_back(static_cast<int32_t>(r.id * 1000 + i));
          r.prompt = std::move(p);
        }
        prompts.push_back(r.prompt);
      }
      if (rnd(0, 3) == 0) r.stop_ids = {FakeToken(r.id, rnd(2, 100))};
      absl::Status st = s->Add(r);
      absl::StrAppend(&trace, "add ", r.id, " ", st.code(), "\n");
      ++(*seen)[absl::StrCat("add ", absl::StatusCodeToString(st.code()))];
      if (st.ok()) reqs[r.id] = {r.max_new_tokens, r.stop_ids};
    }
    // Control actions, some while nothing is in flight, some between Schedule and Apply below.
    auto control = [&] {
      const int a = rnd(0, 30);
      if (a == 0 && !reqs.empty()) {
        RequestId id = std::next(reqs.begin(), rnd(0, static_cast<int>(reqs.size()) - 1))->first;
        if (s->Get(id).ok() && s->Get(id)->in_flight) ++(*seen)["abort in flight"];
        absl::StrAppend(&trace, "abort ", id, " ", s->Abort(id, "test").code(), "\n");
      } else if (a == 1 && !reqs.empty()) {
        RequestId id = std::next(reqs.begin(), rnd(0, static_cast<int>(reqs.size()) - 1))->first;
        if (s->Get(id).ok() && s->Get(id)->in_flight) ++(*seen)["requeue in flight"];
        absl::StrAppend(&trace, "requeue ", id, " ", s->Requeue(id).code(), "\n");
      } else if (a == 2) {
        const int n = rnd(1, 6);
        absl::StrAppend(&trace, "slots ", n, " ", s->SetSlots(n).code(), "\n");
      } else if (a == 3 && kind == ContextPolicy::Kind::kPool) {
        const int n_ctx = rnd(150, 500);
        ++policy_shrinks;
        absl::StrAppend(&trace, "pool ", n_ctx, " ", s->SetContextPolicy(pool_policy(n_ctx)).code(),
                        "\n");
      }
    };
    control();

    absl::StatusOr<StepPlan> plan =
        flight.empty() ? s->Schedule(now)
                       : (flight.size() == 1 ? s->ScheduleAhead(now) : absl::StatusOr<StepPlan>(StepPlan{}));
    if (!plan.ok()) {
      ADD_FAILURE() << plan.status();
      break;
    }
    if (!plan->empty() && !flight.empty()) ++(*seen)["ahead"];
    const SchedulerStatus st = s->Status();
    // Budget, chunking, and slots admissible for new work.
    EXPECT_LE(plan->n_tokens, cfg.max_num_batched_tokens);
    bool seen_multi = false;
    for (const PlanEntry& e : plan->entries) {
      EXPECT_LE(static_cast<int32_t>(e.tokens.size()), cfg.max_chunk);
      EXPECT_LE(e.slot, st.slots.back().slot);
      if (e.reset) {
        EXPECT_LT(e.slot, st.n_slots_target) << "new work on a retiring slot";
      }
      // A decode (running sequence, one token, sampled) never comes after a prefill chunk.
      // (An admission that resumes from a prefix-cache checkpoint is no decode, reset or not.)
      const bool started = std::any_of(plan->started.begin(), plan->started.end(),
                                       [&](const SeqStart& x) { return x.id == e.id; });
      const bool decode = !e.reset && !started && e.tokens.size() == 1 && e.sample;
      if (decode) {
        EXPECT_FALSE(seen_multi) << "decode of " << e.id << " after a prefill chunk";
      }
      if (e.tokens.size() > 1) seen_multi = true;
    }
    if (policy_shrinks == 0) {
      EXPECT_LE(st.pool_reserved, st.pool_total);
    }
    for (const SlotStatus& ss : st.slots) {
      if (ss.busy) {
        EXPECT_LE(ss.ctx_used, ss.ctx_reserved) << "slot " << ss.slot;
      }
    }
    // Every entry stays within its request's reservation (over-commit grows it first).
    for (const PlanEntry& e : plan->entries) {
      auto info = s->Get(e.id);
      if (info.ok() && kind == ContextPolicy::Kind::kPool) {
        EXPECT_LE(e.pos0 + static_cast<int64_t>(e.tokens.size()), info->reserved)
            << "request " << e.id << " outgrows its reservation";
      }
    }
    absl::StrAppend(&trace, "plan ", plan->step_id, ":");
    for (const E& e : Entries(*plan))
      absl::StrAppend(&trace, " ", e.id, "@", e.slot, "/", e.pos0, "+", e.n, e.sample ? "s" : "");
    absl::StrAppend(&trace, "\n");

    std::vector<Event> events;
    if (!plan->empty()) flight.push_back(*plan);
    // Ahead mode: sometimes leave the plan in flight (the next iteration may add the second one).
    if (flight.empty()) {
      events = s->TakeEvents();
    } else if (ahead && flight.size() == 1 && rnd(0, 2) != 0) {
      control();
      events = s->TakeEvents();
    } else {
      control();  // between steps
      StepPlan oldest = flight.front();
      flight.pop_front();
      StepResults res = w.Run(oldest);
      absl::StatusOr<std::vector<Event>> ev = s->Apply(oldest, res, now + absl::Milliseconds(1));
      if (!ev.ok()) {
        ADD_FAILURE() << ev.status();
        break;
      }
      events = std::move(*ev);
    }
    for (const Event& e : events) {
      absl::StrAppend(&trace, Str(e), "\n");
      auto it = reqs.find(e.id);
      if (it == reqs.end()) {
        ADD_FAILURE() << "event for unknown request " << e.id;
        continue;
      }
      Tracked& t = it->second;
      EXPECT_FALSE(t.finished) << "event after Finished: " << Str(e);
      if (e.kind == Event::Kind::kStarted) t.started = true;
      if (e.kind == Event::Kind::kToken) {
        EXPECT_TRUE(t.started);
        ++t.tokens;
      }
      if (e.kind == Event::Kind::kFinished) {
        ++(*seen)[FinishReasonName(e.reason)];
        t.finished = true;
        EXPECT_EQ(e.n_generated, t.tokens);
        EXPECT_LE(e.n_generated, t.max_new);
        // Never truncated: a request that ends on its own ends with all its tokens or a stop id.
        if (e.reason == FinishReason::kLength) {
          EXPECT_EQ(e.n_generated, t.max_new);
        }
        // The only error here: a queued request that a slot-count change made too big to fit.
        if (e.reason == FinishReason::kError) {
          EXPECT_NE(e.detail.find("per-slot context"), std::string::npos) << Str(e);
        }
        reqs.erase(it);
      }
    }
  }
  // Let everything finish: no request is lost or stuck.
  while (!flight.empty()) {
    StepPlan oldest = flight.front();
    flight.pop_front();
    absl::StatusOr<std::vector<Event>> ev = s->Apply(oldest, w.Run(oldest), T(99999));
    EXPECT_TRUE(ev.ok()) << ev.status();
    if (!ev.ok()) break;
    for (const Event& e : *ev) {
      absl::StrAppend(&trace, Str(e), "\n");
      if (e.kind == Event::Kind::kFinished) reqs.erase(e.id);
    }
  }
  s->Drain();
  for (int step = 0; step < 2000 && !s->Idle(); ++step) {
    std::vector<Event> ev;
    Step(*s, w, T(100000 + step), &ev);
    for (const Event& e : ev) {
      absl::StrAppend(&trace, Str(e), "\n");
      if (e.kind == Event::Kind::kFinished) {
        EXPECT_TRUE(e.reason == FinishReason::kLength || e.reason == FinishReason::kStop) << Str(e);
        reqs.erase(e.id);
      }
    }
  }
  EXPECT_TRUE(s->Idle());
  EXPECT_TRUE(reqs.empty()) << reqs.size() << " requests never finished";
  (*seen)["preemptions"] += static_cast<int>(s->Status().preemptions);
  if (prefix) {
    const PrefixCacheStats pc = s->Status().prefix_cache;
    (*seen)["prefix hits"] += static_cast<int>(pc.hits);
    (*seen)["resumes"] += w.resumes();
    (*seen)["evictions"] += w.evictions();
    EXPECT_EQ(static_cast<int>(pc.hits), w.resumes());
    EXPECT_EQ(static_cast<int>(pc.evictions), w.evictions());
  }
  return trace;
}

TEST(SchedulerRandom, InvariantsAndDeterminismPool) {
  std::map<std::string, int> seen, again;
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::string a = RunScript(seed, ContextPolicy::Kind::kPool, &seen);
    const std::string b = RunScript(seed, ContextPolicy::Kind::kPool, &again);
    EXPECT_EQ(a, b) << "seed " << seed;
  }
  EXPECT_EQ(seen, again);
  // The script must have reached every path it claims to test.
  for (const char* k : {"length", "stop", "aborted", "add OK", "add RESOURCE_EXHAUSTED",
                        "abort in flight", "requeue in flight"}) {
    EXPECT_GT(seen[k], 0) << k;
  }
  EXPECT_EQ(seen["error"], 0);  // the pool cap never changes here
}

TEST(SchedulerRandom, InvariantsAndDeterminismStatic) {
  std::map<std::string, int> seen, again;
  for (uint32_t seed : {4u, 5u, 6u}) {
    EXPECT_EQ(RunScript(seed, ContextPolicy::Kind::kStatic, &seen),
              RunScript(seed, ContextPolicy::Kind::kStatic, &again))
        << "seed " << seed;
  }
  for (const char* k : {"length", "aborted", "add OK", "add INVALID_ARGUMENT"}) {
    EXPECT_GT(seen[k], 0) << k;
  }
}

TEST(SchedulerRandom, InvariantsAndDeterminismWithLookahead) {
  std::map<std::string, int> seen, again;
  for (uint32_t seed : {7u, 8u, 9u}) {
    for (ContextPolicy::Kind kind : {ContextPolicy::Kind::kPool, ContextPolicy::Kind::kStatic}) {
      EXPECT_EQ(RunScript(seed, kind, &seen, /*ahead=*/true),
                RunScript(seed, kind, &again, /*ahead=*/true))
          << "seed " << seed;
    }
  }
  EXPECT_EQ(seen, again);
  for (const char* k : {"ahead", "length", "stop", "aborted", "abort in flight", "requeue in flight"}) {
    EXPECT_GT(seen[k], 0) << k;
  }
}

TEST(SchedulerRandom, InvariantsAndDeterminismOvercommit) {
  std::map<std::string, int> seen, again;
  for (uint32_t seed : {10u, 11u, 12u}) {
    for (bool ahead : {false, true}) {
      EXPECT_EQ(RunScript(seed, ContextPolicy::Kind::kPool, &seen, ahead, /*headroom=*/8),
                RunScript(seed, ContextPolicy::Kind::kPool, &again, ahead, /*headroom=*/8))
          << "seed " << seed;
    }
  }
  EXPECT_EQ(seen, again);
  for (const char* k : {"preemptions", "length", "stop", "aborted", "requeue in flight"}) {
    EXPECT_GT(seen[k], 0) << k;
  }
  EXPECT_EQ(seen["error"], 0);
}

TEST(SchedulerRandom, InvariantsAndDeterminismPrefixCache) {
  std::map<std::string, int> seen, again;
  for (uint32_t seed : {13u, 14u, 15u}) {
    for (bool ahead : {false, true}) {
      for (int32_t headroom : {0, 8}) {
        EXPECT_EQ(RunScript(seed, ContextPolicy::Kind::kPool, &seen, ahead, headroom, true),
                  RunScript(seed, ContextPolicy::Kind::kPool, &again, ahead, headroom, true))
            << "seed " << seed;
      }
    }
  }
  EXPECT_EQ(seen, again);
  for (const char* k : {"prefix hits", "evictions", "length", "stop", "aborted",
                        "abort in flight", "requeue in flight", "preemptions"}) {
    EXPECT_GT(seen[k], 0) << k;
  }
  EXPECT_EQ(seen["error"], 0);
}

}  // namespace
}  // namespace ds::sched::testing
