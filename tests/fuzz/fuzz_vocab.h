// The vocabulary of the text fuzz targets: the tiny models' built-in BPE (no file needed) with its
// control tokens, plus the user-defined tokens a Qwen3.5 vocabulary adds for reasoning and tool
// calls, so that the "client text never becomes a special token" checks cover both kinds.
#pragma once
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_data.h"
#include "tests/fuzz/fuzz_check.h"

namespace ds::fuzz {

inline const Tokenizer& FuzzTokenizer() {
  static const Tokenizer* tok = [] {
    TokenizerData d = MakeTinyBpe(kMaxTinyMerges);
    for (const char* t : {"<think>", "</think>", "<tool_call>", "</tool_call>"}) {
      d.tokens.emplace_back(t);
      d.token_types.push_back(static_cast<int32_t>(TokenType::kUserDefined));
    }
    absl::StatusOr<Tokenizer> t = Tokenizer::FromData(d);
    Check(t.ok(), "fuzz_vocab", "the fuzz vocabulary loads");
    return new Tokenizer(std::move(*t));
  }();
  return *tok;
}

inline bool IsSpecial(const Tokenizer& tok, int32_t id) {
  const TokenType t = tok.token_type(id);
  return t == TokenType::kControl || t == TokenType::kUserDefined;
}

}  // namespace ds::fuzz
