#include "scheduler/daemon/scheduler_loop.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/util/status.h"
#include "deltaserve/internal/cluster.pb.h"
#include "proto/convert/sampling_proto.h"

namespace ds::sched {
namespace {

namespace pb = deltaserve::internal;

double SteadySeconds(SteadyClock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}
double Micros(SteadyClock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}
SteadyClock::time_point After(double seconds) {
  return SteadyClock::now() +
         std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds));
}

// A seed for a request that asked for none (0): drawn once here, so every replay of the request
// on another replica continues the same random stream.
uint64_t RandomSeed() {
  std::random_device rd;
  const uint64_t s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return s == 0 ? 1 : s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SchedulerLoop>> SchedulerLoop::Create(const LoopOptions& opts) {
  if (opts.step_timeout_s <= 0) return absl::InvalidArgumentError("step timeout must be > 0");
  if (opts.heartbeat_timeout_s < 0)
    return absl::InvalidArgumentError("heartbeat timeout must be >= 0 (0 = off)");
  DS_ASSIGN_OR_RETURN(auto core, Scheduler::Create(opts.core));
  return std::unique_ptr<SchedulerLoop>(new SchedulerLoop(opts, std::move(core)));
}

SchedulerLoop::SchedulerLoop(const LoopOptions& opts, std::unique_ptr<Scheduler> config_core)
    : opts_(opts), config_core_(std::move(config_core)), last_log_(SteadyClock::now()) {}

SchedulerLoop::~SchedulerLoop() { Stop(); }

void SchedulerLoop::Start() { thread_ = std::thread([this] { Run(); }); }

void SchedulerLoop::Stop() {
  if (!thread_.joinable()) return;
  stopped_.store(true, std::memory_order_release);
  Push(StopCmd{});
  thread_.join();
}

bool SchedulerLoop::serving() const {
  for (const auto& r : replicas_)
    if (r->state == WorkerState::kReady) return true;
  return false;
}

SteadyClock::time_point SchedulerLoop::NextWake() const {
  const auto now = SteadyClock::now();
  auto until = SteadyClock::time_point::max();
  for (const auto& r : replicas_) {
    if (r->busy()) {
      until = std::min(until, r->deadline);
    } else if (r->state == WorkerState::kReady && !r->core->Idle()) {
      // An empty plan with requests present: only queued deadlines can change that without a
      // command, so a coarse timer is enough.
      until = std::min(until, r->last_plan_empty ? now + std::chrono::milliseconds(20) : now);
    }
  }
  if (!held_.empty()) until = std::min(until, hold_until_);
  // At least once a second (the watchdog sees a live loop, ages and gauges stay current); with
  // replicas, often enough to notice a missing heartbeat well within its limit.
  const auto tick = replicas_.empty() || opts_.heartbeat_timeout_s <= 0
                        ? std::chrono::milliseconds(1000)
                        : std::chrono::milliseconds(std::clamp(
                              static_cast<int>(opts_.heartbeat_timeout_s * 100), 10, 1000));
  return std::min(until, now + tick);
}

void SchedulerLoop::Run() {
  std::vector<Command> cmds;
  while (!stop_) {
    commands_.PopAll(&cmds, NextWake());
    if (!cmds.empty())
      for (auto& r : replicas_) r->last_plan_empty = false;
    for (Command& c : cmds) std::visit([this](auto& x) { Handle(x); }, c);
    if (stop_) break;
    if (!held_.empty() && SteadyClock::now() >= hold_until_) {
      std::vector<Request> held = std::move(held_);
      held_.clear();
      for (const Request& q : held)
        FailRequest(q.id,
                    absl::StrCat("worker lost: ", hold_why_, "; no replacement within ",
                                 opts_.failover_wait_s, " s"),
                    /*unavailable=*/true);
    }
    // Lost replicas: no answer in time, or no heartbeat (a hung or stopped process).
    const double now_s = SteadySeconds(SteadyClock::now());
    for (size_t i = 0; i < replicas_.size();) {
      Replica* r = replicas_[i].get();
      const double hb_age = now_s - r->link->last_heartbeat.load();
      if (r->busy() && SteadyClock::now() >= r->deadline) {
        LoseReplica(r, absl::StrCat("no answer within ", opts_.step_timeout_s, " s"));
      } else if (opts_.heartbeat_timeout_s > 0 && hb_age > opts_.heartbeat_timeout_s) {
        LoseReplica(r, absl::StrCat("no heartbeat for ", static_cast<int>(hb_age * 1000), " ms"));
      } else {
        ++i;
      }
    }
    for (size_t i = 0; i < replicas_.size(); ++i) {
      Replica* r = replicas_[i].get();
      if (r->state != WorkerState::kReady) continue;
      if (r->flight.empty()) ScheduleAndSend(r, /*ahead=*/false);
      if (i < replicas_.size() && replicas_[i].get() == r && r->lookahead && r->flight.size() == 1)
        ScheduleAndSend(r, /*ahead=*/true);
    }
    // Events produced outside Apply (aborts of queued requests, expired deadlines).
    for (auto& r : replicas_) Route(r->core->TakeEvents(), nullptr, false);

    if (opts_.log_interval_s > 0 && stats_.steps() > steps_at_last_log_ &&
        SteadyClock::now() - last_log_ >= std::chrono::duration<double>(opts_.log_interval_s)) {
      DS_LOG(INFO, "step_overhead", {{"summary", stats_.Snapshot().ToString()}});
      last_log_ = SteadyClock::now();
      steps_at_last_log_ = stats_.steps();
    }
    if (watchdog_) watchdog_->Beat();
    UpdateMetrics();
  }
  FailAll("scheduler shutting down", /*unavailable=*/true);
  if (stats_.steps() > 0) DS_LOG(INFO, "step_overhead", {{"summary", stats_.Snapshot().ToString()}});
  for (auto& r : replicas_) {
    pb::SchedulerMessage m;
    m.mutable_shutdown();
    r->link->Send(m);
  }
}

// ---- placement ----

SchedulerLoop::Replica* SchedulerLoop::FindReplica(const WorkerLink* link) {
  for (auto& r : replicas_)
    if (r->link.get() == link) return r.get();
  return nullptr;
}

SchedulerLoop::Replica* SchedulerLoop::FindReplica(int id) {
  for (auto& r : replicas_)
    if (r->id == id) return r.get();
  return nullptr;
}

std::vector<SchedulerLoop::Replica*> SchedulerLoop::ReadyByFreeCapacity() {
  struct Ranked {
    Replica* r;
    int free, load;
  };
  std::vector<Ranked> ranked;
  for (auto& r : replicas_) {
    if (r->state != WorkerState::kReady) continue;
    const SchedulerStatus st = r->core->Status();
    ranked.push_back({r.get(), st.n_slots_target - st.running - st.queued, st.running + st.queued});
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    return a.free != b.free ? a.free > b.free : a.load < b.load;
  });
  std::vector<Replica*> order;
  for (const Ranked& x : ranked) order.push_back(x.r);
  return order;
}

SchedulerLoop::Replica* SchedulerLoop::PlaceNew(std::span<const int32_t> prompt) {
  const std::vector<Replica*> order = ReadyByFreeCapacity();
  if (order.empty()) return nullptr;
  // Prefix cache: the replica holding the longest cached prefix of the prompt, when it has a
  // free slot (load allows); otherwise the one with the most free capacity.
  Replica* best = order.front();
  int32_t best_len = order.front()->core->CachedPrefix(prompt);
  for (Replica* r : order) {
    const int32_t len = r->core->CachedPrefix(prompt);
    if (len <= best_len) continue;
    const SchedulerStatus st = r->core->Status();
    if (st.n_slots_target - st.running - st.queued <= 0) continue;
    best = r;
    best_len = len;
  }
  return best;
}

// ---- commands ----

void SchedulerLoop::Handle(AddCmd& c) {
  auto reject = [&](absl::Status s) {
    RequestEventItem item;
    item.reject = std::move(s);
    c.side.channel->Push(std::move(item));
  };
  Replica* r = PlaceNew(c.request.prompt);
  if (!r) return reject(absl::UnavailableError("no worker is ready (cluster not serving)"));
  const int n_vocab = r->info.n_vocab;
  for (size_t i = 0; i < c.request.prompt.size(); ++i)
    if (c.request.prompt[i] >= n_vocab)
      return reject(absl::InvalidArgumentError(absl::StrCat("prompt token id ", c.request.prompt[i],
                                                            " at index ", i,
                                                            " is outside the vocabulary (",
                                                            n_vocab, ")")));
  const RequestId id = c.request.id;
  if (side_.contains(id))
    return reject(absl::AlreadyExistsError(absl::StrCat("request ", id, " is already active")));
  const int n_prompt = static_cast<int>(c.request.prompt.size());
  if (absl::Status s = r->core->Add(std::move(c.request)); !s.ok()) return reject(s);
  if (c.side.sampling.seed == 0) c.side.sampling.seed = RandomSeed();
  c.side.replica = r->id;
  c.side.n_prompt = n_prompt;
  side_[id] = std::move(c.side);
}

void SchedulerLoop::Handle(AbortCmd& c) {
  auto it = side_.find(c.id);
  if (it == side_.end()) return;  // it finished meanwhile
  if (Replica* r = FindReplica(it->second.replica)) {
    r->core->Abort(c.id, c.why).IgnoreError();
    return;
  }
  // Held for a replica: it never reaches one.
  held_.erase(std::remove_if(held_.begin(), held_.end(),
                             [&](const Request& q) { return q.id == c.id; }),
              held_.end());
  FinishOutsideCore(c.id, FinishReason::kAborted, c.why, /*unavailable=*/false);
}

void SchedulerLoop::Handle(FinishCmd& c) {
  auto it = side_.find(c.id);
  Replica* r = it == side_.end() ? nullptr : FindReplica(it->second.replica);
  if (!r) {
    c.done->set_value(absl::NotFoundError(absl::StrCat("request ", c.id, " is not running")));
    return;
  }
  c.done->set_value(r->core->Finish(c.id, c.reason, c.detail));
}

int64_t SchedulerLoop::PerSlotCapFor(int n_slots, const ContextPolicy& p) const {
  if (p.kind == ContextPolicy::Kind::kStatic) return p.n_ctx / std::max(1, n_slots);
  return p.slot_cap > 0 ? std::min<int64_t>(p.slot_cap, p.n_ctx) : p.n_ctx;
}

ContextPolicy SchedulerLoop::BoundByPool(const Replica& r, ContextPolicy p) const {
  const int64_t tokens = r.warmup.kv_pool_tokens, page = std::max(1, r.warmup.kv_page_size);
  if (tokens <= 0) return p;
  const int64_t usable = std::max<int64_t>(page, tokens - static_cast<int64_t>(r.slots) * (page - 1));
  p.n_ctx = std::min(p.n_ctx, usable);
  if (p.slot_cap > p.n_ctx) p.slot_cap = static_cast<int32_t>(p.n_ctx);
  return p;
}

absl::Status SchedulerLoop::ForEachCore(const std::function<absl::Status(Scheduler&)>& f) {
  DS_RETURN_IF_ERROR(f(*config_core_));
  absl::Status first;
  for (auto& r : replicas_) {
    absl::Status s = f(*r->core);
    if (first.ok()) first = s;
  }
  return first;
}

void SchedulerLoop::ApplyTemplate(Scheduler* core) const {
  const SchedulerStatus t = config_core_->Status();
  core->SetSlots(t.n_slots_target).IgnoreError();
  core->SetContextPolicy(t.policy).IgnoreError();
  if (t.draining) core->Drain();
}

void SchedulerLoop::Handle(AdminCmd& c) {
  absl::Status s;
  const SchedulerStatus st = config_core_->Status();
  // Slots are the scheduler's concept (per replica); each worker's backend was configured once
  // with its `slots` (--max-slots) of `slot_ctx` positions, which bound them.
  int bound = opts_.max_slots, slot_ctx_bound = 0;
  for (const auto& r : replicas_) {
    bound = bound > 0 ? std::min(bound, r->slots) : r->slots;
    slot_ctx_bound = slot_ctx_bound > 0 ? std::min(slot_ctx_bound, r->slot_ctx) : r->slot_ctx;
  }
  switch (c.op) {
    case AdminCmd::Op::kStatus:
      break;
    case AdminCmd::Op::kSetSlots:
      if (c.n_slots < 1) {
        s = absl::InvalidArgumentError("slots must be >= 1");
      } else if (bound > 0 && c.n_slots > bound) {
        s = absl::OutOfRangeError(absl::StrCat("slots ", c.n_slots, " exceeds the worker's ", bound,
                                               " configured slots (scheduler --max-slots)"));
      } else if (slot_ctx_bound > 0 && PerSlotCapFor(c.n_slots, st.policy) > slot_ctx_bound) {
        s = absl::OutOfRangeError(absl::StrCat("slots ", c.n_slots, " would give each slot ",
                                               PerSlotCapFor(c.n_slots, st.policy),
                                               " positions, more than the worker's slot_ctx ",
                                               slot_ctx_bound, " (scheduler --slot-ctx)"));
      } else {
        s = ForEachCore([&](Scheduler& core) { return core.SetSlots(c.n_slots); });
      }
      break;
    case AdminCmd::Op::kSetPolicy:
      if (slot_ctx_bound > 0 && PerSlotCapFor(st.n_slots_target, c.policy) > slot_ctx_bound) {
        s = absl::OutOfRangeError(absl::StrCat(
            "the policy gives a slot up to ", PerSlotCapFor(st.n_slots_target, c.policy),
            " positions, more than the worker's slot_ctx ", slot_ctx_bound,
            " (scheduler --slot-ctx)"));
      } else {
        // Each replica admits within its own KV pool.
        s = config_core_->SetContextPolicy(c.policy);
        for (auto& r : replicas_) {
          absl::Status rs = r->core->SetContextPolicy(BoundByPool(*r, c.policy));
          if (s.ok()) s = rs;
        }
      }
      break;
    case AdminCmd::Op::kDrain:
      ForEachCore([](Scheduler& core) {
        core.Drain();
        return absl::OkStatus();
      }).IgnoreError();
      break;
    case AdminCmd::Op::kResume:
      ForEachCore([](Scheduler& core) {
        core.Resume();
        return absl::OkStatus();
      }).IgnoreError();
      break;
    case AdminCmd::Op::kStatsReset: {
      ClusterSnapshot snap = Snapshot();
      stats_.Reset();
      steps_at_last_log_ = 0;
      c.done->set_value(std::move(snap));
      return;
    }
  }
  if (!s.ok()) {
    c.done->set_value(s);
  } else {
    c.done->set_value(Snapshot());
  }
}

void SchedulerLoop::Handle(WorkerJoinCmd& c) {
  // Every replica serves the same model: a worker with another one is refused.
  for (const auto& r : replicas_) {
    if (r->info.model_fingerprint != c.info.model_fingerprint || r->info.n_vocab != c.info.n_vocab) {
      const absl::Status why = absl::FailedPreconditionError(absl::StrCat(
          "worker ", c.info.id, " serves model ", c.info.model_fingerprint, " but replica ",
          r->id, " (", r->info.id, ") serves ", r->info.model_fingerprint));
      DS_LOG(WARNING, "worker_refused", {{"worker", c.info.id}, {"reason", std::string(why.message())}});
      c.link->Close(why);
      return;
    }
  }
  const SchedulerStatus st = config_core_->Status();
  // Auto (--max-slots 0): the device's default, but never fewer than --slots asks for, so
  // `--slots 16` on a CPU worker runs 16 slots instead of quietly 8.
  const int slots =
      opts_.max_slots > 0
          ? opts_.max_slots
          : std::max(st.n_slots_target, c.info.device.rfind("cuda", 0) == 0 ? 64 : 8);
  const int64_t cap = PerSlotCapFor(st.n_slots_target, st.policy);
  const int64_t slot_ctx = opts_.slot_ctx > 0 ? opts_.slot_ctx : st.policy.n_ctx;
  if (slot_ctx < cap) {
    const absl::Status why = absl::FailedPreconditionError(
        absl::StrCat("--slot-ctx ", slot_ctx, " is below the per-slot cap ", cap));
    DS_LOG(ERROR, "worker_refused", {{"worker", c.info.id}, {"reason", std::string(why.message())}});
    c.link->Close(why);
    return;
  }
  auto core = Scheduler::Create(opts_.core);
  if (!core.ok()) {
    c.link->Close(core.status());
    return;
  }
  // The prefix cache waits for the worker's warmup: it says whether it keeps checkpoints.
  (*core)->SetPrefixCache(PrefixCacheConfig{.enabled = false});
  auto r = std::make_unique<Replica>();
  r->id = next_replica_id_++;
  r->core = std::move(*core);
  ApplyTemplate(r->core.get());
  r->link = c.link;
  r->info = c.info;
  r->lookahead = opts_.lookahead;
  r->slots = slots;
  r->slot_ctx = static_cast<int>(slot_ctx);
  if (st.n_slots_target > slots) {
    DS_LOG(INFO, "slots_reduced", {{"replica", r->id}, {"from", st.n_slots_target}, {"to", slots},
                                   {"reason", "the worker's slot count"}});
    r->core->SetSlots(slots).IgnoreError();
  }
  r->state = WorkerState::kWarming;
  r->deadline = After(opts_.step_timeout_s);
  // The heartbeat clock starts at the join (the first heartbeat comes within a second).
  double zero = 0;
  r->link->last_heartbeat.compare_exchange_strong(zero, SteadySeconds(SteadyClock::now()));
  DS_LOG(INFO, "worker_registered",
         {{"worker", c.info.id}, {"replica", r->id}, {"device", c.info.device},
          {"model", c.info.model_fingerprint}, {"vocab", c.info.n_vocab}, {"slots", slots},
          {"slot_ctx", slot_ctx}});
  pb::SchedulerMessage cf;
  cf.mutable_configure()->set_n_slots(static_cast<uint32_t>(slots));
  cf.mutable_configure()->set_slot_ctx(static_cast<uint32_t>(slot_ctx));
  pb::SchedulerMessage wu;
  wu.mutable_warmup()->set_tokens(static_cast<uint32_t>(opts_.warmup_tokens));
  Replica* added = r.get();
  replicas_.push_back(std::move(r));
  if (!added->link->Send(cf) || !added->link->Send(wu))
    LoseReplica(added, "stream closed during configure");
}

void SchedulerLoop::Handle(WorkerWarmupCmd& c) {
  Replica* r = FindReplica(c.link.get());
  if (!r || r->state != WorkerState::kWarming) return;
  r->warmup = c.info;
  r->state = WorkerState::kReady;
  // MTP: decodes count their drafts in the budget and may answer with several tokens; a step
  // sent ahead then follows the answer in flight, which a worker must know how to continue.
  r->core->SetMtpDrafts(c.info.mtp_drafts);
  if (r->lookahead && c.info.mtp_drafts > 0 && !c.info.follows_work) {
    r->lookahead = false;
    DS_LOG(INFO, "lookahead_off", {{"replica", r->id},
                                   {"reason", "MTP worker without follows_work (older build)"}});
  }
  // Prefix cache: only where the worker keeps checkpoints (and the scheduler allows it).
  PrefixCacheConfig pc = opts_.core.prefix_cache;
  pc.enabled = pc.enabled && c.info.prefix_cache_bytes > 0;
  pc.budget_bytes = c.info.prefix_cache_bytes;
  r->core->SetPrefixCache(pc);
  DS_LOG(INFO, "prefix_cache", {{"replica", r->id}, {"enabled", pc.enabled},
                                {"worker_budget_bytes", c.info.prefix_cache_bytes},
                                {"tier", c.info.prefix_cache_tier},
                                {"scheduler", opts_.core.prefix_cache.enabled ? "on" : "off"}});
  // State for fewer sequences than slots (worker --max-active): never run more than that.
  if (c.info.active_slots > 0 && c.info.active_slots < r->slots) {
    DS_LOG(INFO, "slots_reduced", {{"replica", r->id}, {"from", r->slots},
                                   {"to", c.info.active_slots},
                                   {"reason", "the worker's active sequences (--max-active)"}});
    r->slots = c.info.active_slots;
    if (r->core->Status().n_slots_target > r->slots) r->core->SetSlots(r->slots).IgnoreError();
  }
  if (c.info.kv_pool_tokens > 0) {
    // Admit against the KV pool the worker actually holds.
    const ContextPolicy want = config_core_->Status().policy, got = BoundByPool(*r, want);
    if (got.n_ctx < want.n_ctx) r->core->SetContextPolicy(got).IgnoreError();
    DS_LOG(INFO, "kv_pool", {{"replica", r->id}, {"pool_tokens", c.info.kv_pool_tokens},
                             {"page", c.info.kv_page_size}, {"policy_n_ctx", want.n_ctx},
                             {"admits_n_ctx", got.n_ctx}});
  }
  n_vocab_.store(r->info.n_vocab, std::memory_order_release);
  DS_LOG(INFO, "worker_ready",
         {{"worker", r->info.id}, {"replica", r->id}, {"prefill_tokens_per_s", c.info.prefill_tps},
          {"decode_tokens_per_s", c.info.decode_tps}, {"serving", true}});
  // Requests of a lost replica waiting for one continue here (and on any other ready one).
  std::vector<Request> held = std::move(held_);
  held_.clear();
  for (Request& q : held) {
    const RequestId id = q.id;
    if (!Replay(std::move(q)))
      FailRequest(id, absl::StrCat("worker lost: ", hold_why_, "; no replica could take it"), true);
  }
}

void SchedulerLoop::Handle(WorkerStepCmd& c) {
  const auto t_recv = SteadyClock::now();
  Replica* rep = FindReplica(c.link.get());
  if (!rep || rep->flight.empty()) return;  // a stale answer of a lost worker
  const WorkerStepResult& wr = c.result;
  const StepPlan& plan = rep->flight.front().plan;
  if (wr.step_id != plan.step_id)
    return LoseReplica(rep, absl::StrCat("protocol error: result for step ", wr.step_id,
                                         ", expected ", plan.step_id));
  StepResults r;
  r.step_id = wr.step_id;
  r.forward_seconds = wr.forward_seconds;
  r.checkpoints_saved = wr.checkpoints_saved;
  r.checkpoints_evicted = wr.checkpoints_evicted;
  r.checkpoints_failed = wr.checkpoints_failed;
  absl::flat_hash_map<RequestId, TokenLogprobInfo> lps;
  if (!wr.error.empty()) {
    r.status = absl::InternalError("worker step failed: " + wr.error);
  } else {
    // The worker answers per slot (with MTP, a slot's kept drafts and its own token, in
    // order); the core wants plan order of the sampled entries, and a count per entry.
    absl::flat_hash_map<int, std::vector<const WorkerSampled*>> by_slot;
    for (const WorkerSampled& t : wr.tokens) by_slot[t.slot].push_back(&t);
    for (const PlanEntry& e : plan.entries) {
      if (!e.sample) continue;
      auto it = by_slot.find(e.slot);
      if (it == by_slot.end()) {
        r.status = absl::InternalError(absl::StrCat("worker returned no token for slot ", e.slot));
        r.tokens.clear();
        r.counts.clear();
        break;
      }
      for (const WorkerSampled* t : it->second) r.tokens.push_back(t->token);
      r.counts.push_back(static_cast<int32_t>(it->second.size()));
      if (it->second.back()->logprob) lps[e.id] = *it->second.back()->logprob;
    }
    // In work order of the sampled entries, which is plan order (the core checks the counts).
    if (r.status.ok()) r.drafts_offered.assign(wr.drafts_offered.begin(), wr.drafts_offered.end());
  }
  auto events = rep->core->Apply(plan, r, absl::Now());
  if (!events.ok())
    return LoseReplica(rep, "cannot apply the step result: " + events.status().ToString());
  InFlight done = std::move(rep->flight.front());
  rep->flight.pop_front();
  // The next plan (sent ahead) is what the worker computes now.
  if (!rep->flight.empty()) rep->deadline = After(opts_.step_timeout_s);
  StepTiming t;
  t.n_tokens = done.plan.n_tokens;
  t.n_seqs = static_cast<int>(done.plan.entries.size());
  Route(std::move(*events), &lps, false);
  const auto t_end = SteadyClock::now();
  // A step sent ahead starts, for the worker, when the previous answer left it: its interval is
  // measured from the previous answer here, and its scheduling (done during the previous step)
  // is off the critical path.
  const bool ahead = done.sent < rep->last_result;
  t.ahead = ahead;
  t.total_us = Micros(t_end - (ahead ? rep->last_result : done.t0));
  t.worker_us = (wr.forward_seconds + wr.sample_seconds) * 1e6;
  t.worker_handle_us = std::max(t.worker_us, wr.handle_seconds * 1e6);
  t.schedule_us = ahead ? 0 : Micros(done.sent - done.t0);
  t.apply_us = Micros(t_end - t_recv);
  rep->last_result = t_recv;
  stats_.Record(t);
  if (metrics_)
    metrics_->OnStep(t.total_us * 1e-6, t.n_tokens, t.n_seqs, t.worker_us * 1e-6, t.ahead);
}

void SchedulerLoop::Handle(WorkerGoneCmd& c) {
  if (Replica* r = FindReplica(c.link.get())) LoseReplica(r, c.why);
}

void SchedulerLoop::Handle(StopCmd&) { stop_ = true; }

// ---- steps ----

void SchedulerLoop::ScheduleAndSend(Replica* r, bool ahead) {
  const auto t0 = SteadyClock::now();
  const uint64_t preempted_before = r->core->preemptions();
  auto plan = ahead ? r->core->ScheduleAhead(absl::Now()) : r->core->Schedule(absl::Now());
  if (r->core->preemptions() != preempted_before)
    DS_LOG(INFO, "preempted", {{"replica", r->id},
                               {"requests", r->core->preemptions() - preempted_before},
                               {"total", r->core->preemptions()}});
  if (!plan.ok()) {
    DS_LOG(ERROR, ahead ? "schedule_ahead_failed" : "schedule_failed", {{"error", plan.status()}});
    return;
  }
  if (plan->empty()) {
    if (!ahead) r->last_plan_empty = true;
    return;
  }
  // Full data for sequences bound by this plan, diffs (slot, pos0, n) for everything else. A plan
  // sent ahead holds only such diffs: one token each, the one the worker samples in the step
  // before (docs/async_scheduling.md).
  pb::SchedulerMessage msg;
  pb::Step* step = msg.mutable_step();
  step->set_step_id(plan->step_id);
  for (int s : plan->released) step->add_released(static_cast<uint32_t>(s));
  for (const CheckpointSave& c : plan->saves) {
    pb::CheckpointSave* q = step->add_saves();
    q->set_slot(static_cast<uint32_t>(c.slot));
    q->set_id(c.id);
    q->set_n_past(static_cast<uint32_t>(c.n_past));
  }
  for (const SeqStart& st : plan->started) {
    pb::SequenceStart* q = step->add_started();
    q->set_request_id(st.id);
    q->set_resume_checkpoint(st.resume_checkpoint);
    q->set_resume_len(static_cast<uint32_t>(std::max(0, st.resume_len)));
    q->set_slot(static_cast<uint32_t>(st.slot));
    q->mutable_tokens()->Add(st.tokens.begin(), st.tokens.end());
    q->set_max_new_tokens(static_cast<uint32_t>(std::max(0, st.max_new_tokens)));
    auto it = side_.find(st.id);
    if (it != side_.end()) {
      *q->mutable_sampling() = sampling::ToProto(it->second.sampling);
      q->set_logprobs(static_cast<uint32_t>(it->second.logprobs));
      // A replay: the tokens after the prompt were sampled already (the worker's sampler keys
      // its draws by position, so seeded sampling continues where it was).
      q->set_n_generated(static_cast<uint32_t>(
          std::max<int64_t>(0, static_cast<int64_t>(st.tokens.size()) - it->second.n_prompt)));
    }
  }
  for (const PlanEntry& e : plan->entries) {
    pb::SlotWork* w = step->add_work();
    w->set_slot(static_cast<uint32_t>(e.slot));
    w->set_pos0(static_cast<uint32_t>(e.pos0));
    w->set_n_tokens(static_cast<uint32_t>(e.tokens.size()));
    w->set_sample(e.sample);
    w->set_decode_path(e.decode_path);
    w->set_checkpoint(e.checkpoint);
    w->set_follows(e.follows);
  }
  r->flight.push_back({std::move(*plan), t0, {}});
  // A plan sent ahead waits behind the one in flight: the timer of the oldest one runs.
  if (r->flight.size() == 1) r->deadline = After(opts_.step_timeout_s);
  if (!r->link->Send(msg)) return LoseReplica(r, "stream closed while sending a step");
  r->flight.back().sent = SteadyClock::now();
}

void SchedulerLoop::Route(std::vector<Event> events,
                          const absl::flat_hash_map<RequestId, TokenLogprobInfo>* lps,
                          bool unavailable) {
  for (Event& e : events) {
    auto it = side_.find(e.id);
    if (it == side_.end()) continue;
    RequestEventItem item;
    item.unavailable = unavailable;
    if (e.kind == Event::Kind::kToken && lps) {
      auto lp = lps->find(e.id);
      if (lp != lps->end()) item.logprob = lp->second;
    }
    if (e.kind == Event::Kind::kStarted) {
      if (it->second.admitted) continue;  // re-admitted for a replay: the client knows already
      it->second.admitted = true;
    }
    std::shared_ptr<EventChannel> ch = it->second.channel;
    if (e.kind == Event::Kind::kFinished) side_.erase(it);
    item.event = std::move(e);
    ch->Push(std::move(item));
  }
}

void SchedulerLoop::FailInFlightPlan(Replica* r, const std::string& why, bool unavailable) {
  // Oldest first, as the core applies them.
  while (!r->flight.empty()) {
    StepResults res;
    res.step_id = r->flight.front().plan.step_id;
    res.status = absl::UnavailableError(why);
    auto events = r->core->Apply(r->flight.front().plan, res, absl::Now());
    r->flight.pop_front();
    if (events.ok()) Route(std::move(*events), nullptr, unavailable);
  }
}

void SchedulerLoop::FinishOutsideCore(RequestId id, FinishReason reason, const std::string& why,
                                      bool unavailable) {
  auto it = side_.find(id);
  if (it == side_.end()) return;
  RequestEventItem item;
  item.unavailable = unavailable;
  item.event.kind = Event::Kind::kFinished;
  item.event.id = id;
  item.event.reason = reason;
  item.event.detail = why;
  it->second.channel->Push(std::move(item));
  side_.erase(it);
}

void SchedulerLoop::FailRequest(RequestId id, const std::string& why, bool unavailable) {
  FinishOutsideCore(id, FinishReason::kError, why, unavailable);
}

void SchedulerLoop::FailAll(const std::string& why, bool unavailable) {
  for (auto& r : replicas_) {
    FailInFlightPlan(r.get(), why, unavailable);
    std::vector<RequestId> ids;
    for (const auto& [id, side] : side_)
      if (side.replica == r->id) ids.push_back(id);
    for (RequestId id : ids) r->core->Finish(id, FinishReason::kError, why).IgnoreError();
    Route(r->core->TakeEvents(), nullptr, unavailable);
  }
  held_.clear();
  // Held requests, and anything a core no longer knew.
  std::vector<RequestId> rest;
  for (const auto& [id, side] : side_) rest.push_back(id);
  for (RequestId id : rest) FailRequest(id, why, unavailable);
}

bool SchedulerLoop::Replay(Request req) {
  const RequestId id = req.id;
  // The ready replica with the most free capacity; a full queue there tries the next.
  for (Replica* r : ReadyByFreeCapacity()) {
    if (!r->core->Add(req).ok()) continue;
    side_[id].replica = r->id;
    return true;
  }
  return false;
}

void SchedulerLoop::LoseReplica(Replica* r, const std::string& why) {
  std::vector<RequestId> ids;
  for (const auto& [id, side] : side_)
    if (side.replica == r->id) ids.push_back(id);
  DS_LOG(ERROR, "worker_lost", {{"worker", r->info.id}, {"replica", r->id}, {"reason", why},
                                {"requests", ids.size()}});
  // Each request leaves the lost core with what it generated so far (the tokens of its steps
  // that were applied: those the client has; an unanswered step's are recomputed).
  std::vector<Request> moving;
  for (RequestId id : ids) {
    auto q = r->core->ExportForReplay(id);
    if (q.ok()) {
      moving.push_back(std::move(*q));
    } else {
      FailRequest(id, "worker lost: " + why, /*unavailable=*/true);
    }
  }
  r->link->Close(absl::UnavailableError("worker lost: " + why));
  worker_heartbeats_.erase(r->info.id);
  if (metrics_) metrics_->SetWorker(r->info.id, false, 0);
  replicas_.erase(std::remove_if(replicas_.begin(), replicas_.end(),
                                 [r](const std::unique_ptr<Replica>& x) { return x.get() == r; }),
                  replicas_.end());
  if (!serving()) n_vocab_.store(0, std::memory_order_release);
  int replayed = 0, held = 0;
  for (Request& q : moving) {
    const RequestId id = q.id;
    side_[id].replica = -1;
    if (Replay(q)) {
      ++replayed;
    } else if (opts_.failover_wait_s > 0) {
      if (held_.empty()) {
        hold_until_ = After(opts_.failover_wait_s);
        hold_why_ = why;
      }
      held_.push_back(std::move(q));
      ++held;
    } else {
      FailRequest(id, "worker lost: " + why, /*unavailable=*/true);
    }
  }
  if (replayed > 0)
    DS_LOG(WARNING, "requests_replayed", {{"requests", replayed}, {"reason", why}});
  if (held > 0)
    DS_LOG(WARNING, "holding_for_replacement",
           {{"requests", held}, {"failover_wait_s", opts_.failover_wait_s}, {"reason", why}});
  if (const int failed = static_cast<int>(moving.size()) - replayed - held; failed > 0)
    DS_LOG(ERROR, "requests_failed", {{"requests", failed}, {"reason", why}});
}

// ---- status ----

ClusterSnapshot SchedulerLoop::Snapshot(bool with_step_stats) const {
  ClusterSnapshot s;
  s.core = config_core_->Status();  // target slots, policy, drain flag; no requests of its own
  s.core.slots.clear();
  if (!replicas_.empty()) s.core.pool_total = 0;  // the replicas' pools, summed below
  s.serving = serving();
  const double now_s = SteadySeconds(SteadyClock::now());
  int first_slot = 0;
  for (const auto& r : replicas_) {
    ReplicaSnapshot x;
    x.id = r->id;
    x.worker = r->info;
    x.warmup = r->warmup;
    x.ready = r->state == WorkerState::kReady;
    const double hb = r->link->last_heartbeat.load();
    x.heartbeat_age_s = hb > 0 ? now_s - hb : -1;
    x.worker_slots = r->slots;
    x.worker_slot_ctx = r->slot_ctx;
    x.core = r->core->Status();
    // The cluster's slots: every replica's, numbered one after the other.
    for (SlotStatus sl : x.core.slots) {
      sl.slot += first_slot;
      s.core.slots.push_back(sl);
    }
    first_slot += static_cast<int>(x.core.slots.size());
    s.core.queued += x.core.queued;
    s.core.running += x.core.running;
    s.core.pool_reserved += x.core.pool_reserved;
    s.core.pool_used += x.core.pool_used;
    s.core.pool_total += x.core.pool_total;
    s.replicas.push_back(std::move(x));
  }
  s.held = static_cast<int>(held_.size());
  s.core.queued += s.held;
  s.max_queue = opts_.core.max_queue;
  // Exact percentiles sort the last 8192 steps: for status calls, not for every loop turn.
  if (with_step_stats) s.stats = stats_.Snapshot();
  return s;
}

void SchedulerLoop::UpdateMetrics() {
  if (!metrics_) return;
  const ClusterSnapshot snap = Snapshot(/*with_step_stats=*/false);
  const SchedulerStatus& st = snap.core;
  metrics::SchedulerGaugeState g;
  g.waiting = st.queued;
  g.running = st.running;
  g.queue_capacity = opts_.core.max_queue;
  g.slots = st.n_slots_target;
  g.per_slot.reserve(st.slots.size());
  for (const SlotStatus& sl : st.slots) {
    g.per_slot.push_back({sl.ctx_used, sl.ctx_reserved, st.per_slot_cap, sl.busy});
    g.slots_busy += sl.busy ? 1 : 0;
  }
  g.context_used = st.pool_used;
  g.context_reserved = st.pool_reserved;
  g.context_capacity = st.pool_total;
  g.draining = st.draining;
  g.serving = snap.serving;
  metrics_->Update(g);
  // Up while attached (warming up or serving); a lost replica's series stays at 0 until a worker
  // with the same id (systemd: %H-gpu%i) brings it back.
  for (const ReplicaSnapshot& r : snap.replicas)
    metrics_->SetWorker(r.worker.id, true, std::max(0.0, r.heartbeat_age_s));
  std::map<int, metrics::PrefixCacheGaugeState> pc;
  for (const ReplicaSnapshot& r : snap.replicas) {
    const PrefixCacheStats& x = r.core.prefix_cache;
    pc[r.id] = {x.lookups, x.hits,      x.tokens_looked, x.tokens_saved, x.saves,
                x.evictions, x.failures, x.bytes,        x.budget_bytes, x.checkpoints};
  }
  metrics_->SetPrefixCache(pc);
}

}  // namespace ds::sched
