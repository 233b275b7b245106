// MakeTinyBpe + the BPE encoder, checked against an independent naive BPE.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pretokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_util.h"

namespace ds {
namespace {

// Textbook BPE, O(n^2) per word: repeatedly merge the adjacent pair with the lowest merge rank
// (leftmost on ties). Works on raw byte strings, independent of the library's id-based heap.
std::vector<std::string> NaiveBpe(const std::string& word,
                                  const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> syms;
  for (char c : word) syms.emplace_back(1, c);
  while (syms.size() > 1) {
    int best = -1, best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto it = ranks.find({syms[i], syms[i + 1]});
      if (it != ranks.end() && it->second < best_rank) {
        best_rank = it->second;
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + best + 1);
  }
  return syms;
}

std::map<std::pair<std::string, std::string>, int> RanksOf(const TokenizerData& d) {
  std::map<std::pair<std::string, std::string>, int> ranks;
  for (size_t r = 0; r < d.merges.size(); ++r) {
    const std::string& m = d.merges[r];
    const size_t sp = m.find(' ');
    auto l = tok::Gpt2ToBytes(m.substr(0, sp));
    auto rr = tok::Gpt2ToBytes(m.substr(sp + 1));
    EXPECT_TRUE(l && rr) << m;
    ranks.emplace(std::pair{*l, *rr}, static_cast<int>(r));
  }
  return ranks;
}

TEST(TinyBpe, LayoutAndLimits) {
  const TokenizerData d = MakeTinyBpe(kMaxTinyMerges);
  EXPECT_EQ(d.model, "gpt2");
  EXPECT_EQ(d.pre, "qwen35");
  EXPECT_EQ(d.merges.size(), static_cast<size_t>(kMaxTinyMerges));
  ASSERT_LE(d.tokens.size(), 1024u);
  ASSERT_EQ(d.tokens.size(), d.token_types.size());
  const auto& order = tok::BytesInCanonicalOrder();
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(d.tokens[i], tok::BytesToGpt2(std::string(1, static_cast<char>(order[i])))) << i;
  }
  EXPECT_EQ(d.tokens[0], "!");  // GPT-2 order starts with the printable bytes
  EXPECT_EQ(d.tokens[188], "\xC4\x80");  // then byte 0 as U+0100
  const size_t n = d.tokens.size();
  EXPECT_EQ(d.tokens[n - 3], "<|endoftext|>");
  EXPECT_EQ(d.tokens[n - 2], "<|im_start|>");
  EXPECT_EQ(d.tokens[n - 1], "<|im_end|>");
  for (size_t i = n - 3; i < n; ++i) EXPECT_EQ(d.token_types[i], 3);
  EXPECT_EQ(d.eos_id, static_cast<int32_t>(n - 1));
  EXPECT_EQ(d.pad_id, static_cast<int32_t>(n - 3));
  EXPECT_FALSE(d.add_bos);
  std::printf("[tiny] MakeTinyBpe(%d): %zu tokens, %zu merges\n", kMaxTinyMerges, n,
              d.merges.size());
  std::set<std::string> uniq(d.tokens.begin(), d.tokens.end());
  EXPECT_EQ(uniq.size(), n) << "duplicate token strings";
  EXPECT_EQ(MakeTinyBpe(100000).merges.size(), static_cast<size_t>(kMaxTinyMerges));
  EXPECT_EQ(MakeTinyBpe(-3).tokens.size(), 259u);
}

TEST(TinyBpe, Deterministic) {
  const TokenizerData a = MakeTinyBpe(300), b = MakeTinyBpe(300);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
  // A prefix of the training schedule: fewer merges give a prefix of the merge list.
  const TokenizerData c = MakeTinyBpe(100);
  EXPECT_TRUE(std::equal(c.merges.begin(), c.merges.end(), a.merges.begin()));
  // The first merge is the most frequent adjacent byte pair inside the pre-tokenized training
  // words (recounted here independently).
  auto pre = tok::PreTokenizer::Create("qwen35");
  ASSERT_TRUE(pre.ok());
  std::vector<std::string_view> words;
  ASSERT_TRUE(pre->Split(TinyBpeTrainingText(), &words).ok());
  std::map<std::string, int> pairs;
  for (auto w : words) {
    for (size_t i = 0; i + 1 < w.size(); ++i) ++pairs[std::string(w.substr(i, 2))];
  }
  int best = 0;
  for (const auto& [p, c] : pairs) best = std::max(best, c);
  const std::string& m0 = a.merges[0];
  const size_t sp = m0.find(' ');
  const std::string first = *tok::Gpt2ToBytes(m0.substr(0, sp)) + *tok::Gpt2ToBytes(m0.substr(sp + 1));
  EXPECT_EQ(pairs[first], best) << "first merge '" << first << "'";
}

TEST(TinyBpe, ZeroMergesIsOneTokenPerByte) {
  auto tok = Tokenizer::FromData(MakeTinyBpe(0));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text = "Hi \xF0\x9F\x98\x80!";
  auto ids = tok->Encode(text, false);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), text.size());
  const auto& order = tok::BytesInCanonicalOrder();
  for (size_t i = 0; i < text.size(); ++i) {
    EXPECT_EQ(order[(*ids)[i]], static_cast<uint8_t>(text[i]));
  }
}

TEST(TinyBpe, CompressesItsTrainingText) {
  auto tok = Tokenizer::FromData(MakeTinyBpe(kMaxTinyMerges));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->n_skipped_merges(), 0);
  const std::string text = TinyBpeTrainingText();
  auto ids = tok->Encode(text, false);
  ASSERT_TRUE(ids.ok());
  const double ratio = static_cast<double>(text.size()) / static_cast<double>(ids->size());
  // 765 merges on ~5 KB of text: most words become one or two tokens.
  EXPECT_GT(ratio, 3.0) << "bytes/token " << ratio;
  auto back = tok->Decode(*ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
}

TEST(TinyBpe, MatchesNaiveBpeOnRandomText) {
  const TokenizerData d = MakeTinyBpe(kMaxTinyMerges);
  auto tok = Tokenizer::FromData(d);
  ASSERT_TRUE(tok.ok());
  auto pre = tok::PreTokenizer::Create("qwen35");
  ASSERT_TRUE(pre.ok());
  const auto ranks = RanksOf(d);
  std::map<std::string, int32_t> id_of;
  for (size_t i = 0; i + 3 < d.tokens.size(); ++i) id_of[*tok::Gpt2ToBytes(d.tokens[i])] = i;

  // Words from the training text (many merges apply) shuffled with random text.
  std::vector<std::string_view> train_words;
  ASSERT_TRUE(pre->Split(TinyBpeTrainingText(), &train_words).ok());
  std::mt19937 rng(123);
  int64_t compared = 0;
  for (int it = 0; it < 400; ++it) {
    std::string text;
    for (int k = 0; k < 20; ++k) {
      text += std::string(train_words[rng() % train_words.size()]);
      if (rng() % 4 == 0) text += testing_util::RandomUtf8(rng, 3);
    }
    std::vector<std::string_view> words;
    ASSERT_TRUE(pre->Split(text, &words).ok());
    std::vector<int32_t> expect;
    for (auto w : words) {
      for (const std::string& s : NaiveBpe(std::string(w), ranks)) expect.push_back(id_of.at(s));
    }
    auto ids = tok->Encode(text, false);
    ASSERT_TRUE(ids.ok());
    ASSERT_EQ(*ids, expect) << text;
    compared += static_cast<int64_t>(expect.size());
  }
  EXPECT_GT(compared, 5000);
}

TEST(TinyBpe, RoundTripsArbitraryBytes) {
  auto tok = Tokenizer::FromData(MakeTinyBpe(kMaxTinyMerges));
  ASSERT_TRUE(tok.ok());
  std::mt19937 rng(99);
  std::vector<std::string> cases = {
      "",
      "\xFF",
      "\xC3",                  // truncated 2-byte sequence
      "\xE4\xBD",              // truncated CJK
      "\xED\xA0\x80",          // UTF-16 surrogate
      "\xC0\xAF",              // overlong '/'
      "\xF4\x90\x80\x80",      // > U+10FFFF
      "ok\x80\x80 then text\xF0\x9F\x98",
      std::string("nul\0inside", 10),
  };
  for (int i = 0; i < 200; ++i) cases.push_back(testing_util::RandomBytes(rng, 1 + i));
  for (int i = 0; i < 200; ++i) cases.push_back(testing_util::RandomUtf8(rng, 1 + i));
  for (const std::string& s : cases) {
    for (bool special : {false, true}) {
      auto ids = tok->Encode(s, special);
      ASSERT_TRUE(ids.ok());
      auto back = tok->Decode(*ids);
      ASSERT_TRUE(back.ok());
      ASSERT_EQ(*back, s);
    }
  }
}

}  // namespace
}  // namespace ds
