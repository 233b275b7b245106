// `deltaserve bench --tp N`: the rank processes and their collective, and the all-reduce
// latency rows (see bench.h). Kept apart from bench.cc, which runs the same rows at any TP.
#pragma once
#include <memory>
#include <string>

#include "common/collective/collective.h"
#include "common/util/status.h"
#include "tools/bench/bench.h"

namespace ds {

// The parent of a TP bench: re-runs this binary as `deltaserve bench <args> --tp-rank r
// --tp-store DIR --device gpus[r]` for every rank (rank 0's output is the bench's output, the
// others' go to DIR/rank<r>.log, printed if that rank fails) and waits for all. Returns the exit
// code: 0 when every rank succeeded.
int RunBenchTpParent(const BenchOptions& o, int argc, char** argv);

// In a rank process: the group over Gloo (FileStore at o.tp_store), made device-capable by
// o.tp_collective: "custom" (IPC all-reduce), "staged" (Gloo through the host) or "nccl".
absl::StatusOr<std::unique_ptr<Collective>> MakeBenchCollective(const BenchOptions& o);

// Latency of AllReduceSumOnStream on `rows` rows of n_embd floats (every rank calls it in
// lock-step): median microseconds per call, eager (back-to-back calls, one sync per 100) and
// from a CUDA graph of 100 captured calls (0 when the collective cannot be captured).
struct AllReduceTiming {
  double eager_us = 0;
  double graph_us = 0;
};
absl::StatusOr<AllReduceTiming> TimeAllReduce(Collective& c, int device, size_t n_floats);

}  // namespace ds
