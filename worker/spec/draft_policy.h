// `--mtp auto`'s second half (issue #15): drafts per sequence from what that sequence accepts.
// DraftsForBatch (mtp_setting.h) caps the drafts by the batch; within the cap a sequence whose
// drafts are rejected drafts fewer, down to none, because a draft that is rejected still costs
// its MTP pass and a verify row. Each sequence keeps its own estimate (acceptance depends on the
// text: code and repeated passages accept far more than free prose).
#pragma once
#include <array>

#include "common/sampling/sampling_params.h"

namespace ds::spec {

class DraftPolicy {
 public:
  // Most drafts a verify takes (the deepest position estimated); the estimate starts at
  // kPriorRate per position, so a new sequence drafts the cap until it has been seen.
  static constexpr int kMaxDrafts = sampling::kMaxMtpDrafts;
  static constexpr double kPriorRate = 0.6;
  // Weight of the newest verify in a position's moving average: about the last 10 verifies count.
  static constexpr double kWeight = 0.2;
  // Cost of one draft relative to a decode step: its MTP pass plus its verify row. Measured on
  // the 27B at one stream (docs/perf/h200.md): a cycle of 3 drafts 14.0 ms vs a decode 10.7 ms
  // (~0.10 of a step per draft); with the v5 decode kernel 12.44 vs 9.01 ms, 0.13: the decode
  // step got faster, the drafts (bound by the LM head's read) did not. A draft pays when it is
  // accepted more often than that. The default: a worker measures its own (draft_cost.h).
  static constexpr double kDraftCost = 0.13;
  // With no draft chosen, every kProbeEvery-th step still offers one, so the estimate can rise
  // again when the text turns predictable.
  static constexpr int kProbeEvery = 16;

  DraftPolicy() { rate_.fill(kPriorRate); }

  // A verify offered `offered` drafts and kept the first `accepted` of them.
  void Record(int offered, int accepted);
  // Drafts for the next verify within `cap` (0..kMaxDrafts): the k that maximizes the expected
  // tokens per verify over its cost, 1 + sum_{i<=k} prod_{j<=i} rate_j over 1 + draft_cost * k
  // (draft_cost: this worker's measured figure, DraftCostEstimator, where it has one).
  int Next(int cap, double draft_cost = kDraftCost);

  // The estimated probability that draft position i (0-based) is accepted once reached.
  double rate(int i) const { return rate_[i]; }

 private:
  std::array<double, kMaxDrafts> rate_{};
  int idle_steps_ = 0;  // steps since the last draft offered while Next chose none
};

}  // namespace ds::spec
