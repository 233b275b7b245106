#include "common/tokenizer/chat_format.h"

namespace ds {

absl::StatusOr<std::string> FormatChatML(const std::vector<ChatMessage>& msgs,
                                         bool add_generation_prompt) {
  if (msgs.empty()) return absl::InvalidArgumentError("chat: no messages");
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "system") {
      if (i != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("chat: messages[", i, "]: system message must be the first message"));
      }
    } else if (m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat("chat: messages[", i, "]: invalid role '", m.role,
                       "' (expected system, user, assistant or tool)"));
    }
    if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      out += m.content;
      out += "\n</tool_response>";
      if (i + 1 == msgs.size() || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
      continue;
    }
    out += "<|im_start|>";
    out += m.role;
    out += "\n";
    out += m.content;
    out += "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace ds
