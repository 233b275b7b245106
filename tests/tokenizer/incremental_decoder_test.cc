#include "common/tokenizer/incremental_decoder.h"

#include <gtest/gtest.h>

#include <random>

#include "common/tokenizer/byte_level.h"
#include "tests/tokenizer/test_util.h"

namespace ds {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int len = tok::ValidUtf8SeqLen(s, i);
    if (len == 0) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

// With 0 merges every byte is its own token, so multi-byte characters always split.
class IncrementalDecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bytes_ = std::make_unique<Tokenizer>(Tokenizer::FromData(MakeTinyBpe(0)).value());
    merged_ = std::make_unique<Tokenizer>(Tokenizer::FromData(MakeTinyBpe(kMaxTinyMerges)).value());
  }
  std::vector<int32_t> Enc(const Tokenizer& t, const std::string& s) {
    return t.Encode(s, true).value();
  }
  std::unique_ptr<Tokenizer> bytes_, merged_;
};

TEST_F(IncrementalDecoderTest, EmojiHeldUntilComplete) {
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600
  auto ids = Enc(*bytes_, emoji);
  ASSERT_EQ(ids.size(), 4u);
  IncrementalDecoder dec(bytes_.get());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(dec.Feed(ids[i]).value(), "") << i;
    EXPECT_EQ(dec.pending_bytes(), static_cast<size_t>(i + 1));
  }
  EXPECT_EQ(dec.Feed(ids[3]).value(), emoji);
  EXPECT_EQ(dec.pending_bytes(), 0u);
  EXPECT_EQ(dec.Flush(), "");
}

TEST_F(IncrementalDecoderTest, CjkAndZwjSequence) {
  const std::string text = "你好 👨\u200d👩\u200d👧 ok";
  auto ids = Enc(*bytes_, text);
  IncrementalDecoder dec(bytes_.get());
  std::string out;
  std::vector<std::string> chunks;
  for (int32_t id : ids) {
    std::string c = dec.Feed(id).value();
    EXPECT_TRUE(IsValidUtf8(c));
    if (!c.empty()) chunks.push_back(c);
    out += c;
  }
  out += dec.Flush();
  EXPECT_EQ(out, text);
  EXPECT_EQ(chunks[0], "你");
  EXPECT_EQ(chunks[1], "好");
}

TEST_F(IncrementalDecoderTest, FlushReplacesIncompleteTail) {
  auto ids = Enc(*bytes_, "a\xE4\xBD");  // 'a' + first two bytes of U+4F60
  IncrementalDecoder dec(bytes_.get());
  std::string out;
  for (int32_t id : ids) out += dec.Feed(id).value();
  EXPECT_EQ(out, "a");
  EXPECT_EQ(dec.Flush(), kFffd);
  EXPECT_EQ(dec.pending_bytes(), 0u);
  EXPECT_EQ(dec.Flush(), "");
}

TEST_F(IncrementalDecoderTest, InvalidBytesReplacedImmediately) {
  IncrementalDecoder dec(bytes_.get());
  std::string out;
  // 0xFF can never start a sequence; E4 followed by 'x' is a broken sequence (one U+FFFD for E4).
  for (int32_t id : Enc(*bytes_, "\xFFz\xE4x")) out += dec.Feed(id).value();
  EXPECT_EQ(out, kFffd + "z" + kFffd + "x");
  EXPECT_EQ(dec.pending_bytes(), 0u);
}

TEST_F(IncrementalDecoderTest, UnknownIdLeavesStateUnchanged) {
  IncrementalDecoder dec(bytes_.get());
  auto ids = Enc(*bytes_, "\xC3\xA9");  // é
  EXPECT_EQ(dec.Feed(ids[0]).value(), "");
  EXPECT_FALSE(dec.Feed(bytes_->n_vocab() + 5).ok());
  EXPECT_EQ(dec.Feed(ids[1]).value(), "\xC3\xA9");
}

TEST_F(IncrementalDecoderTest, SpecialTokensRespectRenderFlag) {
  const std::string text = "<|im_start|>hi<|im_end|>";
  IncrementalDecoder on(merged_.get(), true), off(merged_.get(), false);
  std::string a, b;
  for (int32_t id : Enc(*merged_, text)) {
    a += on.Feed(id).value();
    b += off.Feed(id).value();
  }
  EXPECT_EQ(a, text);
  EXPECT_EQ(b, "hi");
}

TEST_F(IncrementalDecoderTest, RandomTextStreamsExactly) {
  std::mt19937 rng(3);
  for (const Tokenizer* t : {bytes_.get(), merged_.get()}) {
    for (int it = 0; it < 200; ++it) {
      const std::string text = testing_util::RandomUtf8(rng, 1 + it % 60);
      IncrementalDecoder dec(t);
      std::string out;
      for (int32_t id : Enc(*t, text)) {
        std::string c = dec.Feed(id).value();
        ASSERT_TRUE(IsValidUtf8(c));
        ASSERT_LE(dec.pending_bytes(), 3u);
        out += c;
      }
      out += dec.Flush();
      ASSERT_EQ(out, text);
    }
  }
}

TEST_F(IncrementalDecoderTest, RandomBytesGiveValidUtf8) {
  std::mt19937 rng(4);
  for (int it = 0; it < 200; ++it) {
    const std::string raw = testing_util::RandomBytes(rng, 1 + it % 50);
    IncrementalDecoder dec(merged_.get());
    std::string out;
    for (int32_t id : Enc(*merged_, raw)) out += dec.Feed(id).value();
    out += dec.Flush();
    ASSERT_TRUE(IsValidUtf8(out));
    // Same as sanitizing the whole byte string at once.
    std::string whole;
    tok::AppendSanitizedUtf8(raw, true, &whole);
    ASSERT_EQ(out, whole);
  }
}

TEST(SanitizeUtf8, MaximalSubparts) {
  // Unicode §3.9 Table 3-8 style cases.
  const auto s = [](std::string_view in) {
    std::string out;
    tok::AppendSanitizedUtf8(in, true, &out);
    return out;
  };
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(s("\xC0\xAF"), R + R);                 // C0 never valid
  EXPECT_EQ(s("\xE0\x80\xAF"), R + R + R);         // E0 needs A0..BF
  EXPECT_EQ(s("\xF4\x90\x80\x80"), R + R + R + R); // > U+10FFFF
  EXPECT_EQ(s("\xE1\x80" "a"), R + "a");           // truncated 3-byte: one U+FFFD
  EXPECT_EQ(s("\xF0\x9F\x98"), R);                 // truncated at end
  EXPECT_EQ(s("\xED\xA0\x80"), R + R + R);         // surrogate
  std::string partial;
  EXPECT_EQ(tok::AppendSanitizedUtf8("ab\xF0\x9F", false, &partial), 2u);
  EXPECT_EQ(partial, "ab");
}

}  // namespace
}  // namespace ds
