// Byte-level BPE tokenizer (llama.cpp `gpt2` model with the `qwen2`/`qwen35` pre-tokenizers),
// loaded from GGUF `tokenizer.ggml.*` metadata or from a TokenizerData.
//
// Encode: optional special-token split (longest match first) -> regex pre-tokenizer -> per word,
// byte-level BPE by merge rank (leftmost first among equal ranks), which reproduces HF/llama.cpp
// ids. No Unicode normalization is applied (llama.cpp does none; the HF Qwen tokenizer applies NFC,
// so the two differ only on non-NFC input). No BOS is added by Encode; callers that need one check
// add_bos()/bos_id().
//
// A model whose tokenizer.ggml.model is "none" loads as a Tokenizer with has_vocab() == false:
// Encode/Decode then fail with FailedPrecondition ("model has no vocabulary; use --prompt-ids"),
// while eos_ids() still reports any stop ids present in the metadata.
//
// Thread-safety: all const methods may be called concurrently (the word cache is locked).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer_data.h"
#include "common/util/status.h"

namespace ds {

class Tokenizer {
 public:
  static absl::StatusOr<Tokenizer> FromData(const TokenizerData& data);
  static absl::StatusOr<Tokenizer> FromGguf(const gguf::File& file);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  bool has_vocab() const;
  const std::string& model_name() const;  // "gpt2" or "none"
  const std::string& pre_name() const;    // "qwen2"/"qwen35"; empty without vocabulary
  int32_t n_vocab() const;                // 0 without vocabulary

  // text -> ids. parse_special: control (type 3) and user-defined (type 4) token texts in `text`
  // become their ids (longest match first); otherwise they are encoded as plain text, so untrusted
  // text can never produce e.g. <|im_end|> or <think>. (llama.cpp differs here: it matches
  // user-defined tokens even without parse_special; HF always matches every added token, i.e.
  // parse_special = true.) Arbitrary bytes are accepted (invalid UTF-8 is encoded byte-level and
  // round-trips through Decode).
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool parse_special) const;

  // ids -> raw bytes (not necessarily valid UTF-8). InvalidArgument names the first id outside
  // [0, n_vocab). render_special=false drops control tokens (user-defined ones always render, as
  // in llama.cpp); unused tokens render as nothing.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     bool render_special = true) const;
  // The raw bytes of one token (same rules as Decode). The view lives as long as the Tokenizer.
  absl::StatusOr<std::string_view> TokenToPiece(int32_t id, bool render_special = true) const;

  TokenType token_type(int32_t id) const;  // kUndefined for ids out of range
  // Id of the token whose raw bytes are exactly `text` (any type; lowest id wins); nullopt if none.
  std::optional<int32_t> FindToken(std::string_view text) const;

  int32_t eos_id() const;  // -1 if absent
  int32_t bos_id() const;
  int32_t pad_id() const;
  bool add_bos() const;
  // Ids that end generation: eos plus <|im_end|> and <|endoftext|> when present. Sorted, unique.
  const std::vector<int32_t>& eos_ids() const;
  bool IsEos(int32_t id) const;

  // Merges dropped at load because a side or the merged string is not a normal/byte token.
  int64_t n_skipped_merges() const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds
