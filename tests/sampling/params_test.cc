#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/sampling/sampling_params.h"

namespace ds::sampling {
namespace {

void ExpectInvalid(const SamplingParams& p, const std::string& field, int n_vocab = 100) {
  const absl::Status s = Validate(p, n_vocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
}

TEST(SamplingParams, DefaultsAndEdgesAreValid) {
  EXPECT_TRUE(Validate(SamplingParams{}, 100).ok());
  SamplingParams p{.temperature = 0.0f, .top_k = 1000, .top_p = 1.0f, .min_p = 1.0f};
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.penalty_last_n = -1;
  p.n_logprobs = 20;
  p.stop_ids = {0, 99};
  p.stop_strings = {"\n\n", "日本", std::string(kMaxStopStringBytes, 'x')};
  EXPECT_TRUE(Validate(p, 100).ok()) << Validate(p, 100);
}

TEST(SamplingParams, EachBadFieldIsNamed) {
  ExpectInvalid({.temperature = -0.1f}, "temperature");
  ExpectInvalid({.temperature = NAN}, "temperature");
  ExpectInvalid({.temperature = INFINITY}, "temperature");
  ExpectInvalid({.top_k = -1}, "top_k");
  ExpectInvalid({.top_p = 0.0f}, "top_p");
  ExpectInvalid({.top_p = 1.01f}, "top_p");
  ExpectInvalid({.top_p = NAN}, "top_p");
  ExpectInvalid({.min_p = -0.01f}, "min_p");
  ExpectInvalid({.min_p = 1.5f}, "min_p");
  ExpectInvalid({.min_p = NAN}, "min_p");
  ExpectInvalid({.repetition_penalty = 0.0f}, "repetition_penalty");
  ExpectInvalid({.repetition_penalty = -1.0f}, "repetition_penalty");
  ExpectInvalid({.presence_penalty = 2.5f}, "presence_penalty");
  ExpectInvalid({.presence_penalty = NAN}, "presence_penalty");
  ExpectInvalid({.frequency_penalty = -2.01f}, "frequency_penalty");
  ExpectInvalid({.penalty_last_n = -2}, "penalty_last_n");
  ExpectInvalid({.n_logprobs = 21}, "n_logprobs");
  ExpectInvalid({.n_logprobs = -1}, "n_logprobs");
  ExpectInvalid({.stop_ids = {5, 100}}, "stop_ids[1]");
  ExpectInvalid({.stop_ids = {-1}}, "stop_ids[0]");
  SamplingParams many;
  many.stop_strings.assign(kMaxStopStrings + 1, "x");
  ExpectInvalid(many, "stop_strings");
  ExpectInvalid({.stop_strings = {"a", ""}}, "stop_strings[1]");
  ExpectInvalid({.stop_strings = {std::string(kMaxStopStringBytes + 1, 'x')}}, "stop_strings[0]");
  ExpectInvalid({.stop_strings = {"ok", "\xE6\x97"}}, "stop_strings[1]");  // truncated UTF-8
  EXPECT_FALSE(Validate({}, 0).ok());
}

TEST(SamplingParams, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("\xC3\xA9\xE6\x97\xA5\xF0\x9F\x98\x80"));  // é 日 😀
  EXPECT_FALSE(IsValidUtf8("\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\xAF"));      // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xE6\x97"));          // truncated
}

}  // namespace
}  // namespace ds::sampling
