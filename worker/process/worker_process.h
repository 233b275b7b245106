// `deltaserve worker`: one process per device. Creates the backend, dials the scheduler and serves
// its WorkerSession stream (cluster.proto): Register -> Configure -> Warmup -> Steps until Shutdown.
#pragma once
#include <string>

#include "common/util/status.h"

namespace ds {

struct WorkerOptions {
  std::string scheduler;          // HOST:PORT of the scheduler daemon
  std::string model;              // GGUF path
  std::string backend = "auto";   // cpu | cuda | auto
  std::string worker_id;          // default: hostname:pid
  int threads = 0;                // CPU backend threads (0 = all cores)
  int device = 0;                 // CUDA device ordinal
  double connect_timeout_s = 30;  // give up dialing after this long
  double heartbeat_s = 1.0;
};

absl::StatusOr<WorkerOptions> ParseWorkerFlags(int argc, char** argv);

// Runs the session. OK after a Shutdown from the scheduler; an error when the scheduler cannot be
// reached, refuses the worker, or the stream breaks.
absl::Status RunWorker(const WorkerOptions& opts);

// Flags -> RunWorker -> exit code (0 after Shutdown, 1 with one clear log line otherwise).
int RunWorkerProcess(int argc, char** argv);

}  // namespace ds
