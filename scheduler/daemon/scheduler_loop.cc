#include "scheduler/daemon/scheduler_loop.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/util/status.h"
#include "deltaserve/internal/cluster.pb.h"

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


void ToProto(const sampling::SamplingParams& s, deltaserve::v1::SamplingParams* p) {
  p->set_temperature(s.temperature);
  p->set_top_k(s.top_k);
  p->set_top_p(s.top_p);
  p->set_min_p(s.min_p);
  p->set_repetition_penalty(s.repetition_penalty);
  p->set_presence_penalty(s.presence_penalty);
  p->set_frequency_penalty(s.frequency_penalty);
  p->set_seed(s.seed);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SchedulerLoop>> SchedulerLoop::Create(const LoopOptions& opts) {
  if (opts.step_timeout_s <= 0) return absl::InvalidArgumentError("step timeout must be > 0");
  DS_ASSIGN_OR_RETURN(auto core, Scheduler::Create(opts.core));
  return std::unique_ptr<SchedulerLoop>(new SchedulerLoop(opts, std::move(core)));
}

SchedulerLoop::SchedulerLoop(const LoopOptions& opts, std::unique_ptr<Scheduler> core)
    : opts_(opts), core_(std::move(core)), last_log_(SteadyClock::now()) {}

SchedulerLoop::~SchedulerLoop() { Stop(); }

void SchedulerLoop::Start() { thread_ = std::thread([this] { Run(); }); }

void SchedulerLoop::Stop() {
  if (!thread_.joinable()) return;
  stopped_.store(true, std::memory_order_release);
  Push(StopCmd{});
  thread_.join();
}

void SchedulerLoop::Run() {
  std::vector<Command> cmds;
  while (!stop_) {
    // Block on the command queue: forever when there is nothing to do, until the step / warmup
    // deadline while the worker computes, not at all when the core has runnable work.
    auto until = SteadyClock::time_point::max();
    if (!flight_.empty() || state_ == WorkerState::kWarming) {
      until = deadline_;
    } else if (state_ == WorkerState::kReady && !core_->Idle()) {
      // An empty plan with requests present: only queued deadlines can change that without a
      // command, so a coarse timer is enough.
      until = last_plan_empty_ ? SteadyClock::now() + std::chrono::milliseconds(20)
                               : SteadyClock::now();
    }
    // At least once a second: the watchdog sees a live loop, ages and gauges stay current.
    until = std::min(until, SteadyClock::now() + std::chrono::seconds(1));
    commands_.PopAll(&cmds, until);
    if (!cmds.empty()) last_plan_empty_ = false;
    for (Command& c : cmds) std::visit([this](auto& x) { Handle(x); }, c);
    if (stop_) break;
    if (holding_ && state_ == WorkerState::kReady) holding_ = false;  // replaying on the new one
    if (holding_ && SteadyClock::now() >= hold_until_) {
      holding_ = false;
      FailAll(absl::StrCat("worker lost: ", hold_why_, "; no replacement within ",
                           opts_.failover_wait_s, " s"),
              /*unavailable=*/true);
    }
    if ((!flight_.empty() || state_ == WorkerState::kWarming) && SteadyClock::now() >= deadline_)
      LoseWorker(absl::StrCat("no answer within ", opts_.step_timeout_s, " s"));
    if (state_ == WorkerState::kReady && flight_.empty()) ScheduleAndSend(/*ahead=*/false);
    if (state_ == WorkerState::kReady && lookahead_ && flight_.size() == 1) ScheduleAndSend(/*ahead=*/true);
    // Events produced outside Apply (aborts of queued requests, expired deadlines).
    Route(core_->TakeEvents(), nullptr, false);

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
  if (worker_) {
    pb::SchedulerMessage m;
    m.mutable_shutdown();
    worker_->Send(m);
  }
}

// ---- commands ----

void SchedulerLoop::Handle(AddCmd& c) {
  auto reject = [&](absl::Status s) {
    RequestEventItem item;
    item.reject = std::move(s);
    c.side.channel->Push(std::move(item));
  };
  if (state_ != WorkerState::kReady)
    return reject(absl::UnavailableError("no worker is ready (cluster not serving)"));
  const int n_vocab = worker_info_.n_vocab;
  for (size_t i = 0; i < c.request.prompt.size(); ++i)
    if (c.request.prompt[i] >= n_vocab)
      return reject(absl::InvalidArgumentError(absl::StrCat("prompt token id ", c.request.prompt[i],
                                                            " at index ", i,
                                                            " is outside the vocabulary (",
                                                            n_vocab, ")")));
  const RequestId id = c.request.id;
  if (absl::Status s = core_->Add(std::move(c.request)); !s.ok()) return reject(s);
  side_[id] = std::move(c.side);
}

void SchedulerLoop::Handle(AbortCmd& c) {
  // NotFound: it finished meanwhile; nothing to do.
  core_->Abort(c.id, c.why).IgnoreError();
}

void SchedulerLoop::Handle(FinishCmd& c) { c.done->set_value(core_->Finish(c.id, c.reason, c.detail)); }

int64_t SchedulerLoop::PerSlotCapFor(int n_slots, const ContextPolicy& p) const {
  if (p.kind == ContextPolicy::Kind::kStatic) return p.n_ctx / std::max(1, n_slots);
  return p.slot_cap > 0 ? std::min<int64_t>(p.slot_cap, p.n_ctx) : p.n_ctx;
}

void SchedulerLoop::Handle(AdminCmd& c) {
  absl::Status s;
  const SchedulerStatus st = core_->Status();
  switch (c.op) {
    case AdminCmd::Op::kStatus:
      break;
    case AdminCmd::Op::kSetSlots: {
      // Slots are the scheduler's concept; the worker's backend was configured once with
      // worker_slots_ (--max-slots) slots of worker_slot_ctx_ positions, which bound them.
      const int bound = worker_slots_ > 0 ? worker_slots_ : opts_.max_slots;
      if (c.n_slots < 1) {
        s = absl::InvalidArgumentError("slots must be >= 1");
      } else if (bound > 0 && c.n_slots > bound) {
        s = absl::OutOfRangeError(absl::StrCat("slots ", c.n_slots, " exceeds the worker's ", bound,
                                               " configured slots (scheduler --max-slots)"));
      } else if (worker_slot_ctx_ > 0 && PerSlotCapFor(c.n_slots, st.policy) > worker_slot_ctx_) {
        s = absl::OutOfRangeError(absl::StrCat("slots ", c.n_slots, " would give each slot ",
                                               PerSlotCapFor(c.n_slots, st.policy),
                                               " positions, more than the worker's slot_ctx ",
                                               worker_slot_ctx_, " (scheduler --slot-ctx)"));
      } else {
        s = core_->SetSlots(c.n_slots);
      }
      break;
    }
    case AdminCmd::Op::kSetPolicy:
      if (worker_slot_ctx_ > 0 && PerSlotCapFor(st.n_slots_target, c.policy) > worker_slot_ctx_) {
        s = absl::OutOfRangeError(absl::StrCat(
            "the policy gives a slot up to ", PerSlotCapFor(st.n_slots_target, c.policy),
            " positions, more than the worker's slot_ctx ", worker_slot_ctx_,
            " (scheduler --slot-ctx)"));
      } else {
        s = core_->SetContextPolicy(c.policy);
      }
      break;
    case AdminCmd::Op::kDrain:
      core_->Drain();
      break;
    case AdminCmd::Op::kResume:
      core_->Resume();
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
  if (worker_) {
    DS_LOG(WARNING, "worker_refused",
           {{"worker", c.info.id}, {"attached", worker_info_.id}, {"reason", "one worker per scheduler"}});
    c.link->Close(absl::AlreadyExistsError(
        absl::StrCat("worker ", worker_info_.id,
                     " is already attached (one worker per scheduler until worker groups land)")));
    return;
  }
  const SchedulerStatus st = core_->Status();
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
  worker_ = c.link;
  worker_info_ = c.info;
  lookahead_ = opts_.lookahead;
  worker_slots_ = slots;
  worker_slot_ctx_ = static_cast<int>(slot_ctx);
  if (st.n_slots_target > slots) {
    DS_LOG(INFO, "slots_reduced", {{"from", st.n_slots_target}, {"to", slots},
                                   {"reason", "the worker's slot count"}});
    core_->SetSlots(slots).IgnoreError();
  }
  state_ = WorkerState::kWarming;
  deadline_ = After(opts_.step_timeout_s);
  DS_LOG(INFO, "worker_registered",
         {{"worker", c.info.id}, {"device", c.info.device}, {"model", c.info.model_fingerprint},
          {"vocab", c.info.n_vocab}, {"slots", slots}, {"slot_ctx", slot_ctx}});
  pb::SchedulerMessage cf;
  cf.mutable_configure()->set_n_slots(static_cast<uint32_t>(slots));
  cf.mutable_configure()->set_slot_ctx(static_cast<uint32_t>(slot_ctx));
  pb::SchedulerMessage wu;
  wu.mutable_warmup()->set_tokens(static_cast<uint32_t>(opts_.warmup_tokens));
  if (!worker_->Send(cf) || !worker_->Send(wu)) LoseWorker("stream closed during configure");
}

void SchedulerLoop::Handle(WorkerWarmupCmd& c) {
  if (c.link != worker_ || state_ != WorkerState::kWarming) return;
  warmup_ = c.info;
  state_ = WorkerState::kReady;
  n_vocab_.store(worker_info_.n_vocab, std::memory_order_release);
  DS_LOG(INFO, "worker_ready",
         {{"worker", worker_info_.id}, {"prefill_tokens_per_s", c.info.prefill_tps},
          {"decode_tokens_per_s", c.info.decode_tps}, {"serving", true}});
}

void SchedulerLoop::Handle(WorkerStepCmd& c) {
  const auto t_recv = SteadyClock::now();
  if (c.link != worker_ || flight_.empty()) return;  // a stale answer of a lost worker
  const WorkerStepResult& wr = c.result;
  const StepPlan& plan = flight_.front().plan;
  if (wr.step_id != plan.step_id)
    return LoseWorker(absl::StrCat("protocol error: result for step ", wr.step_id, ", expected ",
                                   plan.step_id));
  StepResults r;
  r.step_id = wr.step_id;
  r.forward_seconds = wr.forward_seconds;
  absl::flat_hash_map<RequestId, TokenLogprobInfo> lps;
  if (!wr.error.empty()) {
    r.status = absl::InternalError("worker step failed: " + wr.error);
  } else {
    // The worker answers per slot; the core wants plan order of the sampled entries.
    absl::flat_hash_map<int, const WorkerSampled*> by_slot;
    for (const WorkerSampled& t : wr.tokens) by_slot[t.slot] = &t;
    for (const PlanEntry& e : plan.entries) {
      if (!e.sample) continue;
      auto it = by_slot.find(e.slot);
      if (it == by_slot.end()) {
        r.status = absl::InternalError(absl::StrCat("worker returned no token for slot ", e.slot));
        r.tokens.clear();
        break;
      }
      r.tokens.push_back(it->second->token);
      if (it->second->logprob) lps[e.id] = *it->second->logprob;
    }
  }
  auto events = core_->Apply(plan, r, absl::Now());
  if (!events.ok()) return LoseWorker("cannot apply the step result: " + events.status().ToString());
  InFlight done = std::move(flight_.front());
  flight_.pop_front();
  // The next plan (sent ahead) is what the worker computes now.
  if (!flight_.empty()) deadline_ = After(opts_.step_timeout_s);
  StepTiming t;
  t.n_tokens = done.plan.n_tokens;
  t.n_seqs = static_cast<int>(done.plan.entries.size());
  Route(std::move(*events), &lps, false);
  const auto t_end = SteadyClock::now();
  // A step sent ahead starts, for the worker, when the previous answer left it: its interval is
  // measured from the previous answer here, and its scheduling (done during the previous step)
  // is off the critical path.
  const bool ahead = done.sent < last_result_;
  t.total_us = Micros(t_end - (ahead ? last_result_ : done.t0));
  t.worker_us = (wr.forward_seconds + wr.sample_seconds) * 1e6;
  t.worker_handle_us = std::max(t.worker_us, wr.handle_seconds * 1e6);
  t.schedule_us = ahead ? 0 : Micros(done.sent - done.t0);
  t.apply_us = Micros(t_end - t_recv);
  last_result_ = t_recv;
  stats_.Record(t);
  if (metrics_) metrics_->OnStep(t.total_us * 1e-6, t.n_tokens, t.n_seqs, t.worker_us * 1e-6);
}

void SchedulerLoop::Handle(WorkerGoneCmd& c) {
  if (c.link == worker_) LoseWorker(c.why);
}

void SchedulerLoop::Handle(StopCmd&) { stop_ = true; }

// ---- steps ----

void SchedulerLoop::ScheduleAndSend(bool ahead) {
  const auto t0 = SteadyClock::now();
  auto plan = ahead ? core_->ScheduleAhead(absl::Now()) : core_->Schedule(absl::Now());
  if (!plan.ok()) {
    DS_LOG(ERROR, ahead ? "schedule_ahead_failed" : "schedule_failed", {{"error", plan.status()}});
    return;
  }
  if (plan->empty()) {
    if (!ahead) last_plan_empty_ = true;
    return;
  }
  // Full data for sequences bound by this plan, diffs (slot, pos0, n) for everything else. A plan
  // sent ahead holds only such diffs: one token each, the one the worker samples in the step
  // before (docs/async_scheduling.md).
  pb::SchedulerMessage msg;
  pb::Step* step = msg.mutable_step();
  step->set_step_id(plan->step_id);
  for (int s : plan->released)  // (after failover: slots of the old worker the new one lacks)
    if (s < worker_slots_) step->add_released(static_cast<uint32_t>(s));
  for (const SeqStart& st : plan->started) {
    pb::SequenceStart* q = step->add_started();
    q->set_request_id(st.id);
    q->set_slot(static_cast<uint32_t>(st.slot));
    q->mutable_tokens()->Add(st.tokens.begin(), st.tokens.end());
    auto it = side_.find(st.id);
    if (it != side_.end()) {
      ToProto(it->second.sampling, q->mutable_sampling());
      q->set_logprobs(static_cast<uint32_t>(it->second.logprobs));
    }
  }
  for (const PlanEntry& e : plan->entries) {
    pb::SlotWork* w = step->add_work();
    w->set_slot(static_cast<uint32_t>(e.slot));
    w->set_pos0(static_cast<uint32_t>(e.pos0));
    w->set_n_tokens(static_cast<uint32_t>(e.tokens.size()));
    w->set_sample(e.sample);
  }
  flight_.push_back({std::move(*plan), t0, {}});
  // A plan sent ahead waits behind the one in flight: the timer of the oldest one runs.
  if (flight_.size() == 1) deadline_ = After(opts_.step_timeout_s);
  if (!worker_->Send(msg)) return LoseWorker("stream closed while sending a step");
  flight_.back().sent = SteadyClock::now();
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

void SchedulerLoop::FailInFlightPlan(const std::string& why, bool unavailable) {
  // Oldest first, as the core applies them.
  while (!flight_.empty()) {
    StepResults r;
    r.step_id = flight_.front().plan.step_id;
    r.status = absl::UnavailableError(why);
    auto events = core_->Apply(flight_.front().plan, r, absl::Now());
    flight_.pop_front();
    if (events.ok()) Route(std::move(*events), nullptr, unavailable);
  }
}

void SchedulerLoop::FailAll(const std::string& why, bool unavailable) {
  FailInFlightPlan(why, unavailable);
  std::vector<RequestId> ids;
  for (const auto& [id, side] : side_) ids.push_back(id);
  for (RequestId id : ids) core_->Finish(id, FinishReason::kError, why).IgnoreError();
  Route(core_->TakeEvents(), nullptr, unavailable);
  // Anything the core no longer knew (cannot happen unless the core and side table disagree).
  for (auto& [id, side] : side_) {
    RequestEventItem item;
    item.unavailable = unavailable;
    item.event.kind = Event::Kind::kFinished;
    item.event.id = id;
    item.event.reason = FinishReason::kError;
    item.event.detail = why;
    side.channel->Push(std::move(item));
  }
  side_.clear();
}

void SchedulerLoop::HoldForReplay(const std::string& why) {
  // Running requests go back to the queue with their full history (prompt + generated); the ones
  // of the in-flight plan when it is applied as failed just below. A replacement worker then
  // re-prefills the history and continues; the core emits Token events only for tokens generated
  // from then on, so nothing already streamed is sent again. Greedy output is unchanged.
  for (const auto& [id, side] : side_) core_->Requeue(id).IgnoreError();
  FailInFlightPlan(why, /*unavailable=*/true);
  Route(core_->TakeEvents(), nullptr, /*unavailable=*/true);
  holding_ = !side_.empty();
  hold_until_ = After(opts_.failover_wait_s);
  hold_why_ = why;
  if (holding_)
    DS_LOG(WARNING, "holding_for_replacement",
           {{"requests", side_.size()}, {"failover_wait_s", opts_.failover_wait_s}, {"reason", why}});
}

void SchedulerLoop::LoseWorker(const std::string& why) {
  if (!worker_) return;
  DS_LOG(ERROR, "worker_lost", {{"worker", worker_info_.id}, {"reason", why},
                                {"requests", side_.size()}, {"serving", false}});
  if (opts_.failover_wait_s > 0) {
    HoldForReplay(why);
  } else {
    FailAll("worker lost: " + why, /*unavailable=*/true);
  }
  worker_->Close(absl::UnavailableError("worker lost: " + why));
  worker_.reset();
  state_ = WorkerState::kNone;
  n_vocab_.store(0, std::memory_order_release);
  worker_slots_ = 0;
  worker_slot_ctx_ = 0;
}

ClusterSnapshot SchedulerLoop::Snapshot() const {
  ClusterSnapshot s;
  s.core = core_->Status();
  s.serving = state_ == WorkerState::kReady;  // draining is reported on its own
  s.has_worker = worker_ != nullptr;
  s.worker_ready = state_ == WorkerState::kReady;
  s.worker = worker_info_;
  s.warmup = warmup_;
  if (worker_) {
    const double hb = worker_->last_heartbeat.load();
    s.heartbeat_age_s = hb > 0 ? SteadySeconds(SteadyClock::now()) - hb : -1;
  }
  s.worker_slots = worker_slots_;
  s.worker_slot_ctx = worker_slot_ctx_;
  s.max_queue = opts_.core.max_queue;
  s.stats = stats_.Snapshot();
  return s;
}

void SchedulerLoop::UpdateMetrics() {
  if (!metrics_) return;
  const SchedulerStatus st = core_->Status();
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
  g.serving = state_ == WorkerState::kReady;
  metrics_->Update(g);
  if (worker_) {
    last_worker_id_ = worker_info_.id;
    const double hb = worker_->last_heartbeat.load();
    if (hb > 0) last_heartbeat_ = hb;
  }
  if (!last_worker_id_.empty()) {
    const double age = last_heartbeat_ > 0 ? SteadySeconds(SteadyClock::now()) - last_heartbeat_ : 0;
    // Up while attached (warming up or serving); a restarted worker with the same id (systemd:
    // %H-gpu%i) brings the series back to 1.
    metrics_->SetWorker(last_worker_id_, worker_ != nullptr, age);
  }
}

}  // namespace ds::sched
