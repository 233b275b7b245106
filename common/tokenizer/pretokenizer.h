// Regex pre-tokenizer for byte-level BPE (llama.cpp `qwen2` / `qwen35` pre-tokenizers), on PCRE2
// with UTF + UCP semantics and JIT.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/status.h"

namespace ds::tok {

class PreTokenizer {
 public:
  // name: "qwen2" or "qwen35" (InvalidArgument otherwise).
  static absl::StatusOr<PreTokenizer> Create(std::string_view name);
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  const std::string& name() const { return name_; }
  const std::string& pattern() const { return pattern_; }

  // Splits `text` (arbitrary bytes) into consecutive pieces that concatenate back to `text`.
  // Well-formed UTF-8 runs are split by the regex; each maximal run of bytes that is not
  // well-formed UTF-8 becomes a piece of its own (the regex never sees it), so invalid input
  // still round-trips byte for byte. Errors only if PCRE2 itself fails (resource limits).
  absl::Status Split(std::string_view text, std::vector<std::string_view>* out) const;

 private:
  PreTokenizer() = default;
  std::string name_;
  std::string pattern_;
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace ds::tok
