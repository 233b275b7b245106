// Tokenizer vocabulary in llama.cpp GGUF conventions (the `tokenizer.ggml.*` keys, spec §9.5), plus
// reading/writing those keys and a tiny deterministic BPE vocabulary for generated test models.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/util/status.h"

namespace ds {
namespace gguf {
class File;
class Writer;
}  // namespace gguf

// llama.cpp token types (`tokenizer.ggml.token_type`).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct TokenizerData {
  std::string model = "gpt2";  // "gpt2" (byte-level BPE) or "none" (no vocabulary)
  std::string pre = "qwen35";  // pre-tokenizer: "qwen35" or "qwen2"
  // Token strings by id. Normal tokens use the GPT-2 byte->unicode spelling; control and
  // user-defined tokens are plain UTF-8 (as llama.cpp's converter writes them).
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // TokenType values, same length as tokens
  std::vector<std::string> merges;   // "left right" in GPT-2 spelling; rank = index
  int32_t eos_id = -1;               // -1: absent
  int32_t bos_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;
};

// Writes tokenizer.ggml.{model,pre,tokens,token_type,merges,eos_token_id,bos_token_id,
// padding_token_id,add_bos_token}. Ids < 0 are not written; model "none" writes only the model
// name and the special ids.
void WriteTokenizerMetadata(const TokenizerData& data, gguf::Writer* writer);

// Reads the same keys back. Missing required keys (model; for gpt2 also pre, tokens, merges) are
// NotFound naming the key; inconsistent lengths, bad token types and out-of-range ids are
// InvalidArgument naming the key. token_type is optional (all normal when absent, as llama.cpp).
absl::StatusOr<TokenizerData> ReadTokenizerData(const gguf::File& file);

// Small deterministic byte-level BPE vocabulary for the project's tiny generated models:
// ids 0..255 are the 256 byte tokens in GPT-2 bytes_to_unicode() order, then the tokens created
// by `n_merges` rounds of BPE training on a built-in English + code text (qwen35 pre-tokenizer;
// most frequent pair first, ties to the lowest (left id, right id)), then the control tokens
// <|endoftext|>, <|im_start|>, <|im_end|>. eos = <|im_end|>, pad = <|endoftext|>, no BOS.
// n_merges is clamped to [0, kMaxTinyMerges], so the vocabulary has at most 1024 entries.
inline constexpr int kMaxTinyMerges = 765;
TokenizerData MakeTinyBpe(int n_merges);
// The built-in training text (exposed for tests).
const char* TinyBpeTrainingText();

}  // namespace ds
