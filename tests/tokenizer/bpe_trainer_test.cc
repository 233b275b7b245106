// TrainBpe (common/tokenizer/bpe_trainer.h): the vocabulary has exactly the asked size with the
// control tokens last, it loads as a Tokenizer that round-trips any text, frequent words become
// single tokens, control-token texts in the corpus are never merged into, and training is
// deterministic.
#include "common/tokenizer/bpe_trainer.h"

#include <string>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace ds {
namespace {

std::string Corpus() {
  std::string t;
  for (int i = 0; i < 50; ++i) {
    t += "The keeper of the lighthouse watched the sea. The sea was grey and the wind was cold.\n";
    t += "<|endoftext|><|im_start|>user\nWhere is the lighthouse?<|im_end|>\n";
    t += "He counted " + std::to_string(i * 37) + " boats in the bay.\n";
  }
  return t;
}

TEST(BpeTrainer, ExactSizeControlTokensLastAndRoundTrip) {
  BpeTrainOptions o;
  o.vocab_size = 400;
  auto d = TrainBpe(Corpus(), o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->tokens.size(), 400u);
  ASSERT_EQ(d->token_types.size(), 400u);
  EXPECT_EQ(d->tokens[397], "<|endoftext|>");
  EXPECT_EQ(d->tokens[398], "<|im_start|>");
  EXPECT_EQ(d->tokens[399], "<|im_end|>");
  EXPECT_EQ(d->eos_id, 399);
  EXPECT_EQ(d->pad_id, 397);
  auto tok = Tokenizer::FromData(*d);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->n_skipped_merges(), 0);
  for (const std::string text : {Corpus(), std::string("Unseen words: zebra, quixotic, 3.14159 \xff\xfe")}) {
    auto ids = tok->Encode(text, /*parse_special=*/false);
    ASSERT_TRUE(ids.ok());
    auto back = tok->Decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
  // Frequent words of the corpus are single tokens; the control texts parse to their ids.
  auto w = tok->Encode(" lighthouse", false);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->size(), 1u);
  auto c = tok->Encode("<|im_start|>user", /*parse_special=*/true);
  ASSERT_TRUE(c.ok());
  ASSERT_GE(c->size(), 2u);
  EXPECT_EQ((*c)[0], 398);
  // No merge contains a piece of a control token's text glued to corpus text.
  for (const std::string& m : d->merges) EXPECT_EQ(m.find("|>"), std::string::npos) << m;
}

TEST(BpeTrainer, DeterministicAndPadsWhenTheTextRunsOut) {
  BpeTrainOptions o;
  o.vocab_size = 2000;  // more than this text can fill: the rest are [PAD<id>] (unused)
  auto a = TrainBpe(Corpus(), o), b = TrainBpe(Corpus(), o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->merges, b->merges);
  EXPECT_EQ(a->tokens, b->tokens);
  ASSERT_EQ(a->tokens.size(), 2000u);
  EXPECT_EQ(a->token_types[1996], static_cast<int32_t>(TokenType::kUnused));
  EXPECT_EQ(a->tokens[1996], "[PAD1996]");
  EXPECT_TRUE(Tokenizer::FromData(*a).ok());
}

TEST(BpeTrainer, RejectsTooSmallVocabulary) {
  BpeTrainOptions o;
  o.vocab_size = 258;
  auto d = TrainBpe("abc", o);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ds
