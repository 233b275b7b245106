// Per-step control overhead of the daemon: the time a step spends outside the worker's compute
// (Schedule + translate + send + RPC both ways + worker bookkeeping + Apply + event routing).
// Fixed log-spaced buckets (Prometheus-style cumulative export later) plus a ring of recent
// samples for exact percentiles.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ds::sched {

struct StepTiming {
  double total_us = 0;     // Schedule() start -> events routed
  double worker_us = 0;    // forward + sample as the worker measured them
  double schedule_us = 0;  // Schedule + translate + send
  double apply_us = 0;     // result translate + Apply + routing
  double worker_handle_us = 0;  // receipt -> reply on the worker (worker_us + its bookkeeping)
  int n_tokens = 0;        // plan tokens
  int n_seqs = 0;          // plan entries
  bool ahead = false;      // sent before the previous step's answer (Scheduler::ScheduleAhead)
  double overhead_us() const { return total_us - worker_us; }
};

struct StepStatsSnapshot {
  uint64_t steps = 0;
  uint64_t steps_ahead = 0;  // of which sent ahead
  double mean_us = 0, p50_us = 0, p90_us = 0, p99_us = 0, max_us = 0;  // overhead
  double mean_worker_us = 0, mean_schedule_us = 0, mean_apply_us = 0;
  double mean_worker_handle_us = 0;  // of which on the worker outside forward + sample: this - worker
  std::vector<double> bucket_upper_us;  // le; the last is +inf
  std::vector<uint64_t> bucket_count;   // non-cumulative
  std::string ToString() const;
};

class StepStats {
 public:
  StepStats();
  void Record(const StepTiming& t);
  StepStatsSnapshot Snapshot() const;  // percentiles over the last kRing steps
  void Reset();
  uint64_t steps() const { return steps_; }

 private:
  static constexpr size_t kRing = 8192;
  std::vector<double> upper_;
  std::vector<uint64_t> counts_;
  std::vector<double> ring_;  // [min(steps, kRing)] recent overheads
  size_t ring_pos_ = 0;
  uint64_t steps_ = 0, steps_ahead_ = 0;
  double sum_ = 0, sum_worker_ = 0, sum_schedule_ = 0, sum_apply_ = 0, sum_handle_ = 0, max_ = 0;
};

}  // namespace ds::sched
