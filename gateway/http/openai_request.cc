#include "gateway/http/openai_request.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/sampling/sampling_params.h"

namespace ds::gw::http {
namespace {

using json = nlohmann::ordered_json;

template <typename... P>
absl::Status Bad(const P&... p) {
  return absl::InvalidArgumentError(absl::StrCat(p...));
}

const json* Field(const json& o, const char* name) {
  const auto it = o.find(name);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

absl::Status GetNumber(const json& o, const char* name, float* out) {
  const json* v = Field(o, name);
  if (!v) return absl::OkStatus();
  if (!v->is_number()) return Bad(name, " must be a number");
  const double d = v->get<double>();
  // The sampling parameters are floats: a finite double past float's range (1e300) would turn
  // into infinity on the way.
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max())
    return Bad(name, " must be finite (within +-3.4e38)");
  *out = static_cast<float>(d);
  return absl::OkStatus();
}

absl::Status GetInt(const json& o, const char* name, int64_t lo, int64_t hi, int64_t* out) {
  const json* v = Field(o, name);
  if (!v) return absl::OkStatus();
  if (!v->is_number_integer() && !v->is_number_unsigned()) return Bad(name, " must be an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
    return Bad(name, " must be in [", lo, ", ", hi, "], got ", v->get<uint64_t>());
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) return Bad(name, " must be in [", lo, ", ", hi, "], got ", x);
  *out = x;
  return absl::OkStatus();
}

absl::Status GetBool(const json& o, const char* name, bool* out) {
  const json* v = Field(o, name);
  if (!v) return absl::OkStatus();
  if (!v->is_boolean()) return Bad(name, " must be true or false");
  *out = v->get<bool>();
  return absl::OkStatus();
}

// Fields both endpoints share.
absl::Status ParseCommon(const json& b, OpenAIRequest* r) {
  if (const json* m = Field(b, "model")) {
    if (!m->is_string()) return Bad("model must be a string");
    r->model = m->get<std::string>();
  }
  DS_RETURN_IF_ERROR(GetBool(b, "stream", &r->stream));
  if (const json* so = Field(b, "stream_options")) {
    if (!so->is_object()) return Bad("stream_options must be an object");
    DS_RETURN_IF_ERROR(GetBool(*so, "include_usage", &r->include_usage));
  }
  GenerateInput& in = r->input;
  DS_RETURN_IF_ERROR(GetNumber(b, "temperature", &in.sampling.temperature));
  DS_RETURN_IF_ERROR(GetNumber(b, "top_p", &in.sampling.top_p));
  DS_RETURN_IF_ERROR(GetNumber(b, "min_p", &in.sampling.min_p));
  DS_RETURN_IF_ERROR(GetNumber(b, "presence_penalty", &in.sampling.presence_penalty));
  DS_RETURN_IF_ERROR(GetNumber(b, "frequency_penalty", &in.sampling.frequency_penalty));
  DS_RETURN_IF_ERROR(GetNumber(b, "repetition_penalty", &in.sampling.repetition_penalty));
  // OpenAI's documented ranges (the shared validation is wider for the gRPC API).
  auto range = [](const char* name, float v, float lo, float hi) -> absl::Status {
    if (v < lo || v > hi) return Bad(name, " must be in [", lo, ", ", hi, "], got ", v);
    return absl::OkStatus();
  };
  DS_RETURN_IF_ERROR(range("temperature", in.sampling.temperature, 0, 2));
  DS_RETURN_IF_ERROR(range("top_p", in.sampling.top_p, 0, 1));
  DS_RETURN_IF_ERROR(range("presence_penalty", in.sampling.presence_penalty, -2, 2));
  DS_RETURN_IF_ERROR(range("frequency_penalty", in.sampling.frequency_penalty, -2, 2));
  int64_t top_k = 0;
  // vLLM's convention: -1 (and 0) disable top_k.
  DS_RETURN_IF_ERROR(GetInt(b, "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k));
  in.sampling.top_k = top_k < 0 ? 0 : static_cast<int32_t>(top_k);
  if (const json* s = Field(b, "seed")) {
    if (!s->is_number_integer() && !s->is_number_unsigned()) return Bad("seed must be an integer");
    in.sampling.seed =
        s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  int64_t max_tokens = 0;
  DS_RETURN_IF_ERROR(GetInt(b, "max_tokens", 1, std::numeric_limits<uint32_t>::max(), &max_tokens));
  // The newer name wins when both are sent (OpenAI deprecates max_tokens for chat).
  DS_RETURN_IF_ERROR(
      GetInt(b, "max_completion_tokens", 1, std::numeric_limits<uint32_t>::max(), &max_tokens));
  in.max_tokens = static_cast<uint32_t>(max_tokens);
  if (const json* s = Field(b, "stop")) {
    if (s->is_string()) {
      in.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (size_t i = 0; i < s->size(); ++i) {
        if (!(*s)[i].is_string()) return Bad("stop[", i, "] must be a string");
        in.stop.push_back((*s)[i].get<std::string>());
      }
    } else {
      return Bad("stop must be a string or an array of strings");
    }
  }
  DS_RETURN_IF_ERROR(GetBool(b, "ignore_eos", &in.ignore_eos));
  // deltaserve's per-request MTP switch (as on gRPC): absent = the server's setting.
  if (Field(b, "mtp")) {
    int64_t mtp = 0;
    DS_RETURN_IF_ERROR(GetInt(b, "mtp", 0, 15, &mtp));
    in.sampling.mtp = static_cast<int32_t>(mtp);
  }
  int64_t n = 1;
  DS_RETURN_IF_ERROR(GetInt(b, "n", 1, 1 << 20, &n));
  if (n != 1) return Bad("n must be 1: one choice per request is supported");
  if (const json* f = Field(b, "response_format")) {
    const json* t = f->is_object() ? Field(*f, "type") : nullptr;
    if (!t || !t->is_string()) return Bad("response_format.type must be a string");
    if (*t == "json_object") {
      in.sampling.json_object = true;  // the worker masks tokens (json_constraint.h)
    } else if (*t == "json_schema") {
      return Bad(
          "response_format.type 'json_schema' is not supported: schemas are not enforced; use "
          "'json_object' (any one JSON object) and describe the schema in the prompt");
    } else if (*t != "text") {
      return Bad("response_format.type '", t->get<std::string>(),
                 "' is not supported: use 'text' or 'json_object'");
    }
  }
  if (const json* u = Field(b, "user"); u && !u->is_string()) return Bad("user must be a string");
  return absl::OkStatus();
}

absl::StatusOr<json> ParseBody(std::string_view body) {
  json b = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (b.is_discarded()) return Bad("the request body is not valid JSON");
  if (!b.is_object()) return Bad("the request body must be a JSON object");
  return b;
}

}  // namespace

absl::StatusOr<OpenAIRequest> ParseChatRequest(std::string_view body) {
  DS_ASSIGN_OR_RETURN(json b, ParseBody(body));
  OpenAIRequest r;
  r.chat = true;
  DS_RETURN_IF_ERROR(ParseCommon(b, &r));
  const json* msgs = Field(b, "messages");
  if (!msgs) return Bad("messages is required");
  if (msgs->is_array() && msgs->size() > kMaxChatMessages)
    return Bad("messages has ", msgs->size(), " entries, at most ", kMaxChatMessages, " allowed");
  DS_ASSIGN_OR_RETURN(r.messages, ChatTurnsFromJson(*msgs));
  DS_RETURN_IF_ERROR(GetBool(b, "logprobs", &r.logprobs));
  int64_t top = 0;
  DS_RETURN_IF_ERROR(GetInt(b, "top_logprobs", 0, sampling::kMaxLogprobs, &top));
  if (top > 0 && !r.logprobs) return Bad("top_logprobs needs logprobs: true");
  r.top_logprobs = static_cast<int>(top);
  // The sampler reports the chosen token among `logprobs` alternatives; at least one.
  if (r.logprobs) r.input.logprobs = static_cast<uint32_t>(std::max<int64_t>(1, top));

  bool tool_choice_none = false;
  if (const json* tc = Field(b, "tool_choice")) {
    if (!tc->is_string() || (*tc != "auto" && *tc != "none"))
      return Bad(
          "tool_choice: only \"auto\" and \"none\" are supported (no forced tool calls "
          "without constrained decoding)");
    tool_choice_none = *tc == "none";
  }
  if (const json* tools = Field(b, "tools")) {
    if (!tools->is_array()) return Bad("tools must be an array");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const json* fn = t.is_object() ? Field(t, "function") : nullptr;
      if (!t.is_object() || !fn || !fn->is_object())
        return Bad("tools[", i, "].function must be an object");
      if (const json* type = Field(t, "type"); type && *type != "function")
        return Bad("tools[", i, "].type must be \"function\"");
      const json* name = Field(*fn, "name");
      if (!name || !name->is_string() || name->get<std::string>().empty())
        return Bad("tools[", i, "].function.name must be a non-empty string");
    }
    if (!tool_choice_none && !tools->empty()) {
      r.render.tools = *tools;
      r.parse_tool_calls = true;
    }
  }
  // Thinking switches: vLLM's chat_template_kwargs (enable_thinking; Qwen3.6's
  // preserve_thinking), or a top-level enable_thinking as some clients send.
  bool thinking = true;
  bool have_thinking = false;
  if (const json* k = Field(b, "chat_template_kwargs")) {
    if (!k->is_object()) return Bad("chat_template_kwargs must be an object");
    if (Field(*k, "enable_thinking")) {
      DS_RETURN_IF_ERROR(GetBool(*k, "enable_thinking", &thinking));
      have_thinking = true;
    }
    if (Field(*k, "preserve_thinking")) {
      bool preserve = false;
      DS_RETURN_IF_ERROR(GetBool(*k, "preserve_thinking", &preserve));
      r.render.preserve_thinking = preserve;
    }
  }
  if (Field(b, "enable_thinking")) {
    DS_RETURN_IF_ERROR(GetBool(b, "enable_thinking", &thinking));
    have_thinking = true;
  }
  if (have_thinking) r.render.enable_thinking = thinking;
  if (r.input.sampling.json_object) {
    // The constraint holds from the first generated token, so there is no room for reasoning
    // before the object: the template's thinking is turned off (an explicit request for it is
    // refused), and no tool call can be written (tools stay in the prompt as context).
    if (have_thinking && thinking)
      return Bad(
          "response_format json_object with enable_thinking: the constrained answer "
          "leaves no room for reasoning; set enable_thinking to false or drop it");
    r.render.enable_thinking = false;
    r.parse_tool_calls = false;
  }
  return r;
}

absl::StatusOr<OpenAIRequest> ParseCompletionRequest(std::string_view body) {
  DS_ASSIGN_OR_RETURN(json b, ParseBody(body));
  OpenAIRequest r;
  DS_RETURN_IF_ERROR(ParseCommon(b, &r));
  bool echo = false;
  DS_RETURN_IF_ERROR(GetBool(b, "echo", &echo));
  if (echo) return Bad("echo is not supported");
  if (Field(b, "suffix")) return Bad("suffix is not supported");
  int64_t best_of = 1;
  DS_RETURN_IF_ERROR(GetInt(b, "best_of", 1, 1 << 20, &best_of));
  if (best_of != 1) return Bad("best_of must be 1");
  int64_t lp = 0;
  if (const json* l = Field(b, "logprobs"); l && !l->is_boolean()) {
    DS_RETURN_IF_ERROR(GetInt(b, "logprobs", 0, sampling::kMaxLogprobs, &lp));
    r.logprobs = true;  // the chosen token's logprob, plus `lp` alternatives
    r.top_logprobs = static_cast<int>(lp);
    r.input.logprobs = static_cast<uint32_t>(std::max<int64_t>(1, lp));
  }
  const json* p = Field(b, "prompt");
  if (!p) return Bad("prompt is required");
  GenerateInput& in = r.input;
  auto ids_from = [&](const json& a, const std::string& at) -> absl::Status {
    if (a.empty()) return Bad(at, " is empty");
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_number_integer() && !a[i].is_number_unsigned())
        return Bad(at, "[", i, "] must be a token id (integer)");
      const int64_t id = a[i].get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max())
        return Bad(at, "[", i, "] = ", id, " is not a token id");
      in.ids.push_back(static_cast<int32_t>(id));
    }
    in.kind = PromptKind::kIds;
    return absl::OkStatus();
  };
  if (p->is_string()) {
    in.kind = PromptKind::kText;
    in.text = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && (*p)[0].is_string()) {
    if (p->size() != 1) return Bad("prompt: one prompt per request is supported, got ", p->size());
    in.kind = PromptKind::kText;
    in.text = (*p)[0].get<std::string>();
  } else if (p->is_array() && !p->empty() && (*p)[0].is_array()) {
    if (p->size() != 1) return Bad("prompt: one prompt per request is supported, got ", p->size());
    DS_RETURN_IF_ERROR(ids_from((*p)[0], "prompt[0]"));
  } else if (p->is_array()) {
    DS_RETURN_IF_ERROR(ids_from(*p, "prompt"));
  } else {
    return Bad("prompt must be a string, an array of token ids, or an array of one of those");
  }
  return r;
}

}  // namespace ds::gw::http
