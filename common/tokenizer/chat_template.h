// The model's chat template: conversation (OpenAI message shape) -> prompt text, reproducing what
// Hugging Face's jinja2 rendering of the GGUF's `tokenizer.chat_template` produces, byte for byte.
//
// There is no Jinja interpreter here. The template text is matched to a family with a native
// renderer (ChatTemplate::FromJinja); today:
//   kQwen35  the Qwen3.5 / Qwen3.6 template (tools as JSON in the system turn, XML tool calls
//            `<tool_call><function=NAME><parameter=P>`, `<think>` reasoning, enable_thinking;
//            Qwen3.6's preserve_thinking when the template text has that branch);
//            tests/tokenizer/chat_template_test.cc checks it against python3-jinja2 rendering the
//            real template text (tests/tokenizer/data/).
//   kChatML  anything else, e.g. the tiny/demo models' one-line ChatML template: roles and contents
//            only (the behaviour of FormatChatML); tools and tool calls are refused.
//
// Every rendered prompt records which byte ranges the template itself wrote ("trusted"). Only
// there may special-token texts become control tokens (common/tokenizer/prompt_encoder.h): text a
// client sent (contents, tool JSON, reasoning, arguments) is always plain text.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/util/status.h"

namespace ds {

struct ChatToolCall {
  std::string id;
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  // an object
};

struct ChatTurn {
  std::string role;                    // system, user, assistant, tool
  std::optional<std::string> content;  // nullopt: null / absent
  std::optional<std::string> reasoning_content;
  std::vector<ChatToolCall> tool_calls;
  std::string tool_call_id;  // tool messages (not rendered by the Qwen template)
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // nullopt: the template's default (thinking on)
  // Qwen3.6's switch to keep the reasoning of every earlier assistant turn (templates without
  // it ignore it, as jinja would).
  std::optional<bool> preserve_thinking;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // OpenAI `tools`, as sent
};

struct RenderedPrompt {
  std::string text;
  std::vector<std::pair<size_t, size_t>> trusted;  // [begin, end) written by the template
  // The prompt ends inside an open `<think>` block: the model's output starts with reasoning.
  bool opens_reasoning = false;
};

// OpenAI `messages` JSON -> turns. content: string, null, or an array of {"type": "text", "text"}
// parts (concatenated, as the template does); tool_calls[].function.arguments: a JSON object or a
// string holding one (parsed, as vLLM does before rendering). InvalidArgument names the field
// (`messages[2].tool_calls[0].function.arguments ...`); image parts are refused (text-only model).
absl::StatusOr<std::vector<ChatTurn>> ChatTurnsFromJson(const nlohmann::ordered_json& messages);

enum class ChatTemplateKind { kChatML, kQwen35 };

class ChatTemplate {
 public:
  // Picks the renderer for a GGUF's tokenizer.chat_template (empty: ChatML).
  static ChatTemplate FromJinja(std::string_view jinja);
  static ChatTemplate Of(ChatTemplateKind kind, bool preserve_thinking_branch = false) {
    ChatTemplate t(kind);
    t.preserve_branch_ = preserve_thinking_branch;
    return t;
  }
  ChatTemplateKind kind() const { return kind_; }
  const char* name() const;
  bool supports_tools() const { return kind_ == ChatTemplateKind::kQwen35; }

  // InvalidArgument, naming `messages[i]` where it applies, for what the template itself would
  // refuse (raise_exception) or cannot express.
  absl::StatusOr<RenderedPrompt> Render(const std::vector<ChatTurn>& messages,
                                        const ChatRenderOptions& opts) const;

 private:
  explicit ChatTemplate(ChatTemplateKind k) : kind_(k) {}
  ChatTemplateKind kind_;
  bool preserve_branch_ = false;  // the template honours preserve_thinking (Qwen3.6)
};

}  // namespace ds
