// `deltaserve scheduler`: the scheduler daemon (one per worker group). Serves the internal
// Scheduler service (cluster.proto) on a loopback address by default.
#pragma once
#include <string>

#include "common/util/status.h"
#include "scheduler/daemon/scheduler_loop.h"

namespace ds {

struct SchedulerDaemonOptions {
  std::string listen = "127.0.0.1:50061";
  std::string port_file;  // written with the bound port once listening (tests use --listen :0)
  // Internal listener security (docs/tp.md "Multi-host"): bearer tokens every worker / gateway
  // call must carry, and TLS (PEM certificate + key). A non-loopback --listen needs a key file
  // or an explicit allow_unauthenticated (trusted private network only).
  std::string internal_key_file;
  std::string tls_cert, tls_key;
  bool allow_unauthenticated = false;
  sched::LoopOptions loop;
};

absl::StatusOr<SchedulerDaemonOptions> ParseSchedulerFlags(int argc, char** argv);

// Serves until SIGINT / SIGTERM; then fails pending requests, shuts the worker down and exits.
int RunSchedulerDaemon(int argc, char** argv);

}  // namespace ds
