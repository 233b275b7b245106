#include "common/tokenizer/incremental_decoder.h"

#include "common/tokenizer/byte_level.h"

namespace ds {

absl::StatusOr<std::string> IncrementalDecoder::Feed(int32_t id) {
  DS_ASSIGN_OR_RETURN(std::string_view piece, tok_->TokenToPiece(id, render_special_));
  pending_.append(piece);
  std::string out;
  const size_t used = tok::AppendSanitizedUtf8(pending_, /*final=*/false, &out);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::string out;
  tok::AppendSanitizedUtf8(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

}  // namespace ds
