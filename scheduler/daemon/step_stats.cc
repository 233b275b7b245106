#include "scheduler/daemon/step_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace ds::sched {

StepStats::StepStats() {
  // 1-2-5 steps from 10 us to 1 s: the design goal (150 us) sits between two buckets' edges.
  for (double d = 10; d <= 1e6; d *= 10)
    for (double m : {1.0, 2.0, 5.0}) upper_.push_back(d * m);
  upper_.push_back(std::numeric_limits<double>::infinity());
  counts_.assign(upper_.size(), 0);
}

void StepStats::Record(const StepTiming& t) {
  const double o = std::max(0.0, t.overhead_us());
  const size_t b = std::lower_bound(upper_.begin(), upper_.end(), o) - upper_.begin();
  ++counts_[std::min(b, counts_.size() - 1)];
  if (ring_.size() < kRing) {
    ring_.push_back(o);
  } else {
    ring_[ring_pos_] = o;
    ring_pos_ = (ring_pos_ + 1) % kRing;
  }
  ++steps_;
  steps_ahead_ += t.ahead;
  sum_ += o;
  sum_worker_ += t.worker_us;
  sum_schedule_ += t.schedule_us;
  sum_apply_ += t.apply_us;
  sum_handle_ += t.worker_handle_us;
  max_ = std::max(max_, o);
}

void StepStats::Reset() { *this = StepStats(); }

StepStatsSnapshot StepStats::Snapshot() const {
  StepStatsSnapshot s;
  s.steps = steps_;
  s.steps_ahead = steps_ahead_;
  s.bucket_upper_us = upper_;
  s.bucket_count = counts_;
  if (steps_ == 0) return s;
  const double n = static_cast<double>(steps_);
  s.mean_us = sum_ / n;
  s.mean_worker_us = sum_worker_ / n;
  s.mean_schedule_us = sum_schedule_ / n;
  s.mean_apply_us = sum_apply_ / n;
  s.mean_worker_handle_us = sum_handle_ / n;
  s.max_us = max_;
  std::vector<double> v = ring_;
  std::sort(v.begin(), v.end());
  auto q = [&](double p) {
    return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
  };
  s.p50_us = q(0.50);
  s.p90_us = q(0.90);
  s.p99_us = q(0.99);
  return s;
}

std::string StepStatsSnapshot::ToString() const {
  return absl::StrFormat(
      "steps %d (%d sent ahead) | control overhead us: mean %.1f p50 %.1f p90 %.1f p99 %.1f "
      "max %.1f | "
      "mean worker compute %.1f us, worker bookkeeping %.1f us, schedule+send %.1f us, "
      "apply+route %.1f us, transport (rest) %.1f us",
      steps, steps_ahead, mean_us, p50_us, p90_us, p99_us, max_us, mean_worker_us,
      std::max(0.0, mean_worker_handle_us - mean_worker_us), mean_schedule_us, mean_apply_us,
      std::max(0.0, mean_us - std::max(0.0, mean_worker_handle_us - mean_worker_us) -
                        mean_schedule_us - mean_apply_us));
}

}  // namespace ds::sched
