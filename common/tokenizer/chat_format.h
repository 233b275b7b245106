// Qwen ChatML prompt formatting.
#pragma once
#include <string>
#include <vector>

#include "common/util/status.h"

namespace ds {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
};

// Renders `<|im_start|>{role}\n{content}<|im_end|>\n` per message and, when
// add_generation_prompt, a trailing `<|im_start|>assistant\n`. Tool results follow the Qwen
// template: consecutive "tool" messages share one user turn, each wrapped as
// `\n<tool_response>\n{content}\n</tool_response>`. InvalidArgument (naming the message index) for
// an unknown role, a system message that is not first, or an empty conversation.
// Content is not escaped: encode the result with parse_special = true only for trusted content.
absl::StatusOr<std::string> FormatChatML(const std::vector<ChatMessage>& msgs,
                                         bool add_generation_prompt);

}  // namespace ds
