// The OpenAI HTTP API's request bodies (POST /v1/chat/completions and /v1/completions) -> the
// gateway's plain GenerateInput plus what only the HTTP edge needs (stream flags, the chat
// conversation, logprob shape). JSON stops here, as protobuf stops at proto_convert.cc. Every
// rejection is InvalidArgument naming the body field (`temperature must be a number`,
// `messages[2].role ...`); what we do not implement is refused by name rather than ignored:
// n > 1, best_of > 1, echo, suffix, tool_choice other than auto/none, and response_format
// json_schema (json_object is constrained decoding: SamplingInput::json_object; with it a chat's
// thinking is off and tool calls are not parsed, see ParseChatRequest).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/chat_template.h"
#include "common/util/status.h"
#include "gateway/request.h"

namespace ds::gw::http {

struct OpenAIRequest {
  bool chat = false;
  std::string model;  // empty: the served model
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Sampling, max_tokens, stop, seed, ignore_eos, logprobs (as a count of alternatives); the
  // prompt for completions (text or token ids). For chat the prompt is rendered and tokenized by
  // the caller (kind stays kNone here).
  GenerateInput input;
  // Logprobs: per generated token its logprob plus `top_logprobs` alternatives.
  bool logprobs = false;
  int top_logprobs = 0;
  // Chat only.
  std::vector<ChatTurn> messages;
  ChatRenderOptions render;
  bool parse_tool_calls = false;  // tools offered and tool_choice != none
};

absl::StatusOr<OpenAIRequest> ParseChatRequest(std::string_view body);
absl::StatusOr<OpenAIRequest> ParseCompletionRequest(std::string_view body);

}  // namespace ds::gw::http
