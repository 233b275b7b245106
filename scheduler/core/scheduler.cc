#include "scheduler/core/scheduler.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics/draft_positions.h"

namespace ds::sched {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

namespace {

absl::Status ValidatePolicy(const ContextPolicy& p, int n_slots) {
  if (p.n_ctx <= 0)
    return absl::InvalidArgumentError(absl::StrCat("context n_ctx ", p.n_ctx, " <= 0"));
  if (p.kind == ContextPolicy::Kind::kStatic) {
    if (p.n_ctx / n_slots < 1) {
      return absl::InvalidArgumentError(absl::StrCat("static context: n_ctx ", p.n_ctx,
                                                     " leaves no position for each of ", n_slots,
                                                     " slots"));
    }
  } else if (p.slot_cap < 0) {
    return absl::InvalidArgumentError(absl::StrCat("pool context: slot_cap ", p.slot_cap, " < 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckTokens(RequestId id, const char* what, const std::vector<int32_t>& t) {
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", id, ": ", what, " token ", i, " has negative id ", t[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerConfig& c) {
  if (c.n_slots < 1) return absl::InvalidArgumentError(absl::StrCat("n_slots ", c.n_slots, " < 1"));
  if (c.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_batched_tokens ", c.max_num_batched_tokens, " < 1"));
  }
  if (c.max_chunk < 1)
    return absl::InvalidArgumentError(absl::StrCat("max_chunk ", c.max_chunk, " < 1"));
  if (c.max_queue < 1)
    return absl::InvalidArgumentError(absl::StrCat("max_queue ", c.max_queue, " < 1"));
  if (absl::Status st = ValidatePolicy(c.context, c.n_slots); !st.ok()) return st;
  return std::unique_ptr<Scheduler>(new Scheduler(c));
}

Scheduler::Scheduler(const SchedulerConfig& config) : config_(config) {
  slot_owner_.assign(config_.n_slots, nullptr);
}

int64_t Scheduler::PerSlotCap() const {
  const ContextPolicy& p = config_.context;
  if (p.kind == ContextPolicy::Kind::kStatic) return p.n_ctx / config_.n_slots;
  if (p.slot_cap == 0) return p.n_ctx;  // proto: 0 = no per-slot cap beyond the pool
  return std::min<int64_t>(p.slot_cap, p.n_ctx);
}

int64_t Scheduler::Reservation(const Seq& s) const {
  // Static: the slot's whole share, as llama.cpp's -c / -np; the pool accounting then guarantees
  // the shares never add up past n_ctx, even across SetSlots. Pool: the request's worst case.
  if (config_.context.kind == ContextPolicy::Kind::kStatic) return PerSlotCap();
  const int64_t worst = static_cast<int64_t>(s.n_prompt) + s.req.max_new_tokens;
  // Over-commit: what it knows now plus the headroom (grown later by GrowReservations).
  if (Overcommit())
    return std::min<int64_t>(worst, static_cast<int64_t>(s.tokens.size()) +
                                        config_.context.overcommit_headroom);
  return worst;
}

bool Scheduler::GrowReservations() {
  bool preempted = false;
  const int64_t pool = config_.context.n_ctx;
  // Oldest admission first, so the youngest give way (they never preempt an older one, so the
  // oldest always progresses and preemption cannot loop).
  for (size_t i = 0; i < running_.size();) {
    Seq& s = *running_[i];
    // This step takes the slot to at most all known tokens.
    if (s.zombie || s.reserved >= static_cast<int64_t>(s.tokens.size())) {
      ++i;
      continue;
    }
    const int64_t want = Reservation(s);
    while (reserved_total_ - s.reserved + want > pool) {
      Seq* victim = nullptr;
      for (size_t j = running_.size(); j-- > i + 1;) {
        if (!running_[j]->zombie && running_[j]->plans == 0) {
          victim = running_[j];
          break;
        }
      }
      if (!victim) break;
      ++preemptions_;
      preempted = true;
      RequeueNow(*victim);  // slot and reservation freed; resumes by re-prefill
    }
    if (reserved_total_ - s.reserved + want <= pool) {
      reserved_total_ += want - s.reserved;
      s.reserved = want;
      ++i;
    } else {
      // Nobody younger to preempt and no room: it waits in the queue itself.
      ++preemptions_;
      preempted = true;
      RequeueNow(s);  // erases running_[i]
    }
  }
  return preempted;
}

absl::Status Scheduler::CheckFits(RequestId id, int64_t need_tokens) const {
  const int64_t cap = PerSlotCap();
  if (need_tokens > cap) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", id, ": prompt + max_new_tokens = ", need_tokens,
        " exceeds the per-slot context ", cap,
        config_.context.kind == ContextPolicy::Kind::kStatic ? " (static n_ctx / n_slots)"
                                                             : " (pool slot_cap)"));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Add(Request r) {
  if (draining_)
    return absl::UnavailableError(absl::StrCat("request ", r.id, ": scheduler is draining"));
  if (r.prompt.empty())
    return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": empty prompt"));
  if (r.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", r.id, ": max_new_tokens ", r.max_new_tokens, " < 1"));
  }
  if (static_cast<int64_t>(r.generated.size()) >= r.max_new_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", r.id, ": ", r.generated.size(),
                     " replayed tokens leave nothing of max_new_tokens ", r.max_new_tokens));
  }
  if (absl::Status st = CheckTokens(r.id, "prompt", r.prompt); !st.ok()) return st;
  if (absl::Status st = CheckTokens(r.id, "generated", r.generated); !st.ok()) return st;
  if (r.checkpoint_hints.size() > kMaxCheckpointHints)
    return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": ", r.checkpoint_hints.size(),
                                                   " checkpoint hints, at most ", kMaxCheckpointHints));
  for (const int32_t p : r.checkpoint_hints)
    if (p <= 0 || p >= static_cast<int64_t>(r.prompt.size()))
      return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": checkpoint hint ", p,
                                                     " is outside the prompt's (0, ", r.prompt.size(), ")"));
  if (seqs_.contains(r.id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request ", r.id, " is already queued or running"));
  }
  if (absl::Status st = CheckFits(r.id, static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens);
      !st.ok()) {
    return st;
  }
  if (queue_.size() >= config_.max_queue) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request ", r.id, ": queue full (", config_.max_queue, " waiting)"));
  }
  auto s = std::make_unique<Seq>();
  s->n_prompt = static_cast<int32_t>(r.prompt.size());
  s->tokens.reserve(r.prompt.size() + r.max_new_tokens);
  s->tokens = std::move(r.prompt);
  s->tokens.insert(s->tokens.end(), r.generated.begin(), r.generated.end());
  r.generated.clear();
  // The recorded cut up to its first piece that does not fit this prompt: a numerics hint,
  // never a reason to refuse the request.
  int64_t cut = 0;
  for (const int32_t piece : r.prompt_pieces) {
    if (piece <= 0 || cut + piece > s->n_prompt) break;
    s->prompt_pieces.push_back(piece);
    cut += piece;
  }
  r.prompt_pieces.clear();
  s->seq = next_seq_++;
  s->timings.arrival = r.arrival;
  s->req = std::move(r);
  queue_.Push(s->key());
  Seq& added = *s;
  seqs_.emplace(added.req.id, std::move(s));
  if (PrefixOn()) NotePrefix(added);
  return absl::OkStatus();
}

absl::Status Scheduler::MarkDone(RequestId id, Pending action, FinishReason reason,
                                 std::string_view detail) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("request ", id, " is not active"));
  Seq& s = *it->second;
  if (s.zombie) return absl::NotFoundError(absl::StrCat("request ", id, " is not active"));
  if (s.plans > 0) {
    // Between steps: the worker is computing this request now; act when its results come back.
    // A finish overrides a pending requeue; the first finish reason wins.
    if (s.pending == Pending::kNone ||
        (action == Pending::kFinish && s.pending == Pending::kRequeue)) {
      s.pending = action;
      s.pending_reason = reason;
      s.pending_detail = std::string(detail);
    }
    return absl::OkStatus();
  }
  if (action == Pending::kFinish) {
    FinishNow(s, reason, std::string(detail), last_now_);
  } else if (s.slot >= 0) {
    RequeueNow(s);
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Abort(RequestId id, std::string_view why) {
  return MarkDone(id, Pending::kFinish, FinishReason::kAborted, why);
}

absl::Status Scheduler::Finish(RequestId id, FinishReason reason, std::string_view detail) {
  return MarkDone(id, Pending::kFinish, reason, detail);
}

absl::Status Scheduler::Requeue(RequestId id) {
  return MarkDone(id, Pending::kRequeue, FinishReason::kAborted, {});
}

int Scheduler::FreeSlot() const {
  const int n = std::min<int>(config_.n_slots, static_cast<int>(slot_owner_.size()));
  for (int i = 0; i < n; ++i) {
    if (slot_owner_[i] == nullptr) return i;
  }
  return -1;
}

void Scheduler::Admit(Seq& s, int slot, absl::Time now) {
  queue_.Remove(s.key());
  slot_owner_[slot] = &s;
  s.slot = slot;
  s.computed = 0;
  s.reserved = Reservation(s);
  reserved_total_ += s.reserved;
  running_.push_back(&s);
  s.timings.admitted = now;
  Event e;
  e.kind = Event::Kind::kStarted;
  e.id = s.req.id;
  e.slot = slot;
  e.timings = s.timings;
  outbox_.push_back(std::move(e));
}

void Scheduler::Unbind(Seq& s) {
  if (s.slot < 0) return;
  slot_owner_[s.slot] = nullptr;
  released_.push_back(s.slot);
  // Retire freed slots past the target; a free slot below a busy retiring one stays as a hole
  // (FreeSlot never hands out indices >= target).
  while (static_cast<int>(slot_owner_.size()) > config_.n_slots && slot_owner_.back() == nullptr) {
    slot_owner_.pop_back();
  }
  reserved_total_ -= s.reserved;
  s.reserved = 0;
  s.slot = -1;
  running_.erase(std::find(running_.begin(), running_.end(), &s));
}

Event Scheduler::FinishedEvent(Seq& s, FinishReason reason, std::string detail, absl::Time now) {
  s.timings.finished = now;
  Event e;
  e.kind = Event::Kind::kFinished;
  e.id = s.req.id;
  e.reason = reason;
  e.detail = std::move(detail);
  e.n_prompt = s.n_prompt;
  e.n_generated = s.n_generated();
  e.timings = s.timings;
  return e;
}

void Scheduler::FinishNow(Seq& s, FinishReason reason, std::string detail, absl::Time now) {
  DropCuts(s);
  if (s.slot >= 0) {
    // A chat's next turn starts with this one's prompt + answer: keep the state it ends with.
    if (reason == FinishReason::kStop || reason == FinishReason::kLength) SaveOnRelease(s);
    Unbind(s);
  } else {
    queue_.Remove(s.key());
  }
  outbox_.push_back(FinishedEvent(s, reason, std::move(detail), now));
  const RequestId id = s.req.id;
  seqs_.erase(id);  // destroys s
}

void Scheduler::FinishSoon(Seq& s, FinishReason reason, std::string detail, absl::Time now) {
  if (s.plans == 0) return FinishNow(s, reason, std::move(detail), now);
  // A later plan still runs on this slot: the client hears now, the slot is freed (and the
  // request forgotten) when that plan is applied.
  outbox_.push_back(FinishedEvent(s, reason, std::move(detail), now));
  s.zombie = true;
  s.pending = Pending::kNone;
  s.save_on_release = reason == FinishReason::kStop || reason == FinishReason::kLength;
  DropCuts(s);
}

void Scheduler::RequeueNow(Seq& s) {
  DropCuts(s);
  Unbind(s);
  s.computed = 0;
  s.pending = Pending::kNone;
  s.stale = false;
  // The policy or slot count may have changed since it was admitted; waiting for a slot it can
  // never get would hang the client.
  absl::Status fits = CheckFits(s.req.id, static_cast<int64_t>(s.n_prompt) + s.req.max_new_tokens);
  if (!fits.ok()) {
    FinishNow(s, FinishReason::kError, std::string(fits.message()), last_now_);
    return;
  }
  queue_.Push(s.key());
}

void Scheduler::ExpireDeadlines(absl::Time now) {
  std::vector<Seq*> expired;
  for (Seq* s : running_) {
    if (!s->zombie && s->req.deadline <= now) expired.push_back(s);
  }
  for (const RequestQueue::Key& k : queue_) {
    Seq* s = seqs_.at(k.id).get();
    if (s->req.deadline <= now) expired.push_back(s);
  }
  for (Seq* s : expired) {
    if (s->plans > 0) {  // only under ScheduleAhead: aborted when its plan is applied
      MarkDone(s->req.id, Pending::kFinish, FinishReason::kAborted, "deadline exceeded").IgnoreError();
    } else {
      FinishNow(*s, FinishReason::kAborted, "deadline exceeded", now);
    }
  }
}

void Scheduler::FailQueuedThatNoLongerFit() {
  std::vector<std::pair<Seq*, absl::Status>> failed;
  for (const RequestQueue::Key& k : queue_) {
    Seq* s = seqs_.at(k.id).get();
    absl::Status st = CheckFits(k.id, static_cast<int64_t>(s->n_prompt) + s->req.max_new_tokens);
    if (!st.ok()) failed.emplace_back(s, std::move(st));
  }
  for (auto& [s, st] : failed) {
    FinishNow(*s, FinishReason::kError, std::string(st.message()), last_now_);
  }
}

int32_t Scheduler::NextPiece(const Seq& s, int32_t budget) const {
  int32_t n = std::min({s.remaining(), budget, config_.max_chunk});
  if (s.computed >= s.n_prompt) return n;
  n = std::min(n, s.n_prompt - s.computed);
  // Prefix cache: a piece ends at the next checkpoint, so the state there can be saved.
  for (const auto& [pos, id] : s.cuts)
    if (pos > s.computed) {
      n = std::min(n, pos - s.computed);
      break;
    }
  int32_t at = 0;
  for (const int32_t piece : s.prompt_pieces) {
    if (at == s.computed) {
      // The recorded piece when this step has room for it; a step too full for it gets the
      // ordinary cut (no stall, but the replay's numbers may part from the first run's).
      return piece <= budget && piece <= s.n_prompt - s.computed ? piece : n;
    }
    at += piece;
    if (at > s.computed) break;
  }
  return n;
}

void Scheduler::AddEntry(Seq& s, int32_t n, StepPlan& plan) {
  PlanEntry e;
  e.id = s.req.id;
  e.slot = s.slot;
  e.pos0 = s.computed;
  e.decode_path = s.computed >= s.n_prompt;
  if (s.computed < s.n_prompt) {
    int64_t recorded = 0;
    for (const int32_t piece : s.prompt_pieces) recorded += piece;
    if (recorded == s.computed) s.prompt_pieces.push_back(n);
  }
  e.tokens.assign(s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n);
  e.reset = s.computed == 0;
  e.sample = s.computed + n == static_cast<int32_t>(s.tokens.size());
  // Prefix cache: the entry that ends at a planned checkpoint saves it; one that passes a
  // checkpoint without ending there (a replay's recorded cut) gives it up.
  while (!s.cuts.empty() && s.cuts.front().first <= s.computed + n) {
    const auto [pos, id] = s.cuts.front();
    s.cuts.erase(s.cuts.begin());
    if (pos == s.computed + n && !e.decode_path) {
      e.checkpoint = id;
      tree_.MarkSaving(id);
    } else {
      tree_.Remove(id);
    }
  }
  ++s.plans;
  s.samples_in_flight += e.sample ? 1 : 0;
  s.planned_end = s.computed + n;
  s.planned_sample = e.sample;
  plan.n_tokens += n;
  plan.n_sampled += e.sample ? 1 : 0;
  plan.entries.push_back(std::move(e));
}

absl::StatusOr<StepPlan> Scheduler::Schedule(absl::Time now) {
  if (!in_flight_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", in_flight_.front(), " is still in flight; Apply its results first"));
  }
  last_now_ = std::max(last_now_, now);
  ExpireDeadlines(now);

  // Over-commit: grow reservations that are used up, preempting the youngest when the pool is
  // short; no admissions in a step that preempted (the preempted one would come straight back).
  const bool preempted = Overcommit() && GrowReservations();

  StepPlan plan;
  int32_t budget = config_.max_num_batched_tokens;
  // 1) Decodes first: one token each, so running streams never stall behind a long prefill.
  // With MTP a decode verifies up to mtp_drafts drafts: its rows count against the budget.
  const int32_t decode_rows = 1 + std::max(0, config_.mtp_drafts);
  for (Seq* s : running_) {
    if (budget == 0) break;
    if (s->remaining() == 1) {
      AddEntry(*s, 1, plan);
      budget = std::max(0, budget - decode_rows);
    }
  }
  // 2) Prefill chunks of running sequences, oldest admission first.
  for (Seq* s : running_) {
    if (budget == 0) break;
    if (s->remaining() > 1) {
      const int32_t n = NextPiece(*s, budget);
      AddEntry(*s, n, plan);
      budget -= n;
    }
  }
  // 3) Admissions in queue order (priority, then FIFO). Strict head-of-line: when the head cannot
  // get its reservation, nobody behind it is admitted (README: "Head of line").
  const int64_t pool = config_.context.n_ctx;
  while (!preempted && budget > 0 && !queue_.empty()) {
    const int slot = FreeSlot();
    if (slot < 0) break;
    Seq& s = *seqs_.at(queue_.front().id);
    if (reserved_total_ + Reservation(s) > pool) break;
    // Prefix cache: resume from the longest checkpoint of its prompt; or wait (head of line)
    // while a running request is about to save a much longer one.
    bool wait = false;
    if (PrefixOn() && plan.saves.empty()) plan.saves.swap(saves_);
    const PrefixCheckpoint* resume = ResumePoint(s, plan, &wait);
    if (wait) break;
    Admit(s, slot, now);
    SeqStart start{s.req.id, slot, s.tokens, s.req.max_new_tokens};
    if (PrefixOn()) {
      ++prefix_stats_.lookups;
      prefix_stats_.tokens_looked += s.n_prompt;
      if (resume) {
        s.computed = resume->length;
        start.resume_checkpoint = resume->id;
        start.resume_len = resume->length;
        ++prefix_stats_.hits;
        prefix_stats_.tokens_saved += resume->length;
      }
      PlanCuts(s);
    }
    plan.started.push_back(std::move(start));
    const int32_t n = NextPiece(s, budget);
    AddEntry(s, n, plan);
    budget -= n;
  }
  // Released slots travel with the next plan that runs, so an idle worker needs no extra message.
  if (plan.entries.empty()) {
    // Saves taken for the admission check go back: they travel with the next plan that runs.
    if (!plan.saves.empty()) {
      plan.saves.insert(plan.saves.end(), saves_.begin(), saves_.end());
      saves_.swap(plan.saves);
      plan.saves.clear();
    }
    return plan;
  }
  plan.released.swap(released_);
  plan.saves.insert(plan.saves.end(), saves_.begin(), saves_.end());
  saves_.clear();
  plan.step_id = next_step_++;
  in_flight_.push_back(plan.step_id);
  return plan;
}

absl::StatusOr<std::vector<Event>> Scheduler::Apply(const StepPlan& plan,
                                                    const StepResults& results, absl::Time now) {
  if (in_flight_.empty() || plan.step_id != in_flight_.front()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan step ", plan.step_id, " is not the oldest step in flight (",
        in_flight_.empty() ? 0 : in_flight_.front(), ")"));
  }
  if (results.step_id != plan.step_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("results of step ", results.step_id, " applied to plan step ", plan.step_id));
  }
  const bool ok = results.status.ok();
  const bool counted = !results.counts.empty();
  if (ok && counted) {
    int64_t total = 0;
    bool valid = static_cast<int32_t>(results.counts.size()) == plan.n_sampled;
    for (const int32_t c : results.counts) {
      valid = valid && c >= 1 && c <= 1 + std::max(0, config_.mtp_drafts);
      total += c;
    }
    if (!valid || total != static_cast<int64_t>(results.tokens.size()))
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", plan.step_id, ": ", results.tokens.size(), " tokens in ",
          results.counts.size(), " counts for ", plan.n_sampled,
          " sampled entries (each 1..", 1 + std::max(0, config_.mtp_drafts), ")"));
    if (valid && !results.drafts_offered.empty()) {
      valid = static_cast<int32_t>(results.drafts_offered.size()) == plan.n_sampled;
      for (size_t i = 0; valid && i < results.counts.size(); ++i)
        valid = results.counts[i] - 1 <= results.drafts_offered[i];
      if (!valid)
        return absl::InvalidArgumentError(absl::StrCat(
            "step ", plan.step_id, ": ", results.drafts_offered.size(),
            " drafts_offered for ", plan.n_sampled,
            " sampled entries, or an entry kept more drafts than it offered"));
    }
  } else if (ok && static_cast<int32_t>(results.tokens.size()) != plan.n_sampled) {
    return absl::InvalidArgumentError(absl::StrCat("step ", plan.step_id, ": ",
                                                   results.tokens.size(), " sampled tokens for ",
                                                   plan.n_sampled, " sampled entries"));
  }
  for (const PlanEntry& e : plan.entries) {
    auto it = seqs_.find(e.id);
    // Zombies and stale requests no longer track positions: their results are dropped. An entry
    // that follows was planned before the drafts kept in front of it were known.
    if (it == seqs_.end() || it->second->plans == 0 || it->second->slot != e.slot ||
        (!it->second->zombie && !it->second->stale && !e.follows &&
         it->second->computed != e.pos0)) {
      return absl::InvalidArgumentError(absl::StrCat("step ", plan.step_id, ": entry of request ",
                                                     e.id, " does not match the plan issued"));
    }
  }
  last_now_ = std::max(last_now_, now);
  ApplyCheckpoints(plan, results);

  size_t k = 0;  // index into results.tokens
  size_t entry = 0;  // sampled entry index (into results.counts)
  for (const PlanEntry& e : plan.entries) {
    Seq& s = *seqs_.at(e.id);
    --s.plans;
    int32_t token = -1;
    std::span<const int32_t> more;  // MTP: tokens after the first one of this entry
    if (e.sample) {
      --s.samples_in_flight;
      const size_t n = counted ? static_cast<size_t>(results.counts[entry]) : 1;
      if (ok) {
        token = results.tokens[k];
        more = std::span<const int32_t>(results.tokens).subspan(k + 1, n - 1);
      }
      k += n;
      ++entry;
    }
    if (s.zombie) {
      // Its state grows by what the worker computed for it (a decode sent ahead).
      if (ok) s.computed += static_cast<int32_t>(e.tokens.size() + more.size());
      if (s.plans == 0) {
        if (ok && s.save_on_release) SaveOnRelease(s);
        Unbind(s);
        seqs_.erase(e.id);  // destroys s; its Finished event went out already
      }
      continue;
    }
    if (s.pending == Pending::kFinish) {
      FinishSoon(s, s.pending_reason, std::move(s.pending_detail), now);
      continue;
    }
    if (s.pending == Pending::kRequeue) {
      // Requeued from position 0 with its history: this result and any later in-flight one are
      // dropped (the slot is re-prefilled on the next admission).
      if (s.plans == 0) {
        RequeueNow(s);
      } else {
        s.stale = true;
      }
      continue;
    }
    if (!ok) {
      FinishSoon(s, FinishReason::kError, absl::StrCat("step failed: ", results.status.message()),
                 now);
      continue;
    }
    s.computed += static_cast<int32_t>(e.tokens.size());
    if (!e.sample) continue;
    ++s.timings.answers;
    if (counted && !results.drafts_offered.empty())
      metrics::CountDraftPositions(results.drafts_offered[entry - 1],
                                   static_cast<int>(more.size()), s.timings.drafts_judged,
                                   s.timings.drafts_accepted);
    // Every token but the last of an MTP answer is a kept draft: already in the worker's state.
    bool finished = false;  // FinishSoon may destroy s: touch nothing of it afterwards
    for (size_t j = 0; j <= more.size() && !finished; ++j) {
      const int32_t t = j == 0 ? token : more[j - 1];
      if (t < 0) {
        FinishSoon(s, FinishReason::kError, absl::StrCat("worker sampled invalid token id ", t),
                   now);
        finished = true;
        break;
      }
      if (j > 0) {
        ++s.computed;
        // A plan sent ahead follows this answer: its positions move with the kept draft.
        if (s.plans > 0) ++s.planned_end;
      }
      s.tokens.push_back(t);
      if (s.timings.first_token == absl::InfinitePast()) s.timings.first_token = now;
      s.timings.last_token = now;
      Event ev;
      ev.kind = Event::Kind::kToken;
      ev.id = s.req.id;
      ev.slot = s.slot;
      ev.token = t;
      outbox_.push_back(std::move(ev));
      const std::vector<int32_t>& stop = s.req.stop_ids;
      if (std::find(stop.begin(), stop.end(), t) != stop.end()) {
        FinishSoon(s, FinishReason::kStop, {}, now);
        finished = true;
      } else if (s.n_generated() >= s.req.max_new_tokens) {
        FinishSoon(s, FinishReason::kLength, {}, now);
        finished = true;
      }
    }
    if (!finished && s.plans == 0) s.planned_end = s.computed;
  }
  in_flight_.erase(in_flight_.begin());
  ++steps_applied_;
  return TakeEvents();
}

std::vector<Event> Scheduler::TakeEvents() {
  std::vector<Event> out;
  out.swap(outbox_);
  return out;
}

absl::Status Scheduler::SetSlots(int n) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("SetSlots: n ", n, " < 1"));
  if (absl::Status st = ValidatePolicy(config_.context, n); !st.ok()) return st;
  config_.n_slots = n;
  if (static_cast<int>(slot_owner_.size()) < n) {
    slot_owner_.resize(n, nullptr);
  } else {
    while (static_cast<int>(slot_owner_.size()) > n && slot_owner_.back() == nullptr) {
      slot_owner_.pop_back();
    }
  }
  // Static split: more slots means a smaller share per slot.
  FailQueuedThatNoLongerFit();
  return absl::OkStatus();
}

absl::Status Scheduler::SetContextPolicy(const ContextPolicy& policy) {
  if (absl::Status st = ValidatePolicy(policy, config_.n_slots); !st.ok()) return st;
  config_.context = policy;
  FailQueuedThatNoLongerFit();
  return absl::OkStatus();
}

void Scheduler::Drain() { draining_ = true; }
void Scheduler::Resume() { draining_ = false; }

SchedulerStatus Scheduler::Status() const {
  SchedulerStatus st;
  st.n_slots_target = config_.n_slots;
  for (int i = 0; i < static_cast<int>(slot_owner_.size()); ++i) {
    const Seq* s = slot_owner_[i];
    if (i >= config_.n_slots && s == nullptr) continue;  // retired hole
    SlotStatus ss;
    ss.slot = i;
    ss.busy = s != nullptr;
    ss.retiring = i >= config_.n_slots;
    if (s != nullptr) {
      ss.id = s->req.id;
      ss.ctx_used = s->computed;
      ss.ctx_reserved = s->reserved;
      st.pool_used += s->computed;
    }
    st.slots.push_back(ss);
  }
  st.queued_by_priority = queue_.CountsByPriority();
  st.queued = queue_.size();
  st.running = static_cast<int>(running_.size());
  st.pool_total = config_.context.n_ctx;
  st.pool_reserved = reserved_total_;
  st.per_slot_cap = PerSlotCap();
  st.policy = config_.context;
  st.draining = draining_;
  st.plan_in_flight = !in_flight_.empty();
  st.steps_applied = steps_applied_;
  st.preemptions = preemptions_;
  st.prefix_cache = prefix_stats_;
  st.prefix_cache.checkpoints = tree_.ready_checkpoints();
  st.prefix_cache.bytes = tree_.ready_bytes();
  return st;
}

absl::StatusOr<RequestInfo> Scheduler::Get(RequestId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second->zombie)
    return absl::NotFoundError(absl::StrCat("request ", id, " is not active"));
  const Seq& s = *it->second;
  RequestInfo info;
  info.id = id;
  info.state = s.slot >= 0 ? RequestInfo::State::kRunning : RequestInfo::State::kQueued;
  info.slot = s.slot;
  info.priority = s.req.priority;
  info.n_prompt = s.n_prompt;
  info.max_new_tokens = s.req.max_new_tokens;
  info.tokens = s.tokens;
  info.computed = s.computed;
  info.reserved = s.reserved;
  info.in_flight = s.plans > 0;
  info.timings = s.timings;
  return info;
}

absl::StatusOr<Request> Scheduler::ExportForReplay(RequestId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second->zombie)
    return absl::NotFoundError(absl::StrCat("request ", id, " is not active"));
  const Seq& s = *it->second;
  Request r;
  r.id = id;
  r.prompt.assign(s.tokens.begin(), s.tokens.begin() + s.n_prompt);
  r.generated.assign(s.tokens.begin() + s.n_prompt, s.tokens.end());
  r.prompt_pieces = s.prompt_pieces;
  r.max_new_tokens = s.req.max_new_tokens;
  r.priority = s.req.priority;
  r.stop_ids = s.req.stop_ids;
  r.checkpoint_hints = s.req.checkpoint_hints;
  r.arrival = s.req.arrival;
  r.deadline = s.req.deadline;
  return r;
}

}  // namespace ds::sched
