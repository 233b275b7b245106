#include "gateway/http/openai_response.h"

#include <cstdio>

#include "common/sampling/sampling_params.h"

namespace ds::gw::http {
namespace {

std::string Piece(const Tokenizer& tok, int32_t id) {
  auto p = tok.TokenToPiece(id);
  return p.ok() ? std::string(*p) : std::string();
}

// A token's text as OpenAI spells it: the text, or `bytes:\xe2\x80` when it is not whole UTF-8
// (half a character), so distinct byte tokens stay distinct keys in top_logprobs.
std::string TokenText(const std::string& piece) {
  if (sampling::IsValidUtf8(piece)) return piece;
  std::string s = "bytes:";
  char buf[8];
  for (char c : piece) {
    std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
    s += buf;
  }
  return s;
}

json Bytes(const std::string& s) {
  json b = json::array();
  for (char c : s) b.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return b;
}

}  // namespace

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

json ErrorJson(absl::StatusCode code, std::string_view message) {
  const char* type = "server_error";
  const char* c = "internal_error";
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      type = "invalid_request_error";
      c = "invalid_request";
      break;
    case absl::StatusCode::kUnauthenticated:
      type = "authentication_error";
      c = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      type = "permission_error";
      c = "permission_denied";
      break;
    case absl::StatusCode::kNotFound:
      type = "invalid_request_error";
      c = "not_found";
      break;
    case absl::StatusCode::kResourceExhausted:
      type = "rate_limit_error";
      c = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      type = "server_error";
      c = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      type = "server_error";
      c = "timeout";
      break;
    case absl::StatusCode::kCancelled:
      type = "server_error";
      c = "cancelled";
      break;
    default:
      break;
  }
  json e = json::object();
  e["message"] = std::string(message);
  e["type"] = type;
  e["param"] = nullptr;
  e["code"] = c;
  return json{{"error", e}};
}

std::string Dump(const json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

std::string SseEvent(const json& j) { return "data: " + Dump(j) + "\n\n"; }

json FinishReasonJson(FinishReason r, bool tool_calls) {
  switch (r) {
    case FinishReason::kStop:
      return tool_calls ? "tool_calls" : "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "abort";
    case FinishReason::kError:
      return "error";
    default:
      return nullptr;
  }
}

json UsageJson(uint32_t prompt_tokens, uint32_t completion_tokens) {
  return json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}};
}

json ChatLogprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, int top) {
  json out = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string piece = Piece(tok, lp.token_id);
    json t = {{"token", TokenText(piece)}, {"logprob", lp.logprob}, {"bytes", Bytes(piece)}};
    json alts = json::array();
    for (size_t k = 0; k < lp.top.size() && static_cast<int>(k) < top; ++k) {
      const std::string p = Piece(tok, lp.top[k].token_id);
      alts.push_back(
          {{"token", TokenText(p)}, {"logprob", lp.top[k].logprob}, {"bytes", Bytes(p)}});
    }
    t["top_logprobs"] = std::move(alts);
    out.push_back(std::move(t));
  }
  return out;
}

void CompletionLogprobs::Add(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, int top,
                             size_t* offset) {
  for (const TokenLogprob& lp : lps) {
    const std::string piece = Piece(tok, lp.token_id);
    tokens.push_back(TokenText(piece));
    token_logprobs.push_back(lp.logprob);
    text_offset.push_back(*offset);
    *offset += piece.size();
    json alts = json::object();
    for (size_t k = 0; k < lp.top.size() && static_cast<int>(k) < top; ++k)
      alts[TokenText(Piece(tok, lp.top[k].token_id))] = lp.top[k].logprob;
    top_logprobs.push_back(std::move(alts));
  }
}

json CompletionLogprobs::ToJson() const {
  return json{{"tokens", tokens},
              {"token_logprobs", token_logprobs},
              {"top_logprobs", top_logprobs},
              {"text_offset", text_offset}};
}

}  // namespace ds::gw::http
