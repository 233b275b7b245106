// Plain C++ structs that cross the gateway's edge: what a client asked for (GenerateInput), what
// survives validation and tokenization (PreparedRequest), what the scheduler sends back
// (InternalEvent) and what is streamed to the client (OutputChunk, FinishInfo). No protobuf types:
// the gRPC handlers translate at the edge (gateway/proto_convert.h) and everything between works on
// these.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/sampling/sampling_params.h"
#include "common/tokenizer/chat_format.h"

namespace ds::gw {

enum class PromptKind : uint8_t { kNone, kText, kChat, kIds };

// Sampling as the public API states it (0 means "disabled" for most fields).
struct SamplingInput {
  float temperature = 0;
  int32_t top_k = 0;
  float top_p = 0;
  float min_p = 0;
  float repetition_penalty = 0;
  float presence_penalty = 0;
  float frequency_penalty = 0;
  uint64_t seed = 0;
  int32_t mtp = -1;  // MTP drafts for this request: -1 = the server's setting, 0 = off, k = at most k
  bool json_object = false;  // response_format json_object: constrained to one JSON object
};

struct GenerateInput {
  PromptKind kind = PromptKind::kNone;
  std::string text;               // kText
  std::vector<ChatMessage> chat;  // kChat
  std::vector<int32_t> ids;       // kIds
  SamplingInput sampling;
  uint32_t max_tokens = 0;  // 0 = kDefaultMaxTokens
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  uint32_t logprobs = 0;
  int32_t priority = 0;
  bool ignore_eos = false;
  std::string request_id;  // client-chosen, echoed
};

inline constexpr uint32_t kDefaultMaxTokens = 256;
inline constexpr int32_t kMinPriority = -10;
inline constexpr int32_t kMaxPriority = 10;

// Limits of the public request (documented in proto/deltaserve/v1/deltaserve.proto). Every
// repeated or free-text field has one: the scheduler scans stop ids for every generated token and
// the request id is echoed in every streamed message and log line, so neither may grow with what
// a client sends. Stop strings: sampling::kMaxStopStrings of kMaxStopStringBytes each.
inline constexpr size_t kMaxStopTokenIds = 256;
inline constexpr size_t kMaxRequestIdBytes = 128;
inline constexpr size_t kMaxChatMessages = 1024;
// A whole request message (text, chat contents, token ids together); bigger ones are refused by
// gRPC with RESOURCE_EXHAUSTED before any parsing.
inline constexpr int kMaxRequestBytes = 4 << 20;
// All request metadata (headers) of one call.
inline constexpr int kMaxMetadataBytes = 8 << 10;

// A request ready for the scheduler: token ids, the sampler's own conventions, and the stop ids the
// scheduler must honour (the request's plus the model's EOS ids unless ignore_eos).
struct PreparedRequest {
  std::vector<int32_t> prompt_ids;
  uint32_t max_tokens = kDefaultMaxTokens;
  SamplingInput sampling;                 // as given (the scheduler maps 0 = disabled itself)
  std::vector<int32_t> stop_ids;          // sent to the scheduler
  // Prefix cache: where the last chat messages start in prompt_ids (MessageStartHints), sent to
  // the scheduler, which checkpoints the state there.
  std::vector<int32_t> checkpoint_hints;
  std::vector<std::string> stop_strings;  // matched here
  uint32_t logprobs = 0;
  int32_t priority = 0;
  bool ignore_eos = false;
};

struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0;
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0;
  std::vector<TopLogprob> top;
};

enum class FinishReason : uint8_t { kUnspecified, kLength, kStop, kCancelled, kError };

struct ServerTimings {
  double queue_seconds = 0;
  double ttft_seconds = 0;
  double total_seconds = 0;
  double mean_itl_seconds = 0;
  double tokens_per_step = 0;  // 1 + accepted MTP drafts per step on average (0: not reported)
  // MTP by draft position: verifies that judged a draft there, and those that kept it.
  std::vector<uint32_t> drafts_judged, drafts_accepted;
};

// One message of the internal Submit stream, translated.
struct InternalEvent {
  enum class Kind : uint8_t { kAdmitted, kToken, kFinished } kind = Kind::kToken;
  // kAdmitted
  uint32_t slot = 0;
  double queue_seconds = 0;
  // kToken
  int32_t token = 0;
  bool has_logprob = false;
  TokenLogprob logprob;
  // kFinished
  FinishReason reason = FinishReason::kUnspecified;
  ServerTimings timings;
  std::string error;
  uint32_t completion_tokens = 0;
};

// What one step of the output stream sends to the client.
struct OutputChunk {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;  // parallel to token_ids when requested
  bool empty() const { return text.empty() && token_ids.empty(); }
};

struct FinishInfo {
  FinishReason reason = FinishReason::kUnspecified;
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  ServerTimings timings;
  std::string stop_string;
};

}  // namespace ds::gw
