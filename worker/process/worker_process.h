// `deltaserve worker`: one process per device. Creates the backend, dials the scheduler and serves
// its WorkerSession stream (cluster.proto): Register -> Configure -> Warmup -> Steps until Shutdown.
#pragma once
#include <functional>
#include <mutex>
#include <string>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"
#include "worker/process/device_tuning.h"
#include "worker/spec/mtp_setting.h"

namespace ds {
namespace metrics {
class WorkerMetrics;
}
namespace sd {
class Watchdog;
}

struct WorkerOptions {
  std::string scheduler;          // HOST:PORT of the scheduler daemon
  std::string model;              // GGUF path
  std::string backend = "auto";   // cpu | cuda | auto
  std::string worker_id;          // default: hostname:pid
  int threads = 0;                // CPU backend threads (0 = all cores)
  int device = 0;                 // CUDA device ordinal
  double connect_timeout_s = 30;  // give up dialing after this long
  // Heartbeats come from their own thread, so a long step never delays them; the scheduler calls
  // a worker lost after --heartbeat-timeout (default 2.5 s: five missed beats).
  double heartbeat_s = 0.5;
  // Tensor parallelism (docs/tp.md §6): rank tp_rank of the tp_world processes of group tp_group;
  // tp_split = share weights ("1,2") or "mem". Where the other ranks reach this one
  // (docs/tp.md "Multi-host"): tp_iface (an interface: Gloo binds its address, NCCL gets it as
  // NCCL_SOCKET_IFNAME), else tp_addr (Gloo: an IP or hostname), else the local address of the
  // route to the scheduler (127.0.0.1 for a loopback scheduler).
  int tp_rank = 0;
  int tp_world = 1;
  std::string tp_group = "tp";
  std::string tp_split;
  std::string tp_iface;
  std::string tp_addr;
  // The scheduler's internal listener beyond loopback: a token file (its first token is sent as
  // `authorization: Bearer`), TLS verified with this CA (empty: plaintext) and an optional
  // name to check in its certificate instead of the host of `scheduler`.
  std::string scheduler_key_file;
  std::string scheduler_ca;
  std::string scheduler_tls_name;
  // The group's collective: "auto" (tp_world > 1: Gloo for a CPU group; for a CUDA group the
  // custom IPC all-reduce when every rank is on one host, else NCCL when built with it, else
  // staged Gloo; none at tp_world 1), "custom" (CUDA: the IPC all-reduce or an error), "gloo"
  // (with the CUDA backend: Gloo behind a HostStagedCollective, a testing / fallback path that also allows several ranks
  // on one GPU), or "nccl" (CUDA backend; at tp_world 1 a one-rank NCCL communicator,
  // bootstrapped through the scheduler's rendezvous like a real group: the TP = 1 check of the
  // NCCL path).
  std::string tp_collective = "auto";
  // NVML index of the GPU whose utilisation / memory the worker exports: -1 = the CUDA device
  // when the backend is CUDA (none for the CPU backend), -2 = off.
  int nvml_device = -1;
  std::string port_file;  // written "<metrics port>\n" once /metrics listens (0 when off)
  // KV cache element type (--kv-type f16|q8_0|q4_0, worker/model/kv_type.h); non-f16 needs the
  // CUDA backend (the CPU backend refuses it).
  GgmlType kv_type = GgmlType::F16;
  // --portable, --dense-weights, --early-launch, --tiled-f16-formats, --f16-wgmma, --coarse-draft-head,
  // --deferred-drafts, --gdn-state: the device switches (device_tuning.h).
  DeviceTuning tuning;
  // Paged KV pool (issue #23): --kv-pool-tokens N (0 = what the planner finds room for, at most
  // every slot full), --kv-page N tokens per page (0 = the device's default), --memory-fraction F
  // of the device this worker plans for (two replicas on one GPU: 0.5 each).
  int64_t kv_pool_tokens = 0;
  int kv_page_size = 0;
  double memory_fraction = 1.0;
  int max_step_tokens = 0;  // --max-step-tokens: token rows per CUDA micro-step (0 = 4096)
  // --mtp K|auto|off (issue #15, worker/spec): MTP speculative decoding of the worker's slots;
  // the device keeps room for K + 1 verified tokens of up to mtp_seqs sequences per step.
  spec::MtpSetting mtp;
  int mtp_seqs = 8;  // --mtp-seqs: slots that may verify drafts in one step (CUDA memory)
  // --max-active N (issue #23): sequences holding recurrent state at once (0 = every slot); the
  // device keeps GDN state for N + 1 (the warmup scratch) instead of every configured slot.
  int max_active = 0;
  // Prefix cache (issue #17, worker/runner/checkpoint_store.h): --prefix-cache-mb N bytes of
  // checkpoints (0 or --prefix-cache off: none) kept --prefix-cache-tier auto|host|device
  // (auto: device memory where the backend can, else host RAM). Off under tensor parallelism.
  uint64_t prefix_cache_mb = 4096;
  std::string prefix_cache_tier = "auto";
};

absl::StatusOr<WorkerOptions> ParseWorkerFlags(int argc, char** argv);

// Asks a running worker to leave the cluster gracefully (SIGTERM / SIGINT in `deltaserve
// worker`): it finishes the step in progress, answers it, and closes its session; the scheduler
// moves its requests to the other replicas (or holds them for a new worker). RunWorker then
// returns OK. Thread-safe; a request before the session exists applies once it does.
class WorkerLeaveRequest {
 public:
  void Request();
  bool requested() const;
  // The session's hook (called under the lock, once, when requested); nullptr detaches.
  void Attach(std::function<void()> on_request);

 private:
  mutable std::mutex mu_;
  bool requested_ = false;
  std::function<void()> on_request_;
};

// Runs the session. OK after a Shutdown from the scheduler; an error when the scheduler cannot be
// reached, refuses the worker, or the stream breaks.
absl::Status RunWorker(const WorkerOptions& opts);
// The same with metrics (common/metrics/worker_metrics.h) and a systemd watchdog to feed from
// the step loop and the heartbeat thread; either may be null.
absl::Status RunWorker(const WorkerOptions& opts, metrics::WorkerMetrics* metrics,
                       sd::Watchdog* watchdog, WorkerLeaveRequest* leave = nullptr);

// Flags (and --config files) -> metrics -> RunWorker (READY=1 after warmup) -> exit code (0 after
// Shutdown, 1 with one clear log line otherwise, 2 for bad flags / config).
int RunWorkerProcess(int argc, char** argv);

}  // namespace ds
