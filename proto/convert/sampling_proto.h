// The public API's sampling parameters (deltaserve.v1.SamplingParams) as the sampler's: one
// conversion for the scheduler (request admission) and the worker (the sampler it builds). It
// lives at the process edge, beside the generated code, so common/sampling stays free of protobuf.
#pragma once
#include "common/sampling/sampling_params.h"
#include "deltaserve/v1/deltaserve.pb.h"

namespace ds::sampling {

// Proto conventions ("0 = disabled") -> the sampler's neutral values (top_p outside (0, 1) -> 1,
// repetition_penalty <= 0 -> 1). The seed is copied as is (0 = "random", left to the caller).
SamplingParams FromProto(const deltaserve::v1::SamplingParams& p, int n_logprobs);

// The proto's fields of `s` (its neutral values are valid proto values: FromProto(ToProto(s)) is
// s for them). n_logprobs, penalty_last_n and the stop lists have no field here and are dropped.
deltaserve::v1::SamplingParams ToProto(const SamplingParams& s);

}  // namespace ds::sampling
