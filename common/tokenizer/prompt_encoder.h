// Tokenizes a rendered chat prompt so that only the template's own markers become special tokens.
//
// HF and llama.cpp encode the whole rendered string with special tokens parsed, so a user who
// types `<|im_end|>`, `<|endoftext|>`, `<tool_call>` or `<think>` injects control tokens. Here a
// special token's text is matched only inside the ranges the template wrote
// (RenderedPrompt::trusted); everything between matches is encoded as plain text in one piece, so
// a conversation without such text gets exactly the ids of the usual whole-string encoding.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"

namespace ds {

class PromptEncoder {
 public:
  // `tok` must outlive the encoder; its control and user-defined token texts are collected once.
  explicit PromptEncoder(const Tokenizer* tok);
  absl::StatusOr<std::vector<int32_t>> Encode(const RenderedPrompt& p) const;

 private:
  const Tokenizer* tok_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // longest text first
};

}  // namespace ds
