// The memory plan with or without the 16-bit copies of the layer matrices
// (worker/model/dense_weights.h): `on` charges them to the weights (and fails as the planner does
// when they do not fit), `off` leaves them out, `auto` plans both ways and keeps the copies only
// when the plan with them has the same KV pool and prefix-cache share as the plan without: the
// copies then take memory that the configured slots and contexts could never use. Pure arithmetic
// on MemoryPlanInput (tests/runner/dense_weights_plan_test.cc), used by the CUDA device at start.
#pragma once
#include <cstdint>
#include <string>

#include "common/util/status.h"
#include "worker/model/dense_weights.h"
#include "worker/runner/memory_planner.h"

namespace ds {

struct DenseWeightsPlan {
  bool dense = false;  // make the copies
  MemoryPlan plan;     // the plan to allocate (its weights include the copies when dense)
  // One line for the worker's log: the choice and, for auto, why ("auto: on, 44.9 GiB of copies
  // beside an unchanged KV pool of 524,288 tokens" / "auto: off, the copies would shrink ...").
  std::string reason;
};

// `in.weights` excludes the copies; `dense_bytes` is what they take (0: nothing to copy, e.g. an
// F32 model, and then the answer is always no copies).
absl::StatusOr<DenseWeightsPlan> PlanDenseWeights(const MemoryPlanInput& in, uint64_t dense_bytes,
                                                  DenseWeights mode);

}  // namespace ds
