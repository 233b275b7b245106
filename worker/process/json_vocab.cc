#include "worker/process/json_vocab.h"

#include <string>
#include <vector>

namespace ds::worker {

absl::StatusOr<std::shared_ptr<sampling::JsonVocab>> JsonVocabFromTokenizer(const Tokenizer& tok) {
  if (!tok.has_vocab() || tok.eos_ids().empty())
    return absl::FailedPreconditionError(
        "json_object: the model has no vocabulary (or no EOS id) to constrain");
  std::vector<std::string> bytes(static_cast<size_t>(tok.n_vocab()));
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    const TokenType t = tok.token_type(id);
    if (t != TokenType::kNormal && t != TokenType::kByte) continue;
    absl::StatusOr<std::string_view> piece = tok.TokenToPiece(id);
    if (piece.ok()) bytes[static_cast<size_t>(id)] = std::string(*piece);
  }
  return std::make_shared<sampling::JsonVocab>(bytes, tok.eos_ids());
}

absl::StatusOr<std::shared_ptr<sampling::JsonVocab>> JsonVocabFromGguf(const gguf::File& file) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::FromGguf(file);
  if (!tok.ok()) return tok.status();
  return JsonVocabFromTokenizer(*tok);
}

}  // namespace ds::worker
