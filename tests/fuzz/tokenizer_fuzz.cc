// libFuzzer target for the tokenizer on untrusted text (prompts, chat contents) and on whatever
// ids a model generates. Checks the contracts the gateway relies on:
//  - Encode(bytes, parse_special = false) accepts any bytes, yields no control or user-defined
//    token, and Decode gives the bytes back exactly (tokenizer.h);
//  - the streaming decoder (IncrementalDecoder: one token at a time) emits well-formed UTF-8,
//    the same text as sanitizing the whole output at once, and the input itself when it was
//    valid UTF-8 (what reaches a client must not depend on where tokens split characters).
// The vocabulary: tests/fuzz/fuzz_vocab.h.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/incremental_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_vocab.h"

namespace {

void Check(bool cond, const char* what) { ds::fuzz::Check(cond, "tokenizer_fuzz", what); }

const ds::Tokenizer& Tok() { return ds::fuzz::FuzzTokenizer(); }

using ds::fuzz::ValidUtf8;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ds::Tokenizer& tok = Tok();
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // Untrusted text -> ids -> the same bytes, never a special token.
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text, /*parse_special=*/false);
  Check(ids.ok(), "Encode accepts any bytes");
  for (int32_t id : *ids) {
    Check(id >= 0 && id < tok.n_vocab(), "ids in range");
    Check(!ds::fuzz::IsSpecial(tok, id), "no control or user-defined token from plain text");
  }
  absl::StatusOr<std::string> back = tok.Decode(*ids);
  Check(back.ok() && *back == text, "Decode(Encode(bytes)) == bytes");

  // With specials parsed, the ids still decode to the text (special tokens render as their text).
  absl::StatusOr<std::vector<int32_t>> special_ids = tok.Encode(text, /*parse_special=*/true);
  Check(special_ids.ok(), "Encode with specials accepts any bytes");
  absl::StatusOr<std::string> special_back = tok.Decode(*special_ids);
  Check(special_back.ok() && *special_back == text, "specials round-trip");

  // The streaming decoder over the same ids, and over ids taken from the input's bytes (a model
  // may generate any sequence, including byte tokens that split or break characters).
  std::vector<int32_t> generated;
  for (size_t i = 0; i + 1 < size; i += 2)
    generated.push_back((data[i] | (data[i + 1] << 8)) % tok.n_vocab());
  for (const std::vector<int32_t>* seq : {&*ids, &generated}) {
    ds::IncrementalDecoder dec(&tok);
    std::string streamed;
    for (int32_t id : *seq) {
      absl::StatusOr<std::string> piece = dec.Feed(id);
      Check(piece.ok(), "Feed of an id in range");
      Check(ValidUtf8(*piece), "each streamed piece is well-formed UTF-8");
      streamed += *piece;
    }
    streamed += dec.Flush();
    Check(ValidUtf8(streamed), "the stream is well-formed UTF-8");
    absl::StatusOr<std::string> whole = tok.Decode(*seq);
    Check(whole.ok(), "Decode of ids in range");
    std::string sanitized;
    ds::tok::AppendSanitizedUtf8(*whole, /*final=*/true, &sanitized);
    Check(streamed == sanitized, "streaming equals sanitizing the whole output");
    if (seq == &*ids && ValidUtf8(text)) Check(streamed == text, "valid UTF-8 streams unchanged");
  }
  return 0;
}
