// The public API's sampling parameters (deltaserve.v1.SamplingParams) as the sampler's: one
// conversion for the scheduler (request admission) and the worker (the sampler it builds).
#pragma once
#include "common/sampling/sampling_params.h"
#include "deltaserve/v1/deltaserve.pb.h"

namespace ds::sampling {

// Proto conventions ("0 = disabled") -> the sampler's neutral values (top_p outside (0, 1) -> 1,
// repetition_penalty <= 0 -> 1). The seed is copied as is (0 = "random", left to the caller).
SamplingParams FromProto(const deltaserve::v1::SamplingParams& p, int n_logprobs);

}  // namespace ds::sampling
