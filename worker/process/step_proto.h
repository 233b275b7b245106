// The process edge of the step protocol: deltaserve.internal Step / StepResult <-> the plain
// types of step_types.h. The worker session converts each Step it reads and each result it writes;
// the reverse directions serve tests and tools. The conversions keep every field, so a result
// serializes to the same bytes as one the executor would have filled in place.
#pragma once
#include "deltaserve/internal/cluster.pb.h"
#include "worker/process/step_types.h"

namespace ds::worker {

// `out` is overwritten; its vectors keep their capacity (one Step object reused per session).
// `logprobs` is clamped to sampling::kMaxLogprobs (the most the sampler returns).
void FromProto(const deltaserve::internal::Step& in, Step* out);
void ToProto(const Step& in, deltaserve::internal::Step* out);

void FromProto(const deltaserve::internal::StepResult& in, StepResult* out);
void ToProto(const StepResult& in, deltaserve::internal::StepResult* out);

}  // namespace ds::worker
