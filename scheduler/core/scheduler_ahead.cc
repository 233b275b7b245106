// Scheduler (scheduler.h): the step sent while another is in flight (lookahead,
// docs/async_scheduling.md): the pure-decode continuation of the plan in flight, whose entries
// follow the in-flight answers when the worker speculates with MTP.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "scheduler/core/scheduler.h"

namespace ds::sched {

absl::StatusOr<StepPlan> Scheduler::ScheduleAhead(absl::Time now) {
  if (in_flight_.size() != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ScheduleAhead needs exactly one plan in flight, there are ", in_flight_.size()));
  }
  last_now_ = std::max(last_now_, now);
  ExpireDeadlines(now);
  StepPlan plan;
  // MTP: the in-flight step answers with 1..1 + extra tokens per decode, so the next position is
  // unknown here; the entries then *follow* (PlanEntry::follows): the worker continues each slot
  // from where its answer left it, and Apply shifts the positions by the drafts it kept.
  const int32_t extra = std::max(0, config_.mtp_drafts);
  // Only when Schedule() after the in-flight plan would just decode: an admission or a prefill
  // chunk waits for it (a queued request sees at most one step of extra delay).
  if (!queue_.empty() && FreeSlot() >= 0 &&
      reserved_total_ + Reservation(*seqs_.at(queue_.front().id)) <= config_.context.n_ctx) {
    return plan;
  }
  for (const Seq* s : running_) {
    if (s->zombie) continue;
    if (s->plans == 0 || !s->planned_sample) return plan;
    // Over-commit: a decode ahead that would outgrow the reservation waits for Schedule (which
    // grows it, or preempts). With MTP the in-flight answer may keep `extra` drafts and this
    // step verifies as many more.
    if (Overcommit() && s->stale == false && s->pending == Pending::kNone &&
        s->n_generated() + s->samples_in_flight < s->req.max_new_tokens &&
        static_cast<int64_t>(s->planned_end) + 1 + 2 * extra > s->reserved)
      return plan;
  }
  for (Seq* s : running_) {
    if (s->zombie || s->stale || s->pending != Pending::kNone) continue;
    // The in-flight answer may hold its last token (length): nothing to continue.
    if (s->n_generated() + s->samples_in_flight * (1 + extra) >= s->req.max_new_tokens) continue;
    if (plan.n_tokens >= config_.max_num_batched_tokens) break;
    PlanEntry e;
    e.id = s->req.id;
    e.slot = s->slot;
    e.pos0 = s->planned_end;
    e.tokens = {-1};  // the worker's sample of the in-flight plan
    e.sample = true;
    e.ahead = true;
    e.follows = extra > 0;
    ++s->plans;
    ++s->samples_in_flight;
    s->planned_end += 1;
    s->planned_sample = true;
    plan.n_tokens += 1;
    plan.n_sampled += 1;
    plan.entries.push_back(std::move(e));
  }
  if (plan.entries.empty()) return plan;
  plan.step_id = next_step_++;
  in_flight_.push_back(plan.step_id);
  return plan;
}

}  // namespace ds::sched
