// `deltaserve worker`: one process per device. Creates the backend, dials the scheduler and serves
// its WorkerSession stream (cluster.proto): Register -> Configure -> Warmup -> Steps until Shutdown.
#pragma once
#include <string>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"

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
  double heartbeat_s = 1.0;
  // Tensor parallelism (docs/tp.md §6): rank tp_rank of the tp_world processes of group tp_group;
  // tp_split = share weights ("1,2") or "mem"; tp_iface = Gloo interface (empty: 127.0.0.1).
  int tp_rank = 0;
  int tp_world = 1;
  std::string tp_group = "tp";
  std::string tp_split;
  std::string tp_iface;
  // The group's collective: "auto" (Gloo for a CPU group of tp_world > 1, none at tp_world 1),
  // "gloo", or "nccl" (CUDA backend; at tp_world 1 a one-rank NCCL communicator, bootstrapped
  // through the scheduler's rendezvous like a real group: the TP = 1 check of the NCCL path).
  std::string tp_collective = "auto";
  // NVML index of the GPU whose utilisation / memory the worker exports: -1 = the CUDA device
  // when the backend is CUDA (none for the CPU backend), -2 = off.
  int nvml_device = -1;
  std::string port_file;  // written "<metrics port>\n" once /metrics listens (0 when off)
  // KV cache element type (--kv-type f16|q8_0|q4_0, worker/model/kv_type.h); non-f16 needs the
  // CUDA backend (the CPU backend refuses it).
  GgmlType kv_type = GgmlType::F16;
};

absl::StatusOr<WorkerOptions> ParseWorkerFlags(int argc, char** argv);

// Runs the session. OK after a Shutdown from the scheduler; an error when the scheduler cannot be
// reached, refuses the worker, or the stream breaks.
absl::Status RunWorker(const WorkerOptions& opts);
// The same with metrics (common/metrics/worker_metrics.h) and a systemd watchdog to feed from
// the step loop and the heartbeat thread; either may be null.
absl::Status RunWorker(const WorkerOptions& opts, metrics::WorkerMetrics* metrics,
                       sd::Watchdog* watchdog);

// Flags (and --config files) -> metrics -> RunWorker (READY=1 after warmup) -> exit code (0 after
// Shutdown, 1 with one clear log line otherwise, 2 for bad flags / config).
int RunWorkerProcess(int argc, char** argv);

}  // namespace ds
