#include "common/tokenizer/tokenizer_data.h"

#include "common/gguf/gguf.h"

namespace ds {
namespace {

constexpr char kModel[] = "tokenizer.ggml.model";
constexpr char kPre[] = "tokenizer.ggml.pre";
constexpr char kTokens[] = "tokenizer.ggml.tokens";
constexpr char kTypes[] = "tokenizer.ggml.token_type";
constexpr char kMerges[] = "tokenizer.ggml.merges";
constexpr char kEos[] = "tokenizer.ggml.eos_token_id";
constexpr char kBos[] = "tokenizer.ggml.bos_token_id";
constexpr char kPad[] = "tokenizer.ggml.padding_token_id";
constexpr char kAddBos[] = "tokenizer.ggml.add_bos_token";

// Optional token id: -1 when absent; present ids must fit [0, n) when n > 0 (n = 0: no vocabulary
// to check against, only non-negativity).
absl::StatusOr<int32_t> ReadId(const gguf::File& f, const char* key, size_t n) {
  if (f.Find(key) == nullptr) return -1;
  DS_ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
  if (v < 0 || v > INT32_MAX || (n > 0 && static_cast<uint64_t>(v) >= n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": id ", v, " out of range [0, ", n, ")"));
  }
  return static_cast<int32_t>(v);
}

}  // namespace

void WriteTokenizerMetadata(const TokenizerData& d, gguf::Writer* w) {
  w->AddString(kModel, d.model);
  if (d.model != "none") {
    w->AddString(kPre, d.pre);
    w->AddStringArray(kTokens, d.tokens);
    w->AddI32Array(kTypes, d.token_types);
    w->AddStringArray(kMerges, d.merges);
  }
  // llama.cpp writes token ids as uint32.
  if (d.eos_id >= 0) w->AddU32(kEos, static_cast<uint32_t>(d.eos_id));
  if (d.bos_id >= 0) w->AddU32(kBos, static_cast<uint32_t>(d.bos_id));
  if (d.pad_id >= 0) w->AddU32(kPad, static_cast<uint32_t>(d.pad_id));
  w->AddBool(kAddBos, d.add_bos);
}

absl::StatusOr<TokenizerData> ReadTokenizerData(const gguf::File& f) {
  TokenizerData d;
  DS_ASSIGN_OR_RETURN(d.model, f.GetString(kModel));
  d.pre.clear();
  if (f.Find(kAddBos) != nullptr) {
    DS_ASSIGN_OR_RETURN(d.add_bos, f.GetBool(kAddBos));
  }
  if (d.model == "none") {
    DS_ASSIGN_OR_RETURN(d.eos_id, ReadId(f, kEos, 0));
    DS_ASSIGN_OR_RETURN(d.bos_id, ReadId(f, kBos, 0));
    DS_ASSIGN_OR_RETURN(d.pad_id, ReadId(f, kPad, 0));
    return d;
  }
  if (d.model != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat(kModel, ": unsupported model '", d.model, "' (supported: gpt2, none)"));
  }
  DS_ASSIGN_OR_RETURN(d.pre, f.GetString(kPre));
  DS_ASSIGN_OR_RETURN(d.tokens, f.GetStringArray(kTokens));
  const size_t n = d.tokens.size();
  if (n == 0) return absl::InvalidArgumentError(absl::StrCat(kTokens, ": empty"));
  if (f.Find(kTypes) != nullptr) {
    DS_ASSIGN_OR_RETURN(std::vector<int64_t> types, f.GetIntArray(kTypes));
    if (types.size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(kTypes, ": length ", types.size(), " != ",
                                                     kTokens, " length ", n));
    }
    d.token_types.resize(n);
    for (size_t i = 0; i < n; ++i) {
      if (types[i] < 0 || types[i] > 6) {
        return absl::InvalidArgumentError(
            absl::StrCat(kTypes, "[", i, "]: invalid token type ", types[i]));
      }
      d.token_types[i] = static_cast<int32_t>(types[i]);
    }
  } else {
    d.token_types.assign(n, static_cast<int32_t>(TokenType::kNormal));
  }
  DS_ASSIGN_OR_RETURN(d.merges, f.GetStringArray(kMerges));
  DS_ASSIGN_OR_RETURN(d.eos_id, ReadId(f, kEos, n));
  DS_ASSIGN_OR_RETURN(d.bos_id, ReadId(f, kBos, n));
  DS_ASSIGN_OR_RETURN(d.pad_id, ReadId(f, kPad, n));
  return d;
}

}  // namespace ds
