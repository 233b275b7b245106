// `--mtp auto`'s cost side (issue #15): what a draft costs on this worker, measured, instead of
// the 27B's figure for every model. DraftPolicy drafts k when the tokens a verify is expected to
// give exceed 1 + cost * k, with cost = (a step that verifies k drafts and makes k more) / (a
// plain decode step) - 1, per draft. That ratio belongs to the model and the machine: ~0.13 on
// the 27B at one stream, where a step reads 21 GB of weights and a draft pass ~1 GB, but ~0.5
// on the launch-bound demo model (a verify of 5 tokens 1.8x a decode, a draft pass a third of
// one; docs/perf/h200.md), where sampled text (acceptance ~0.4) made `auto` 0.55-0.7x plain.
//
// The estimator times the worker's own steps of one sequence (the one-stream regime, where a
// step is that sequence's cost alone): a plain step (no draft verified, none made after it) and
// a cycle (k verified, k made). Plain steps do not happen while the policy drafts, so it asks for
// two in a row every kPlainEvery single-sequence steps (the second is the clean sample). Until it
// has both, Cost() is DraftPolicy::kDraftCost.
#pragma once

#include "worker/spec/draft_policy.h"

namespace ds::spec {

class DraftCostEstimator {
 public:
  // Single-sequence steps between two requested plain steps (~1-2% of a drafting sequence's
  // steps, each giving one token instead of a cycle's several).
  static constexpr int kPlainEvery = 128;
  // Weight of a new sample in the moving averages.
  static constexpr double kWeight = 0.2;
  // Bounds of a measured cost (a sample outside them is a hiccup of the host, not the model).
  static constexpr double kMinCost = 0.02, kMaxCost = 2.0;

  // Called when a single-sequence step decides its next drafts: true for two decisions in a row
  // every kPlainEvery, which then draft nothing.
  bool WantPlainStep();
  // One single-sequence step took `seconds`: it verified `offered` drafts and made `made` for
  // the next step. Only clean samples count: offered == made == 0 (plain) or offered == made > 0.
  void Record(int offered, int made, double seconds);
  // The cost of one draft relative to a plain step (DraftPolicy::Next's draft_cost).
  double Cost() const;
  bool measured() const { return cost_ > 0.0; }  // set only once a plain step is timed too
  double plain_seconds() const { return plain_seconds_; }

 private:
  int steps_ = 0;
  double plain_seconds_ = 0.0;  // moving average of clean plain steps; 0: none yet
  double cost_ = 0.0;           // moving average of per-draft cost samples; 0: none yet
};

// `--mtp auto`'s drafts for a sequence's next step within `cap`: its policy's choice, at `cost`'s
// measured figure when the sequence is alone in the step (else the default), and none when a
// lone sequence's step is one of the plain steps the estimator asks for.
int AutoDrafts(DraftPolicy& policy, DraftCostEstimator& cost, int cap, bool alone);

}  // namespace ds::spec
