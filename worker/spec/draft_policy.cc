#include "worker/spec/draft_policy.h"

#include <algorithm>

namespace ds::spec {

void DraftPolicy::Record(int offered, int accepted) {
  offered = std::clamp(offered, 0, kMaxDrafts);
  accepted = std::clamp(accepted, 0, offered);
  // Positions before the first rejection were accepted, the rejected one was not; positions past
  // it were never judged.
  for (int i = 0; i < offered && i <= accepted; ++i) {
    const double seen = i < accepted ? 1.0 : 0.0;
    rate_[i] += kWeight * (seen - rate_[i]);
  }
}

int DraftPolicy::Next(int cap, double draft_cost) {
  cap = std::clamp(cap, 0, kMaxDrafts);
  int best = 0;
  double best_value = 1.0;  // no draft: one token for one step
  double expected = 1.0, reach = 1.0;
  for (int k = 1; k <= cap; ++k) {
    reach *= rate_[k - 1];
    expected += reach;
    const double value = expected / (1.0 + draft_cost * k);
    if (value > best_value) {
      best_value = value;
      best = k;
    }
  }
  if (best > 0 || cap == 0) {
    idle_steps_ = 0;
    return best;
  }
  if (++idle_steps_ >= kProbeEvery) {
    idle_steps_ = 0;
    return 1;  // a probe
  }
  return 0;
}

}  // namespace ds::spec
