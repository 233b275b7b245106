// The daemon's loop thread: the only owner of the schedulers (one ds::sched::Scheduler per replica:
// a worker or TP group with its own slots and queue) and of the worker session state
// (scheduler/daemon/README.md has the threading diagram). gRPC threads push Commands; the loop
// drains them, places each new request on the replica with the most free capacity, schedules each
// replica, sends its Steps, applies the StepResults when they come back (as commands too) and
// routes Events to each Submit call's EventChannel. A lost replica's requests continue on the
// others.
#pragma once
#include <atomic>
#include <deque>
#include <functional>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <span>
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
  // The worker's paged KV pool (issue #23); 0 tokens: none reported.
  int64_t kv_pool_tokens = 0;
  int kv_page_size = 0;
  // MTP on the worker (issue #15): drafts per decode (0 = off), `auto` lowering them.
  int mtp_drafts = 0;
  bool mtp_auto = false;
  bool follows_work = false;  // continues SlotWork.follows (MTP steps sent ahead)
  int active_slots = 0;  // sequences the worker holds state for at once; 0 = every slot
  // Prefix cache (issue #17): the worker's checkpoint budget (0 = none) and where it keeps them.
  uint64_t prefix_cache_bytes = 0;
  std::string prefix_cache_tier;
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
  // Prefix cache: checkpoints saved (id, bytes), dropped to make room, not saved.
  std::vector<std::pair<uint64_t, uint64_t>> checkpoints_saved;
  std::vector<uint64_t> checkpoints_evicted;
  std::vector<uint64_t> checkpoints_failed;
  std::vector<uint32_t> drafts_offered;  // MTP: per sampled work, the drafts its verify offered
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
  // Proto conventions already mapped; seed 0 is replaced by a random seed at admission, so a
  // replay on another replica draws from the same stream.
  sampling::SamplingParams sampling;
  int logprobs = 0;
  std::shared_ptr<EventChannel> channel;
  bool admitted = false;  // Started routed (a replay after failover does not send it again)
  int replica = -1;       // ReplicaSnapshot::id of the replica whose core holds it; -1: held
  int n_prompt = 0;       // prompt tokens (the rest of a replayed sequence was generated)
};

// One replica: a worker (or TP group) with its own core, slots and queue.
struct ReplicaSnapshot {
  int id = 0;  // stable for the replica's life; a rejoining worker gets a new one
  WorkerInfo worker;
  WarmupInfo warmup;
  bool ready = false;
  double heartbeat_age_s = 0;
  int worker_slots = 0;     // slots the worker's backend was configured with (SetSlots bound)
  int worker_slot_ctx = 0;  // positions per worker slot (per-slot cap bound)
  SchedulerStatus core;
};

struct ClusterSnapshot {
  // The cluster as one: slots of every replica, summed counts, the shared policy / slot target.
  SchedulerStatus core;
  bool serving = false;  // at least one replica is ready
  std::vector<ReplicaSnapshot> replicas;
  int held = 0;  // requests of lost replicas waiting for one (failover)
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
  // Failover: the requests of a lost replica continue on the surviving ones (full history
  // re-prefilled, streamed tokens not re-sent, the sampler's position restored). With no replica
  // left, they are held this long for a new one; 0 = they fail at once with UNAVAILABLE.
  double failover_wait_s = 0;
  // A replica whose worker sent no heartbeat for this long is lost (a hung or stopped process;
  // heartbeats come from their own thread, so a long step is no hang). 0 = off.
  double heartbeat_timeout_s = 2.5;
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

  // Read by gRPC threads for validation; 0 while no worker is ready (every replica serves one
  // model, so one vocabulary).
  int n_vocab() const { return n_vocab_.load(std::memory_order_acquire); }
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }

 private:
  enum class WorkerState : uint8_t { kWarming, kReady };
  struct InFlight {
    StepPlan plan;
    SteadyClock::time_point t0;    // Schedule() started
    SteadyClock::time_point sent;  // the Step was written
  };
  // One worker (or TP group) and the core that schedules it.
  struct Replica {
    int id = 0;
    std::unique_ptr<Scheduler> core;
    std::shared_ptr<WorkerLink> link;
    WorkerState state = WorkerState::kWarming;
    WorkerInfo info;
    WarmupInfo warmup;
    int slots = 0;
    int slot_ctx = 0;
    SteadyClock::time_point deadline;   // in flight (step or warmup): lost past it
    std::deque<InFlight> flight;        // issued, not answered; oldest first (<= 2)
    SteadyClock::time_point last_result;  // when the previous step's answer was handled
    bool lookahead = false;
    bool last_plan_empty = false;
    bool busy() const { return !flight.empty() || state == WorkerState::kWarming; }
  };

  explicit SchedulerLoop(const LoopOptions& opts, std::unique_ptr<Scheduler> config_core);
  void Run();
  // When the loop must look again without a command (a deadline, runnable work, a hold).
  SteadyClock::time_point NextWake() const;
  void Handle(AddCmd& c);
  void Handle(AbortCmd& c);
  void Handle(FinishCmd& c);
  void Handle(AdminCmd& c);
  // The policy `p` bounded by the replica's KV pool: admissions reserve at most what the pool
  // holds (less one partial page per slot, the rounding of each sequence to whole pages), so a
  // running sequence never finds the worker's pool dry.
  ContextPolicy BoundByPool(const Replica& r, ContextPolicy p) const;
  void Handle(WorkerJoinCmd& c);
  void Handle(WorkerWarmupCmd& c);
  void Handle(WorkerStepCmd& c);
  void Handle(WorkerGoneCmd& c);
  void Handle(StopCmd& c);
  Replica* FindReplica(const WorkerLink* link);
  Replica* FindReplica(int id);
  // Ready replicas, most free capacity (target slots - running - queued) first, ties: the least
  // loaded; PlaceNew is the first of them, or null.
  std::vector<Replica*> ReadyByFreeCapacity();
  // With the prefix cache, a replica with a free slot that holds a longer cached prefix of
  // `prompt` goes first.
  Replica* PlaceNew(std::span<const int32_t> prompt);
  // A lost replica: its requests continue on the others (or are held, or fail), it is removed.
  void LoseReplica(Replica* r, const std::string& why);
  // Adds a replayed request to a ready replica; false when none takes it.
  bool Replay(Request req);
  // Applies a replica's in-flight plans as failed and routes their events.
  void FailInFlightPlan(Replica* r, const std::string& why, bool unavailable);
  // Ends a request the loop holds outside any core (held, or its core is gone): Finished{reason}.
  void FinishOutsideCore(RequestId id, FinishReason reason, const std::string& why,
                         bool unavailable);
  void FailRequest(RequestId id, const std::string& why, bool unavailable);
  void FailAll(const std::string& why, bool unavailable);
  // Schedule() (or, ahead, ScheduleAhead()) on the replica's core and send the plan.
  void ScheduleAndSend(Replica* r, bool ahead);
  void Route(std::vector<Event> events, const absl::flat_hash_map<RequestId, TokenLogprobInfo>* lps,
             bool unavailable);
  // Admin changes go to config_core_ (the template every new replica copies) and every replica.
  absl::Status ForEachCore(const std::function<absl::Status(Scheduler&)>& f);
  void ApplyTemplate(Scheduler* core) const;
  ClusterSnapshot Snapshot(bool with_step_stats = true) const;
  void UpdateMetrics();
  int64_t PerSlotCapFor(int n_slots, const ContextPolicy& p) const;
  bool serving() const;

  LoopOptions opts_;
  // Never scheduled: holds the slot target, the context policy and the drain flag that admin
  // commands set, validates them, and is what status shows while no replica exists.
  std::unique_ptr<Scheduler> config_core_;
  CommandQueue<Command> commands_;
  std::thread thread_;
  std::atomic<int> n_vocab_{0};
  std::atomic<bool> stopped_{false};
  bool stop_ = false;

  absl::flat_hash_map<RequestId, RequestSide> side_;  // every queued, running or held request
  std::vector<std::unique_ptr<Replica>> replicas_;
  int next_replica_id_ = 0;
  std::vector<Request> held_;            // requests of a lost replica waiting for a ready one
  SteadyClock::time_point hold_until_;   // ... until then, then they fail UNAVAILABLE
  std::string hold_why_;

  StepStats stats_;
  metrics::SchedulerMetrics* metrics_ = nullptr;
  std::shared_ptr<sd::Watchdog::Loop> watchdog_;
  absl::flat_hash_map<std::string, double> worker_heartbeats_;  // id -> last heartbeat (metrics)
  SteadyClock::time_point last_log_;
  uint64_t steps_at_last_log_ = 0;
};

}  // namespace ds::sched
