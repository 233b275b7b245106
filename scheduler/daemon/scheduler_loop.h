// The daemon's loop thread: the only owner of the ds::sched::Scheduler and of the worker session
// state (scheduler/daemon/README.md has the threading diagram). gRPC threads push Commands; the
// loop drains them, schedules, sends one Step to the worker, applies the worker's StepResult when
// it comes back (as a command too) and routes Events to each Submit call's EventChannel.
#pragma once
#include <atomic>
#include <deque>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/metrics/scheduler_metrics.h"
#include "common/sampling/sampling_params.h"
#include "common/systemd/watchdog.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/daemon/channels.h"
#include "scheduler/daemon/step_stats.h"

namespace deltaserve::internal {
class SchedulerMessage;
}

namespace ds::sched {

using SteadyClock = std::chrono::steady_clock;

// ---- worker side (plain mirrors of the Register / WarmupDone / StepResult protos) ----

struct WorkerInfo {
  std::string id, device, model_fingerprint;
  int n_vocab = 0;
  int n_ctx_train = 0;
  uint64_t state_budget_bytes = 0, kv_bytes_per_token = 0, recurrent_bytes_per_slot = 0;
  uint64_t weights_bytes = 0;
};

struct WarmupInfo {
  double decode_tps = 0, prefill_tps = 0;
  uint64_t weights_bytes = 0, kv_bytes = 0, state_bytes = 0, workspace_bytes = 0;
};

struct WorkerSampled {
  int slot = 0;
  int32_t token = 0;
  std::optional<TokenLogprobInfo> logprob;
};

struct WorkerStepResult {
  uint64_t step_id = 0;
  std::string error;  // non-empty: the worker failed the step
  std::vector<WorkerSampled> tokens;
  double forward_seconds = 0, sample_seconds = 0;
  double handle_seconds = 0;  // receipt -> reply on the worker (>= forward + sample)
};

// The outgoing half of one worker's session, implemented by the WorkerSession handler. The loop
// only holds it; a worker group (tensor parallel) would be one link fanning out to its ranks.
class WorkerLink {
 public:
  virtual ~WorkerLink() = default;
  // False when the stream is gone (the loop then treats the worker as lost).
  virtual bool Send(const deltaserve::internal::SchedulerMessage& m) = 0;
  // Ends the session from the scheduler's side (refused, lost, timed out); `why` becomes the
  // WorkerSession call's status. Idempotent.
  virtual void Close(const absl::Status& why) = 0;
  // Set by the session's reader thread on every Heartbeat (steady clock seconds).
  std::atomic<double> last_heartbeat{0};
};

// ---- commands (gRPC threads -> loop) ----

// Per-request data the core does not keep: what the worker needs in SequenceStart and where the
// events go.
struct RequestSide {
  sampling::SamplingParams sampling;  // proto conventions already mapped; seed 0 = worker picks
  int logprobs = 0;
  std::shared_ptr<EventChannel> channel;
  bool admitted = false;  // Started routed (a replay after failover does not send it again)
};

struct ClusterSnapshot {
  SchedulerStatus core;
  bool serving = false;
  bool has_worker = false;
  bool worker_ready = false;
  WorkerInfo worker;
  WarmupInfo warmup;
  double heartbeat_age_s = 0;
  int worker_slots = 0;     // slots the worker's backend was configured with (SetSlots bound)
  int worker_slot_ctx = 0;  // positions per worker slot (per-slot cap bound)
  int max_queue = 0;
  StepStatsSnapshot stats;
};

struct AddCmd {
  Request request;
  RequestSide side;
};
struct AbortCmd {
  RequestId id = 0;
  std::string why;
};
struct FinishCmd {
  RequestId id = 0;
  FinishReason reason = FinishReason::kStop;
  std::string detail;
  std::shared_ptr<std::promise<absl::Status>> done;
};
struct AdminCmd {
  enum class Op : uint8_t { kStatus, kSetSlots, kSetPolicy, kDrain, kResume, kStatsReset };
  Op op = Op::kStatus;
  int n_slots = 0;
  ContextPolicy policy;
  std::shared_ptr<std::promise<absl::StatusOr<ClusterSnapshot>>> done;
};
struct WorkerJoinCmd {
  std::shared_ptr<WorkerLink> link;
  WorkerInfo info;
};
struct WorkerWarmupCmd {
  std::shared_ptr<WorkerLink> link;
  WarmupInfo info;
};
struct WorkerStepCmd {
  std::shared_ptr<WorkerLink> link;
  WorkerStepResult result;
};
struct WorkerGoneCmd {
  std::shared_ptr<WorkerLink> link;
  std::string why;
};
struct StopCmd {};

using Command = std::variant<AddCmd, AbortCmd, FinishCmd, AdminCmd, WorkerJoinCmd, WorkerWarmupCmd,
                             WorkerStepCmd, WorkerGoneCmd, StopCmd>;

struct LoopOptions {
  SchedulerConfig core;
  int max_slots = 0;          // worker backend slots; 0 = max(--slots, 64 on a CUDA worker, 8 on CPU)
  int slot_ctx = 0;           // worker positions per slot; 0 = the policy's n_ctx
  double step_timeout_s = 120;  // a step (or warmup) taking longer means the worker is lost
  int warmup_tokens = 8;
  double log_interval_s = 10;   // step-overhead log line at most this often (0 = never)
  // Failover: when the worker (group) is lost, hold its requests this long for a replacement
  // worker and replay them there (full history re-prefilled, streamed tokens not re-sent);
  // 0 = fail them at once with UNAVAILABLE.
  double failover_wait_s = 0;
  // Send the next decode step before the current one is answered (Scheduler::ScheduleAhead,
  // docs/async_scheduling.md): the control path runs while the worker (or TP group) computes.
  bool lookahead = true;
};

class SchedulerLoop {
 public:
  static absl::StatusOr<std::unique_ptr<SchedulerLoop>> Create(const LoopOptions& opts);
  ~SchedulerLoop();

  // Before Start(): gauges / histograms the loop keeps current (loop thread only) and the watchdog
  // loop it beats. The loop wakes at least every second either way.
  void SetMetrics(metrics::SchedulerMetrics* m) { metrics_ = m; }
  void SetWatchdogLoop(std::shared_ptr<sd::Watchdog::Loop> l) { watchdog_ = std::move(l); }

  void Start();
  // Fails every request ("scheduler shutting down"), sends Shutdown to the worker, joins.
  void Stop();
  void Push(Command cmd) { commands_.Push(std::move(cmd)); }

  // Read by gRPC threads for validation; 0 while no worker is ready.
  int n_vocab() const { return n_vocab_.load(std::memory_order_acquire); }
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }

 private:
  enum class WorkerState : uint8_t { kNone, kWarming, kReady };

  explicit SchedulerLoop(const LoopOptions& opts, std::unique_ptr<Scheduler> core);
  void Run();
  void Handle(AddCmd& c);
  void Handle(AbortCmd& c);
  void Handle(FinishCmd& c);
  void Handle(AdminCmd& c);
  void Handle(WorkerJoinCmd& c);
  void Handle(WorkerWarmupCmd& c);
  void Handle(WorkerStepCmd& c);
  void Handle(WorkerGoneCmd& c);
  void Handle(StopCmd& c);
  // Fails every request with kError (`unavailable` marks it retryable) and forgets the worker.
  void LoseWorker(const std::string& why);
  // Applies the in-flight plan (if any) as a failed step and routes its events.
  void FailInFlightPlan(const std::string& why, bool unavailable);
  void FailAll(const std::string& why, bool unavailable);
  // Failover: requeues every request of the lost worker (the core keeps its history).
  void HoldForReplay(const std::string& why);
  // Schedule() (or, ahead, ScheduleAhead()) and send the plan to the worker.
  void ScheduleAndSend(bool ahead);
  void Route(std::vector<Event> events, const absl::flat_hash_map<RequestId, TokenLogprobInfo>* lps,
             bool unavailable);
  ClusterSnapshot Snapshot() const;
  void UpdateMetrics();
  int64_t PerSlotCapFor(int n_slots, const ContextPolicy& p) const;

  LoopOptions opts_;
  std::unique_ptr<Scheduler> core_;
  CommandQueue<Command> commands_;
  std::thread thread_;
  std::atomic<int> n_vocab_{0};
  std::atomic<bool> stopped_{false};
  bool stop_ = false;

  absl::flat_hash_map<RequestId, RequestSide> side_;  // every queued or running request

  std::shared_ptr<WorkerLink> worker_;
  WorkerState state_ = WorkerState::kNone;
  WorkerInfo worker_info_;
  WarmupInfo warmup_;
  int worker_slots_ = 0;
  int worker_slot_ctx_ = 0;
  SteadyClock::time_point deadline_;  // in flight (step or warmup): the worker is lost past it
  bool holding_ = false;                // requests held for a replacement worker (failover)
  SteadyClock::time_point hold_until_;  // ... until then, then they fail UNAVAILABLE
  std::string hold_why_;

  struct InFlight {
    StepPlan plan;
    SteadyClock::time_point t0;    // Schedule() started
    SteadyClock::time_point sent;  // the Step was written
  };
  std::deque<InFlight> flight_;             // issued, not answered; oldest first (<= 2)
  SteadyClock::time_point last_result_;     // when the previous step's answer was handled
  bool lookahead_ = false;                  // opts_.lookahead, for the attached worker
  bool last_plan_empty_ = false;

  StepStats stats_;
  metrics::SchedulerMetrics* metrics_ = nullptr;
  std::shared_ptr<sd::Watchdog::Loop> watchdog_;
  std::string last_worker_id_;  // keeps deltaserve_worker_up{worker} at 0 once lost
  double last_heartbeat_ = 0;   // steady seconds
  SteadyClock::time_point last_log_;
  uint64_t steps_at_last_log_ = 0;
};

}  // namespace ds::sched
