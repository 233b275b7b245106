// Per-request sampling parameters and their validation (the gateway calls Validate before a request
// reaches a worker; Sampler assumes validated parameters but never crashes on bad ones).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ds::sampling {

inline constexpr int kMaxLogprobs = 20;
inline constexpr int kMaxMtpDrafts = 15;
inline constexpr float kMaxAbsPenalty = 2.0f;  // presence/frequency, as in the OpenAI API
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int top_k = 0;                    // 0 = off; >= vocab size is also off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int penalty_last_n = 64;  // window of history the penalties look at; -1 = whole history, 0 = off
  uint64_t seed = 0;
  int n_logprobs = 0;  // top-n logprobs to return, [0, kMaxLogprobs]
  // MTP drafts per step for this request (proto SamplingParams.mtp): -1 = the server's setting,
  // 0 = off, k = at most k (the worker's own setting caps it).
  int mtp_drafts = -1;
  // response_format json_object (proto SamplingParams.json_object): the generated text is
  // constrained to one JSON object (json_constraint.h); end-of-generation ids only once it is
  // complete.
  bool json_object = false;
  std::vector<int32_t> stop_ids = {};
  std::vector<std::string> stop_strings = {};
};

// InvalidArgument naming the offending field, or OK. n_vocab bounds stop_ids.
absl::Status Validate(const SamplingParams& params, int n_vocab);

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool IsValidUtf8(std::string_view s);

}  // namespace ds::sampling
