// Streaming detokenizer: feed generated ids one at a time, get back only complete UTF-8 text.
// Byte-level BPE tokens can end in the middle of a multi-byte character (emoji, CJK); those bytes
// are held back until the character completes. Ill-formed bytes become U+FFFD as soon as they are
// known to be ill-formed; Flush() turns a still-incomplete tail into one U+FFFD.
#pragma once
#include <cstdint>
#include <string>

#include "common/tokenizer/tokenizer.h"

namespace ds {

class IncrementalDecoder {
 public:
  // `tok` must outlive the decoder. render_special as in Tokenizer::Decode.
  explicit IncrementalDecoder(const Tokenizer* tok, bool render_special = true)
      : tok_(tok), render_special_(render_special) {}

  // Appends the token's bytes and returns the newly completed text (possibly empty).
  // InvalidArgument for an unknown id (the decoder state is unchanged).
  absl::StatusOr<std::string> Feed(int32_t id);
  // Returns the held-back tail (as U+FFFD if it is an incomplete sequence) and resets.
  std::string Flush();
  void Reset() { pending_.clear(); }
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool render_special_;
  std::string pending_;  // bytes of an incomplete trailing sequence (at most 3)
};

}  // namespace ds
