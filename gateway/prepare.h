// Validation and tokenization of a generation request: the part of the gateway that decides
// whether a request may reach the scheduler. Pure functions of (request, model, slot context);
// every rejection is InvalidArgument naming the public field at fault.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/prompt_encoder.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/status.h"
#include "gateway/request.h"

namespace ds::gw {

// What validation needs to know about the served model and cluster.
struct ModelView {
  const Tokenizer* tokenizer = nullptr;  // never null
  int32_t n_vocab = 0;                   // rows of token_embd (may exceed the tokenizer's size)
  // Per-slot context of the cluster (from the scheduler's status); 0 = not known yet, in which
  // case the scheduler checks it.
  uint32_t slot_context = 0;
  // The model's chat template (null: plain ChatML) and the encoder that keeps client text from
  // becoming special tokens (null: one is built per call, fine for tests on tiny vocabularies).
  const ChatTemplate* chat_template = nullptr;
  const PromptEncoder* encoder = nullptr;
};

// prompt (text / chat / ids) -> token ids. Text and chat content never produce special tokens
// (chat is rendered by the model's template; only the template's own markers are special).
// InvalidArgument names the field.
absl::StatusOr<std::vector<int32_t>> TokenizePrompt(const GenerateInput& in, const ModelView& m);

// A rendered conversation -> ids through m.encoder (special tokens only where the template wrote
// them). `field` prefixes errors ("chat", "messages").
absl::StatusOr<std::vector<int32_t>> EncodeRendered(const RenderedPrompt& p, const ModelView& m,
                                                    const char* field);

// Prefix cache: the positions (> 0) of the last kMessageStartHints `<|im_start|>` tokens of a
// prompt, i.e. where its last chat messages start: the state before a message is what the next
// turn shares even when its template renders the answer differently (Qwen3.5's drops the
// reasoning of earlier answers, so the previous prompt's end is not shared). Empty when the
// vocabulary has no such token.
constexpr int kMessageStartHints = 2;
std::vector<int32_t> MessageStartHints(const std::vector<int32_t>& ids, const Tokenizer& tok);

// Full validation: prompt, ids, max_tokens against the slot context, sampling (through
// ds::sampling::Validate), stop strings / ids, logprobs, priority.
absl::StatusOr<PreparedRequest> Prepare(const GenerateInput& in, const ModelView& m);

// request_id: at most kMaxRequestIdBytes of printable ASCII (it is echoed in every message and log
// line of the request).
absl::Status CheckRequestId(const std::string& id);

// The sampler's view of the public sampling fields (0 = disabled mapped to neutral values).
sampling::SamplingParams ToSamplerParams(const SamplingInput& s);

}  // namespace ds::gw
