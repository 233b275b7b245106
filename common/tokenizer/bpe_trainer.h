// Byte-level BPE training on a text corpus (the demo model's vocabulary, models/demo/README.md).
//
// Same conventions as MakeTinyBpe (tiny_bpe.cc), scaled to megabytes of text: ids 0..255 are the
// byte tokens in GPT-2 bytes_to_unicode() order, then one token per merge, then the control tokens
// <|endoftext|>, <|im_start|>, <|im_end|> (eos = <|im_end|>, pad = <|endoftext|>, no BOS), so
// the vocabulary loads with Tokenizer::FromData and encodes exactly as it was trained (same
// pre-tokenizer, merges applied by rank). Occurrences of the control-token texts in the corpus
// are cut out before pre-tokenization, so no merge ever spans them.
//
// The pair counts are kept incrementally (a pair -> words index and a lazy max-heap), so a merge
// costs time proportional to the words that contain the pair, not to the corpus. Deterministic:
// the most frequent pair wins, ties go to the lowest (left id, right id).
#pragma once
#include <string_view>

#include "common/tokenizer/tokenizer_data.h"
#include "common/util/status.h"

namespace ds {

struct BpeTrainOptions {
  int vocab_size = 4096;     // total ids incl. bytes and control tokens; rows left over are [PAD<id>]
  std::string pre = "qwen35";
  int64_t min_pair_count = 2;  // stop merging when the best pair is rarer than this
};

absl::StatusOr<TokenizerData> TrainBpe(std::string_view text, const BpeTrainOptions& opts);

}  // namespace ds
