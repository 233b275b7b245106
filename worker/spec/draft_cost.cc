#include "worker/spec/draft_cost.h"

namespace ds::spec {

bool DraftCostEstimator::WantPlainStep() {
  steps_ = (steps_ + 1) % kPlainEvery;
  return steps_ == kPlainEvery - 2 || steps_ == kPlainEvery - 1;
}

void DraftCostEstimator::Record(int offered, int made, double seconds) {
  if (offered != made || seconds <= 0.0) return;
  if (offered == 0) {
    plain_seconds_ =
        plain_seconds_ > 0.0 ? plain_seconds_ + kWeight * (seconds - plain_seconds_) : seconds;
    return;
  }
  if (plain_seconds_ <= 0.0) return;
  const double sample = (seconds / plain_seconds_ - 1.0) / offered;
  if (sample < kMinCost || sample > kMaxCost) return;
  cost_ = cost_ > 0.0 ? cost_ + kWeight * (sample - cost_) : sample;
}

double DraftCostEstimator::Cost() const {
  return measured() ? cost_ : DraftPolicy::kDraftCost;
}

int AutoDrafts(DraftPolicy& policy, DraftCostEstimator& cost, int cap, bool alone) {
  if (alone && cost.WantPlainStep()) return 0;
  return policy.Next(cap, alone ? cost.Cost() : DraftPolicy::kDraftCost);
}

}  // namespace ds::spec
