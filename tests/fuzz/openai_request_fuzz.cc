// libFuzzer target for the OpenAI HTTP edge without the network: a request body (any bytes) is
// parsed as /v1/chat/completions and as /v1/completions (gateway/http/openai_request.h); an
// accepted chat is rendered by each chat template (common/tokenizer/chat_template.h) and encoded
// as the gateway encodes it (PromptEncoder over tests/fuzz/fuzz_vocab.h's vocabulary); then
// the request goes through the gateway's full validation (gateway/prepare.h `Prepare`), as
// gateway/http/http_server.cc does before anything reaches the scheduler.
// Checks, beyond "no crash, no sanitizer report":
//  - a refusal is InvalidArgument with a message (the gateway's 400 names the field);
//  - an accepted request's sampling values are finite and its numbers within their ranges;
//  - a rendered prompt's trusted ranges are ordered, disjoint and inside the text;
//  - the encoded ids decode to the rendered text exactly, and every special token among them
//    stands for text the template wrote (a trusted range), never for text a client sent;
//  - what Prepare accepts is within every limit the scheduler relies on: prompt and stop ids in
//    the vocabulary, a non-empty prompt, logprobs and priority in range, sampling parameters that
//    the sampler's own Validate accepts.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/prompt_encoder.h"
#include "common/tokenizer/tokenizer.h"
#include "gateway/http/openai_request.h"
#include "gateway/prepare.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_vocab.h"

namespace {

void Check(bool cond, const char* what) { ds::fuzz::Check(cond, "openai_request_fuzz", what); }

const ds::Tokenizer& Tok() { return ds::fuzz::FuzzTokenizer(); }

void CheckRefusal(const absl::Status& s) {
  Check(s.code() == absl::StatusCode::kInvalidArgument, "a refused body is InvalidArgument");
  Check(!s.message().empty(), "a refusal says why");
}

void CheckAccepted(const ds::gw::http::OpenAIRequest& r) {
  const ds::gw::SamplingInput& p = r.input.sampling;
  Check(std::isfinite(p.temperature) && std::isfinite(p.top_p) && std::isfinite(p.min_p) &&
            std::isfinite(p.repetition_penalty) && std::isfinite(p.presence_penalty) &&
            std::isfinite(p.frequency_penalty),
        "sampling values are finite");
  Check(r.top_logprobs >= 0, "top_logprobs >= 0");
}

const ds::PromptEncoder& Encoder() {
  static const ds::PromptEncoder encoder(&Tok());
  return encoder;
}

// Renders with every template; returns the ids of the plain ChatML rendering (the template the
// HTTP server uses for a model without one), or nothing when that rendering refused.
std::optional<std::vector<int32_t>> RenderAndEncode(const ds::gw::http::OpenAIRequest& r) {
  const ds::Tokenizer& tok = Tok();
  const ds::PromptEncoder& encoder = Encoder();
  std::optional<std::vector<int32_t>> chatml_ids;
  for (const ds::ChatTemplate& t :
       {ds::ChatTemplate::Of(ds::ChatTemplateKind::kChatML),
        ds::ChatTemplate::Of(ds::ChatTemplateKind::kQwen35),
        ds::ChatTemplate::Of(ds::ChatTemplateKind::kQwen35, /*preserve_thinking_branch=*/true)}) {
    absl::StatusOr<ds::RenderedPrompt> rendered = t.Render(r.messages, r.render);
    if (!rendered.ok()) {
      CheckRefusal(rendered.status());
      continue;
    }
    const std::string& text = rendered->text;
    size_t prev_end = 0;
    for (const auto& [b, e] : rendered->trusted) {
      Check(b >= prev_end && b <= e && e <= text.size(), "trusted ranges ordered and inside");
      prev_end = e;
    }
    absl::StatusOr<std::vector<int32_t>> ids = encoder.Encode(*rendered);
    Check(ids.ok(), "a rendered prompt encodes");
    size_t at = 0;
    for (int32_t id : *ids) {
      absl::StatusOr<std::string_view> piece = tok.TokenToPiece(id);
      Check(piece.ok(), "encoded ids are in range");
      Check(text.compare(at, piece->size(), *piece) == 0, "ids decode to the rendered text");
      if (ds::fuzz::IsSpecial(tok, id)) {
        bool inside = false;
        for (const auto& [b, e] : rendered->trusted)
          inside |= b <= at && at + piece->size() <= e;
        Check(inside, "a special token only where the template wrote it");
      }
      at += piece->size();
    }
    Check(at == text.size(), "ids cover the rendered text");
    if (t.kind() == ds::ChatTemplateKind::kChatML) chatml_ids = std::move(*ids);
  }
  return chatml_ids;
}

void PrepareAndCheck(ds::gw::GenerateInput in) {
  const ds::Tokenizer& tok = Tok();
  ds::gw::ModelView view;
  view.tokenizer = &tok;
  view.n_vocab = tok.n_vocab();
  view.slot_context = 4096;
  view.encoder = &Encoder();
  absl::StatusOr<ds::gw::PreparedRequest> p = ds::gw::Prepare(in, view);
  if (!p.ok()) {
    CheckRefusal(p.status());
    return;
  }
  Check(!p->prompt_ids.empty(), "a prepared prompt has tokens");
  for (int32_t id : p->prompt_ids) Check(id >= 0 && id < view.n_vocab, "prompt ids in range");
  for (int32_t id : p->stop_ids) Check(id >= 0 && id < view.n_vocab, "stop ids in range");
  Check(p->logprobs <= static_cast<uint32_t>(ds::sampling::kMaxLogprobs), "logprobs in range");
  Check(p->priority >= ds::gw::kMinPriority && p->priority <= ds::gw::kMaxPriority,
        "priority in range");
  Check(ds::sampling::Validate(ds::gw::ToSamplerParams(p->sampling), view.n_vocab).ok(),
        "the sampler accepts what Prepare accepted");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ds::gw::http::OpenAIRequest> chat = ds::gw::http::ParseChatRequest(body);
  if (chat.ok()) {
    Check(chat->chat, "a chat request says so");
    CheckAccepted(*chat);
    if (std::optional<std::vector<int32_t>> ids = RenderAndEncode(*chat)) {
      ds::gw::GenerateInput in = chat->input;  // as the HTTP server hands a chat on: ids
      in.kind = ds::gw::PromptKind::kIds;
      in.ids = std::move(*ids);
      PrepareAndCheck(std::move(in));
    }
  } else {
    CheckRefusal(chat.status());
  }
  absl::StatusOr<ds::gw::http::OpenAIRequest> completion =
      ds::gw::http::ParseCompletionRequest(body);
  if (completion.ok()) {
    Check(!completion->chat, "a completion request is not a chat");
    CheckAccepted(*completion);
    PrepareAndCheck(completion->input);
  } else {
    CheckRefusal(completion.status());
  }
  return 0;
}
