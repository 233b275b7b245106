#include "gateway/prepare.h"

#include <algorithm>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace ds::gw {
namespace {

template <typename... Parts>
absl::Status Bad(const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// ChatML delimiters: content carrying them would forge turns, so it is refused rather than
// silently encoded as plain text the model would read as a delimiter-lookalike.
constexpr std::string_view kChatDelimiters[] = {"<|im_start|>", "<|im_end|>"};
constexpr std::string_view kRoles[] = {"system", "user", "assistant", "tool"};

absl::Status CheckChat(const std::vector<ChatMessage>& chat) {
  if (chat.empty()) return Bad("chat.messages is empty: the prompt needs at least one message");
  if (chat.size() > kMaxChatMessages)
    return Bad("chat.messages has ", chat.size(), " entries, at most ", kMaxChatMessages,
               " allowed");
  for (size_t i = 0; i < chat.size(); ++i) {
    const ChatMessage& m = chat[i];
    if (std::find(std::begin(kRoles), std::end(kRoles), m.role) == std::end(kRoles))
      return Bad("chat.messages[", i, "].role '", m.role,
                 "' is not one of system, user, assistant, tool");
    for (std::string_view d : kChatDelimiters)
      if (m.content.find(d) != std::string::npos)
        return Bad("chat.messages[", i, "].content contains the ChatML delimiter '", std::string(d),
                   "'");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRequestId(const std::string& id) {
  if (id.size() > kMaxRequestIdBytes)
    return Bad("request_id is ", id.size(), " bytes, at most ", kMaxRequestIdBytes, " allowed");
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    if (c < 0x21 || c > 0x7e)
      return Bad("request_id: byte ", i, " is not printable ASCII (0x21-0x7e allowed)");
  }
  return absl::OkStatus();
}

sampling::SamplingParams ToSamplerParams(const SamplingInput& s) {
  sampling::SamplingParams p;
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  // Public convention: 0 or 1 disable top_p; anything else must lie in (0, 1) and is checked by
  // Validate as given.
  p.top_p = (s.top_p == 0.0f || s.top_p == 1.0f) ? 1.0f : s.top_p;
  p.min_p = s.min_p;
  p.repetition_penalty = s.repetition_penalty == 0.0f ? 1.0f : s.repetition_penalty;
  p.presence_penalty = s.presence_penalty;
  p.frequency_penalty = s.frequency_penalty;
  p.seed = s.seed;
  p.mtp_drafts = s.mtp;  // Validate names a value outside [0, 15]
  p.json_object = s.json_object;
  return p;
}

absl::StatusOr<std::vector<int32_t>> TokenizePrompt(const GenerateInput& in, const ModelView& m) {
  const Tokenizer& tok = *m.tokenizer;
  switch (in.kind) {
    case PromptKind::kNone:
      return Bad("prompt is missing: set one of text, chat or token_ids");
    case PromptKind::kText: {
      if (in.text.empty()) return Bad("text is empty");
      if (!tok.has_vocab())
        return Bad(
            "text: the model has no vocabulary (tokenizer.ggml.model = none); "
            "send token_ids instead");
      auto ids = tok.Encode(in.text, /*parse_special=*/false);
      if (!ids.ok()) return Bad("text: ", ids.status().message());
      return ids;
    }
    case PromptKind::kChat: {
      DS_RETURN_IF_ERROR(CheckChat(in.chat));
      if (!tok.has_vocab())
        return Bad(
            "chat: the model has no vocabulary (tokenizer.ggml.model = none); "
            "send token_ids instead");
      std::vector<ChatTurn> turns;
      for (const ChatMessage& msg : in.chat) {
        ChatTurn t;
        t.role = msg.role;
        t.content = msg.content;
        turns.push_back(std::move(t));
      }
      const ChatTemplate plain = ChatTemplate::Of(ChatTemplateKind::kChatML);
      const ChatTemplate& tmpl = m.chat_template ? *m.chat_template : plain;
      ChatRenderOptions ro;
      // json_object constrains the first generated token already: no room for reasoning (the
      // HTTP listener does the same).
      if (in.sampling.json_object) ro.enable_thinking = false;
      auto rendered = tmpl.Render(turns, ro);
      if (!rendered.ok()) return Bad("chat.", rendered.status().message());
      // Only the template's own markers become control tokens: `<|endoftext|>`, `<think>` or
      // `<tool_call>` typed by a client stay text (issue #16).
      return EncodeRendered(*rendered, m, "chat");
    }
    case PromptKind::kIds: {
      if (in.ids.empty()) return Bad("token_ids.ids is empty");
      for (size_t i = 0; i < in.ids.size(); ++i) {
        if (in.ids[i] < 0 || in.ids[i] >= m.n_vocab)
          return Bad("token_ids.ids[", i, "] = ", in.ids[i], " is outside the vocabulary [0, ",
                     m.n_vocab, ")");
      }
      return in.ids;
    }
  }
  return Bad("prompt is missing");
}

absl::StatusOr<std::vector<int32_t>> EncodeRendered(const RenderedPrompt& p, const ModelView& m,
                                                    const char* field) {
  std::optional<PromptEncoder> local;
  const PromptEncoder* enc = m.encoder;
  if (!enc) enc = &local.emplace(m.tokenizer);
  auto ids = enc->Encode(p);
  if (!ids.ok()) return Bad(field, ": ", ids.status().message());
  return ids;
}

std::vector<int32_t> MessageStartHints(const std::vector<int32_t>& ids, const Tokenizer& tok) {
  std::vector<int32_t> hints;
  const std::optional<int32_t> start = tok.FindToken("<|im_start|>");
  if (!start) return hints;
  for (size_t i = ids.size(); i-- > 1 && hints.size() < kMessageStartHints;)
    if (ids[i] == *start) hints.insert(hints.begin(), static_cast<int32_t>(i));
  return hints;
}

absl::StatusOr<PreparedRequest> Prepare(const GenerateInput& in, const ModelView& m) {
  PreparedRequest p;
  // Sizes first: cheap, and nothing big is tokenized or scanned for a request refused anyway.
  DS_RETURN_IF_ERROR(CheckRequestId(in.request_id));
  if (in.stop_token_ids.size() > kMaxStopTokenIds)
    return Bad("stop_token_ids has ", in.stop_token_ids.size(), " entries, at most ",
               kMaxStopTokenIds, " allowed");
  if (in.stop.size() > sampling::kMaxStopStrings)
    return Bad("stop has ", in.stop.size(), " entries, at most ", sampling::kMaxStopStrings,
               " allowed");
  DS_ASSIGN_OR_RETURN(p.prompt_ids, TokenizePrompt(in, m));
  if (p.prompt_ids.empty()) return Bad("prompt encodes to zero tokens");
  p.checkpoint_hints = MessageStartHints(p.prompt_ids, *m.tokenizer);

  if (in.logprobs > static_cast<uint32_t>(sampling::kMaxLogprobs))
    return Bad("logprobs must be in [0, ", sampling::kMaxLogprobs, "], got ", in.logprobs);
  if (in.priority < kMinPriority || in.priority > kMaxPriority)
    return Bad("priority must be in [", kMinPriority, ", ", kMaxPriority, "], got ", in.priority);
  for (size_t i = 0; i < in.stop.size(); ++i) {
    if (in.stop[i].empty()) return Bad("stop[", i, "] is empty");
    if (in.stop[i].size() > sampling::kMaxStopStringBytes)
      return Bad("stop[", i, "] is ", in.stop[i].size(), " bytes, at most ",
                 sampling::kMaxStopStringBytes, " allowed");
    if (!sampling::IsValidUtf8(in.stop[i])) return Bad("stop[", i, "] is not valid UTF-8");
  }
  for (size_t i = 0; i < in.stop_token_ids.size(); ++i) {
    const int32_t id = in.stop_token_ids[i];
    if (id < 0 || id >= m.n_vocab)
      return Bad("stop_token_ids[", i, "] = ", id, " is outside the vocabulary [0, ", m.n_vocab,
                 ")");
  }

  if (in.sampling.json_object) {
    // The worker masks tokens by their text and ends the object with the model's EOS ids.
    if (!m.tokenizer->has_vocab() || m.tokenizer->eos_ids().empty())
      return Bad("json_object: the model has no vocabulary (or no EOS id) to constrain");
    if (in.ignore_eos)
      return Bad("json_object with ignore_eos: generation must end when the object is complete");
  }

  sampling::SamplingParams sp = ToSamplerParams(in.sampling);
  sp.n_logprobs = static_cast<int>(in.logprobs);
  sp.stop_ids = in.stop_token_ids;
  sp.stop_strings = in.stop;
  if (absl::Status s = sampling::Validate(sp, m.n_vocab); !s.ok())
    return Bad("sampling: ", s.message());

  // max_tokens against the slot context (prompt + generated must fit one slot).
  const uint64_t n_prompt = p.prompt_ids.size();
  if (in.max_tokens == 0) {
    p.max_tokens = kDefaultMaxTokens;
    // The default shrinks to what fits; an explicit value never does.
    if (m.slot_context > 0 && n_prompt + p.max_tokens > m.slot_context) {
      if (n_prompt >= m.slot_context)
        return Bad("prompt (", n_prompt, " tokens) leaves no room in the slot context (",
                   m.slot_context, " tokens)");
      p.max_tokens = static_cast<uint32_t>(m.slot_context - n_prompt);
    }
  } else {
    p.max_tokens = in.max_tokens;
    if (m.slot_context > 0 && n_prompt >= m.slot_context)
      return Bad("prompt (", n_prompt, " tokens) does not fit the slot context (", m.slot_context,
                 " tokens) with room for any generated token");
    if (m.slot_context > 0 && n_prompt + p.max_tokens > m.slot_context)
      return Bad("max_tokens: prompt (", n_prompt, " tokens) + max_tokens (", in.max_tokens,
                 ") = ", n_prompt + in.max_tokens, " exceeds the slot context (", m.slot_context,
                 " tokens)");
  }

  p.sampling = in.sampling;
  p.stop_strings = in.stop;
  p.logprobs = in.logprobs;
  p.priority = in.priority;
  p.ignore_eos = in.ignore_eos;
  p.stop_ids = in.stop_token_ids;
  if (!in.ignore_eos) {
    for (int32_t e : m.tokenizer->eos_ids())
      if (e >= 0 && e < m.n_vocab &&
          std::find(p.stop_ids.begin(), p.stop_ids.end(), e) == p.stop_ids.end())
        p.stop_ids.push_back(e);
  }
  return p;
}

}  // namespace ds::gw
