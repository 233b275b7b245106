// The scheduler core of one worker: a pure state machine (no I/O, no threads, no clock of its own:
// every call that needs time takes `now`). One loop thread owns it (scheduler/README.md).
//
// Cycle:   plan = Schedule(now)  ->  worker runs plan  ->  events = Apply(plan, results, now)
// At most one plan is in flight: Schedule() while one is in flight is FailedPrecondition. Add,
// Abort, Finish, Requeue, SetSlots, SetContextPolicy and Drain may be called at any time; what they
// do to a request of the in-flight plan takes effect when that plan's results are applied ("between
// steps").
//
// Events produced outside Apply (an abort of a queued request, deadline expiry in Schedule,
// requests that no longer fit after a policy change) wait in an outbox that the next Apply()
// returns first, or that TakeEvents() drains.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
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

  // Applies the worker's results of the in-flight plan and returns the events (outbox first).
  // FailedPrecondition: no plan in flight or another step id. InvalidArgument: results.status OK
  // but tokens.size() != plan.n_sampled. On error nothing changes and the plan stays in flight.
  absl::StatusOr<std::vector<Event>> Apply(const StepPlan& plan, const StepResults& results,
                                           absl::Time now);

  std::vector<Event> TakeEvents();

  // Target slot count, >= 1. Growing is effective at the next Schedule(); shrinking never stops a
  // running request: a busy slot at index >= n retires when its request ends.
  absl::Status SetSlots(int n);
  // Applies to admissions from now on; running requests keep their reservation even if it no longer
  // fits. Queued requests that can never fit under the new policy finish with kError.
  absl::Status SetContextPolicy(const ContextPolicy& policy);
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
  bool plan_in_flight() const { return in_flight_step_ != 0; }
  const SchedulerConfig& config() const { return config_; }

 private:
  enum class Pending : uint8_t { kNone, kFinish, kRequeue };

  struct Seq {
    Request req;                  // prompt/generated moved into `tokens`
    std::vector<int32_t> tokens;  // [n_prompt + n_generated] full history
    int32_t n_prompt = 0;
    int32_t computed = 0;  // positions in the slot state
    int slot = -1;         // -1 while queued
    int64_t reserved = 0;  // positions reserved while running
    uint64_t seq = 0;      // acceptance order
    bool in_plan = false;
    Pending pending = Pending::kNone;
    FinishReason pending_reason = FinishReason::kAborted;
    std::string pending_detail;
    RequestTimings timings;

    int32_t n_generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
    int32_t remaining() const { return static_cast<int32_t>(tokens.size()) - computed; }
    RequestQueue::Key key() const { return {req.priority, seq, req.id}; }
  };

  explicit Scheduler(const SchedulerConfig& config);

  // Positions an admission reserves under the current policy and slot count.
  int64_t Reservation(const Seq& s) const;
  int64_t PerSlotCap() const;
  // OK, or InvalidArgument when prompt + max_new_tokens can never fit a slot.
  absl::Status CheckFits(RequestId id, int64_t need_tokens) const;
  int FreeSlot() const;
  void AddEntry(Seq& s, int32_t n, StepPlan& plan);
  void Admit(Seq& s, int slot, absl::Time now);
  // Frees the slot and reservation of a running request (retiring the slot if it is past target).
  void Unbind(Seq& s);
  // Emits Finished and forgets the request (queued or running, not in flight).
  void FinishNow(Seq& s, FinishReason reason, std::string detail, absl::Time now);
  void RequeueNow(Seq& s);
  void FailQueuedThatNoLongerFit();
  void ExpireDeadlines(absl::Time now);
  absl::Status MarkDone(RequestId id, Pending action, FinishReason reason, std::string_view detail);

  SchedulerConfig config_;
  absl::flat_hash_map<RequestId, std::unique_ptr<Seq>> seqs_;
  RequestQueue queue_;
  std::vector<Seq*> running_;     // admission order: the order decodes and chunks are planned in
  std::vector<Seq*> slot_owner_;  // [max(target, highest busy + 1)]; nullptr = free
  int64_t reserved_total_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t next_step_ = 1;
  uint64_t in_flight_step_ = 0;  // 0: none
  uint64_t steps_applied_ = 0;
  bool draining_ = false;
  absl::Time last_now_ = absl::InfinitePast();  // for events emitted outside a timed call
  std::vector<Event> outbox_;
  std::vector<int> released_;  // slots freed since the last issued plan
};

}  // namespace ds::sched
