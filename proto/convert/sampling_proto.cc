#include "proto/convert/sampling_proto.h"

#include <algorithm>

namespace ds::sampling {

SamplingParams FromProto(const deltaserve::v1::SamplingParams& p, int n_logprobs) {
  SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = (p.top_p() <= 0.0f || p.top_p() >= 1.0f) ? 1.0f : p.top_p();
  s.min_p = p.min_p();
  s.repetition_penalty = p.repetition_penalty() <= 0.0f ? 1.0f : p.repetition_penalty();
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.seed = p.seed();
  s.n_logprobs = n_logprobs;
  // Out-of-range values pass through so Validate names them (16 and up, as given).
  s.mtp_drafts = p.has_mtp() ? static_cast<int>(std::min<uint32_t>(p.mtp(), 1u << 20)) : -1;
  s.json_object = p.json_object();
  return s;
}

deltaserve::v1::SamplingParams ToProto(const SamplingParams& s) {
  deltaserve::v1::SamplingParams p;
  p.set_temperature(s.temperature);
  p.set_top_k(s.top_k);
  p.set_top_p(s.top_p);
  p.set_min_p(s.min_p);
  p.set_repetition_penalty(s.repetition_penalty);
  p.set_presence_penalty(s.presence_penalty);
  p.set_frequency_penalty(s.frequency_penalty);
  p.set_seed(s.seed);
  if (s.mtp_drafts >= 0) p.set_mtp(static_cast<uint32_t>(s.mtp_drafts));
  p.set_json_object(s.json_object);
  return p;
}

}  // namespace ds::sampling
