#include "common/tokenizer/pretokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "common/tokenizer/byte_level.h"
#include "tests/tokenizer/test_util.h"

namespace ds::tok {
namespace {

std::vector<std::string> SplitStr(const PreTokenizer& p, std::string_view text) {
  std::vector<std::string_view> v;
  EXPECT_TRUE(p.Split(text, &v).ok());
  return std::vector<std::string>(v.begin(), v.end());
}

using V = std::vector<std::string>;

TEST(PreTokenizer, UnknownNameIsError) {
  auto p = PreTokenizer::Create("llama3");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("tokenizer.ggml.pre"), std::string::npos);
}

TEST(PreTokenizer, Qwen2Basics) {
  auto p = PreTokenizer::Create("qwen2");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(SplitStr(*p, "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(SplitStr(*p, "don't I'M we'Re"), (V{"don", "'t", " I", "'M", " we", "'Re"}));
  EXPECT_EQ(SplitStr(*p, "x=12345;"), (V{"x", "=", "1", "2", "3", "4", "5", ";"}));
  EXPECT_EQ(SplitStr(*p, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(SplitStr(*p, "a\n\n b\t\tc"), (V{"a", "\n\n", " b", "\t", "\tc"}));
  EXPECT_EQ(SplitStr(*p, "end.\n\nNext"), (V{"end", ".\n\n", "Next"}));
  EXPECT_EQ(SplitStr(*p, "trailing   "), (V{"trailing", "   "}));
  // The optional non-letter prefix also takes full-width punctuation.
  EXPECT_EQ(SplitStr(*p, "你好，世界"), (V{"你好", "，世界"}));
}

TEST(PreTokenizer, CombiningMarksDifferBetweenQwen2AndQwen35) {
  auto q2 = PreTokenizer::Create("qwen2");
  auto q35 = PreTokenizer::Create("qwen35");
  ASSERT_TRUE(q2.ok() && q35.ok());
  const std::string text = "q\xCC\x87x a\xCC\x8D";  // q U+0307 x, a U+030D
  // qwen2: a mark is a "non-letter" that may prefix the next letter run.
  EXPECT_EQ(SplitStr(*q2, text), (V{"q", "\xCC\x87x", " a", "\xCC\x8D"}));
  EXPECT_EQ(SplitStr(*q35, text), (V{"q\xCC\x87x", " a\xCC\x8D"}));
}

TEST(PreTokenizer, NextLineIsWhitespaceAsInUnicode) {
  // U+0085 has the Unicode White_Space property (llama.cpp, HF Rust) but is not in PCRE2's UCP \s.
  auto p = PreTokenizer::Create("qwen35");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(SplitStr(*p, "a\xC2\x85\xC2\x85" "b"), (V{"a", "\xC2\x85", "\xC2\x85" "b"}));
  // U+FEFF is not White_Space: it is punctuation-like here.
  EXPECT_EQ(SplitStr(*p, "a \xEF\xBB\xBF" "b"), (V{"a", " \xEF\xBB\xBF", "b"}));
}

TEST(PreTokenizer, InvalidUtf8BecomesOwnPieces) {
  auto p = PreTokenizer::Create("qwen35");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(SplitStr(*p, "ab\xFF\xFE" "cd \xC3"), (V{"ab", "\xFF\xFE", "cd", " ", "\xC3"}));
  EXPECT_EQ(SplitStr(*p, "\xED\xA0\x80x"), (V{"\xED\xA0\x80", "x"}));  // surrogate
}

TEST(PreTokenizer, PiecesConcatenateToInput) {
  auto p = PreTokenizer::Create("qwen35");
  ASSERT_TRUE(p.ok());
  std::mt19937 rng(7);
  for (int it = 0; it < 300; ++it) {
    const std::string s = (it % 3 == 2) ? testing_util::RandomBytes(rng, 64)
                                        : testing_util::RandomUtf8(rng, 80);
    std::vector<std::string_view> v;
    ASSERT_TRUE(p->Split(s, &v).ok());
    std::string joined;
    for (auto piece : v) {
      EXPECT_FALSE(piece.empty());
      joined.append(piece);
    }
    ASSERT_EQ(joined, s);
  }
}

TEST(PreTokenizer, HugeRunsDoNotFail) {
  auto p = PreTokenizer::Create("qwen35");
  ASSERT_TRUE(p.ok());
  for (const std::string& s : {std::string(1 << 20, ' ') + "x", std::string(1 << 20, 'a'),
                               std::string(1 << 20, '!'), std::string(1 << 19, '\n') + "y"}) {
    std::vector<std::string_view> v;
    ASSERT_TRUE(p->Split(s, &v).ok());
    size_t total = 0;
    for (auto piece : v) total += piece.size();
    EXPECT_EQ(total, s.size());
    EXPECT_LE(v.size(), 2u);
  }
}

}  // namespace
}  // namespace ds::tok
