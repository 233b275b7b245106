// The scheduler core of one worker: a pure state machine (no I/O, no threads, no clock of its own:
// every call that needs time takes `now`). One loop thread owns it (scheduler/README.md).
//
// Cycle:   plan = Schedule(now)  ->  worker runs plan  ->  events = Apply(plan, results, now)
// Schedule() needs no plan in flight. ScheduleAhead() may add a second one while one is in flight
// (docs/async_scheduling.md): the pure-decode continuation of that plan, so the worker finds its
// next step queued when it finishes one; plans are applied in the order they were issued. Add,
// Abort, Finish, Requeue, SetSlots, SetContextPolicy and Drain may be called at any time; what they
// do to a request of an in-flight plan takes effect when its last in-flight plan's results are
// applied ("between steps"). A request that finishes (stop id, length, error) while it still has a
// plan in flight gets its Finished event at once and keeps its slot until that plan is applied.
//
// Events produced outside Apply (an abort of a queued request, deadline expiry in Schedule,
// requests that no longer fit after a policy change) wait in an outbox that the next Apply()
// returns first, or that TakeEvents() drains.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler/core/prefix_tree.h"
#include "scheduler/core/request_queue.h"
#include "scheduler/core/types.h"

namespace ds::sched {

class Scheduler {
 public:
  // Validates the config (InvalidArgument naming the field).
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerConfig& config);

  // Accepts a request into the waiting queue, never blocking:
  //  Unavailable        draining;
  //  InvalidArgument    malformed (empty prompt, negative token id, max_new_tokens < 1, replayed
  //                     tokens >= max_new_tokens) or can never fit a slot under the current policy;
  //  AlreadyExists      the id is queued or running;
  //  ResourceExhausted  the queue holds max_queue requests.
  absl::Status Add(Request request);

  // Cancels a request (client gone, deadline): Finished{kAborted, why}. Queued or running outside
  // the in-flight plan: released now. In the in-flight plan: released when its results are applied,
  // and its result is ignored. NotFound when unknown or already finished.
  absl::Status Abort(RequestId id, std::string_view why);
  // Same as Abort with another reason: the gateway matched a stop string (kStop) or failed
  // (kError).
  absl::Status Finish(RequestId id, FinishReason reason, std::string_view detail = {});

  // Takes a running request off its slot and puts it back in the queue at its original place, with
  // its full history; it is re-prefilled from position 0 on its next admission (failover of a slot,
  // or preemption). Deferred like Abort when in flight. The queue bound does not apply (the request
  // was already accepted). Queued: no-op. NotFound when unknown.
  absl::Status Requeue(RequestId id);

  // Builds the next step. FailedPrecondition if a plan is in flight. An empty plan (step_id 0)
  // means nothing can run; it does not count as in flight.
  absl::StatusOr<StepPlan> Schedule(absl::Time now);

  // With exactly one plan in flight: the step that follows it when nothing but decoding would
  // change: one `ahead` entry per request whose in-flight entry samples, that has no pending
  // abort/requeue and that can still generate after that token. Empty (step_id 0, not in flight)
  // when Schedule() after the in-flight plan would do anything else: a running request not in the
  // plan or still prefilling, or a queued request that could be admitted. With MTP the entries
  // follow (PlanEntry::follows): the in-flight answer's length is not known yet. FailedPrecondition
  // with zero or two plans in flight. Deadlines are checked as in Schedule().
  absl::StatusOr<StepPlan> ScheduleAhead(absl::Time now);

  // Applies the worker's results of the oldest in-flight plan and returns the events (outbox
  // first). FailedPrecondition: no plan in flight or another step id. InvalidArgument:
  // results.status OK but tokens.size() != plan.n_sampled. On error nothing changes and the plan
  // stays in flight.
  absl::StatusOr<std::vector<Event>> Apply(const StepPlan& plan, const StepResults& results,
                                           absl::Time now);

  std::vector<Event> TakeEvents();

  // Target slot count, >= 1. Growing is effective at the next Schedule(); shrinking never stops a
  // running request: a busy slot at index >= n retires when its request ends.
  absl::Status SetSlots(int n);
  // Applies to admissions from now on; running requests keep their reservation even if it no longer
  // fits. Queued requests that can never fit under the new policy finish with kError.
  // The worker's MTP drafts per decode (SchedulerConfig::mtp_drafts); set when it reports them.
  void SetMtpDrafts(int32_t drafts) { config_.mtp_drafts = drafts < 0 ? 0 : drafts; }
  absl::Status SetContextPolicy(const ContextPolicy& policy);
  // Prefix cache (issue #17, scheduler/core/prefix_tree.h): on when the worker keeps a
  // checkpoint store. Turning it off (or a new budget of 0) forgets every checkpoint.
  void SetPrefixCache(const PrefixCacheConfig& config);
  // Positions of `tokens` a request admitted now would resume from (0: none; for placement).
  int32_t CachedPrefix(std::span<const int32_t> tokens) const;
  const PrefixTree& prefix_tree() const { return tree_; }
  // Stops accepting (Add -> Unavailable); queued and running requests still complete.
  void Drain();
  void Resume();

  SchedulerStatus Status() const;
  absl::StatusOr<RequestInfo> Get(RequestId id) const;
  // The request to Add() on another worker to continue this one: prompt, generated so far, the same
  // max_new_tokens, priority, stop ids, arrival and deadline.
  absl::StatusOr<Request> ExportForReplay(RequestId id) const;
  // Nothing queued, running or in flight (a drain is complete).
  bool Idle() const { return seqs_.empty(); }
  // Requests preempted so far (ContextPolicy::overcommit_headroom); cheap, for the daemon's log.
  uint64_t preemptions() const { return preemptions_; }
  bool plan_in_flight() const { return !in_flight_.empty(); }
  int plans_in_flight() const { return static_cast<int>(in_flight_.size()); }
  const SchedulerConfig& config() const { return config_; }

 private:
  enum class Pending : uint8_t { kNone, kFinish, kRequeue };

  struct Seq {
    Request req;                  // prompt/generated moved into `tokens`
    std::vector<int32_t> tokens;  // [n_prompt + n_generated] full history
    int32_t n_prompt = 0;
    int32_t computed = 0;  // positions in the slot state
    std::vector<int32_t> prompt_pieces;  // Request::prompt_pieces, extended as pieces are planned
    int slot = -1;         // -1 while queued
    int64_t reserved = 0;  // positions reserved while running
    uint64_t seq = 0;      // acceptance order
    int plans = 0;               // in-flight plans with an entry of this request (0..2)
    int samples_in_flight = 0;   // ... of which sample a token
    int32_t planned_end = 0;     // position after its last in-flight entry
    bool planned_sample = false;  // its last in-flight entry samples
    // Finished while a plan was still in flight: the Finished event is out, the slot stays bound
    // until the last such plan is applied; invisible to Abort/Finish/Requeue/Get.
    bool zombie = false;
    // Requeue pending while a plan is still in flight: its in-flight results are dropped.
    bool stale = false;
    Pending pending = Pending::kNone;
    FinishReason pending_reason = FinishReason::kAborted;
    std::string pending_detail;
    RequestTimings timings;
    // Prefix cache: the longest prefix of the prompt shared with another request seen so far,
    // and the checkpoints its prefill saves (position, id), ascending.
    int32_t shared = 0;
    std::vector<std::pair<int32_t, uint64_t>> cuts;
    bool save_on_release = false;  // finished (stop / length) while in flight: save when freed

    int32_t n_generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
    int32_t remaining() const { return static_cast<int32_t>(tokens.size()) - computed; }
    RequestQueue::Key key() const { return {req.priority, seq, req.id}; }
  };

  explicit Scheduler(const SchedulerConfig& config);

  // Positions an admission reserves under the current policy and slot count.
  int64_t Reservation(const Seq& s) const;
  // Over-commit (ContextPolicy::overcommit_headroom > 0): every running sequence whose
  // reservation its known tokens have reached grows it, oldest admission first; when the pool
  // cannot hold the growth, the youngest running sequences are preempted (RequeueNow). Only
  // with no plan in flight. Returns whether it preempted.
  bool GrowReservations();
  bool Overcommit() const {
    return config_.context.kind == ContextPolicy::Kind::kPool &&
           config_.context.overcommit_headroom > 0;
  }
  int64_t PerSlotCap() const;
  // OK, or InvalidArgument when prompt + max_new_tokens can never fit a slot.
  absl::Status CheckFits(RequestId id, int64_t need_tokens) const;
  int FreeSlot() const;
  void AddEntry(Seq& s, int32_t n, StepPlan& plan);
  // Tokens of s's next prefill piece within `budget` (> 0): the recorded cut of the prompt where
  // there is one and it fits, else min(remaining, budget, max_chunk); a piece never crosses the
  // end of the prompt, so re-prefilled generated tokens form decode-path pieces of their own.
  int32_t NextPiece(const Seq& s, int32_t budget) const;
  void Admit(Seq& s, int slot, absl::Time now);
  // Frees the slot and reservation of a running request (retiring the slot if it is past target).
  void Unbind(Seq& s);
  // Emits Finished and forgets the request (queued or running, not in flight).
  void FinishNow(Seq& s, FinishReason reason, std::string detail, absl::Time now);
  // FinishNow, or with a plan still in flight: the event now, the slot when that plan is applied.
  void FinishSoon(Seq& s, FinishReason reason, std::string detail, absl::Time now);
  Event FinishedEvent(Seq& s, FinishReason reason, std::string detail, absl::Time now);
  void RequeueNow(Seq& s);
  void FailQueuedThatNoLongerFit();
  // Finishes expired requests (kAborted); one with a plan in flight (ScheduleAhead) when that
  // plan is applied.
  void ExpireDeadlines(absl::Time now);
  absl::Status MarkDone(RequestId id, Pending action, FinishReason reason, std::string_view detail);
  // Prefix cache helpers (no-ops when it is off).
  bool PrefixOn() const { return config_.prefix_cache.enabled; }
  // On Add: the new request's shared prefix; earlier requests still before it get a cut there.
  void NotePrefix(Seq& s);
  // Plans a checkpoint of s at `pos` (its prompt's first pos tokens) if none is there.
  void AddCut(Seq& s, int32_t pos);
  // At admission: the checkpoint to resume from (null: none), or `wait` when a running
  // request is about to save a much longer one.
  const PrefixCheckpoint* ResumePoint(const Seq& s, const StepPlan& plan, bool* wait) const;
  void PlanCuts(Seq& s);
  void DropCuts(Seq& s);           // forgets cuts not yet in a plan
  void SaveOnRelease(Seq& s);      // a finished request's state, saved before its slot is reset
  void ApplyCheckpoints(const StepPlan& plan, const StepResults& results);

  SchedulerConfig config_;
  absl::flat_hash_map<RequestId, std::unique_ptr<Seq>> seqs_;
  RequestQueue queue_;
  std::vector<Seq*> running_;     // admission order: the order decodes and chunks are planned in
  std::vector<Seq*> slot_owner_;  // [max(target, highest busy + 1)]; nullptr = free
  int64_t reserved_total_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t next_step_ = 1;
  std::vector<uint64_t> in_flight_;  // step ids issued and not applied, oldest first (<= 2)
  uint64_t steps_applied_ = 0;
  uint64_t preemptions_ = 0;
  bool draining_ = false;
  absl::Time last_now_ = absl::InfinitePast();  // for events emitted outside a timed call
  std::vector<Event> outbox_;
  std::vector<int> released_;  // slots freed since the last issued plan
  std::vector<CheckpointSave> saves_;  // prefix cache: saves travelling with the next plan
  PrefixTree tree_;
  PrefixCacheStats prefix_stats_;
  uint64_t tick_ = 0;  // logical time of the prefix tree (adds)
};

}  // namespace ds::sched
