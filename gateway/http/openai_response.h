// JSON the OpenAI HTTP API answers with: the error shape and its HTTP status, logprobs in the chat
// and completions layouts, usage, finish reasons, server-sent-event framing. Pure functions of
// plain structs (tested in tests/http/openai_http_unit_test.cc).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/tokenizer/tokenizer.h"
#include "gateway/request.h"

namespace ds::gw::http {

using json = nlohmann::ordered_json;

// The one mapping from a final status (the gRPC code numbering, shared by absl) to HTTP:
// INVALID_ARGUMENT 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404,
// RESOURCE_EXHAUSTED 429 (overload: retry with backoff), CANCELLED 499, UNAVAILABLE 503 (not
// serving, draining, scheduler or worker gone: retry elsewhere), DEADLINE_EXCEEDED 504, else 500.
int HttpStatus(absl::StatusCode code);
// {"error": {"message", "type", "param": null, "code"}} with OpenAI's type names
// (invalid_request_error, authentication_error, rate_limit_error, ...).
json ErrorJson(absl::StatusCode code, std::string_view message);
// Serialization that never throws: bytes that are not UTF-8 (a logprob token can be half a
// character) become U+FFFD.
std::string Dump(const json& j);
// One server-sent event: "data: <json>\n\n".
std::string SseEvent(const json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// "stop", "length", "tool_calls" (a stop that ended with tool calls); null when unfinished.
json FinishReasonJson(FinishReason r, bool tool_calls);
json UsageJson(uint32_t prompt_tokens, uint32_t completion_tokens);

// Chat layout: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], `top`
// alternatives each.
json ChatLogprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, int top);
// Completions layout, accumulated over a stream: tokens, token_logprobs, top_logprobs (a
// {token: logprob} object per token) and text_offset.
struct CompletionLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  void Add(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, int top, size_t* offset);
  json ToJson() const;
};

}  // namespace ds::gw::http
