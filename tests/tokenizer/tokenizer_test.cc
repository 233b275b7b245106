// Tokenizer: GGUF metadata round trip and errors, special tokens, decode errors, 'none' model.
#include "common/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "common/gguf/gguf.h"
#include "common/tokenizer/byte_level.h"
#include "tests/tokenizer/test_util.h"

namespace ds {
namespace {

using ::testing::HasSubstr;

// Builds a GGUF image holding only the given writer's metadata and parses it.
struct Parsed {
  std::vector<uint8_t> bytes;
  std::unique_ptr<gguf::File> file;
};
Parsed Roundtrip(const gguf::Writer& w) {
  Parsed p;
  auto bytes = w.WriteToMemory();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  p.bytes = std::move(*bytes);
  auto f = gguf::File::Parse(p.bytes.data(), p.bytes.size());
  EXPECT_TRUE(f.ok()) << f.status();
  p.file = std::move(*f);
  return p;
}

TEST(Tokenizer, GgufRoundTripMatchesFromData) {
  const TokenizerData d = MakeTinyBpe(400);
  gguf::Writer w;
  WriteTokenizerMetadata(d, &w);
  Parsed p = Roundtrip(w);
  auto read = ReadTokenizerData(*p.file);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->model, "gpt2");
  EXPECT_EQ(read->pre, "qwen35");
  EXPECT_EQ(read->tokens, d.tokens);
  EXPECT_EQ(read->token_types, d.token_types);
  EXPECT_EQ(read->merges, d.merges);
  EXPECT_EQ(read->eos_id, d.eos_id);
  EXPECT_EQ(read->pad_id, d.pad_id);
  EXPECT_EQ(read->bos_id, -1);
  EXPECT_FALSE(read->add_bos);
  EXPECT_EQ(p.file->GetString("tokenizer.ggml.model").value(), "gpt2");
  EXPECT_FALSE(p.file->GetBool("tokenizer.ggml.add_bos_token").value());

  auto a = Tokenizer::FromGguf(*p.file);
  auto b = Tokenizer::FromData(d);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->has_vocab());
  EXPECT_EQ(a->n_vocab(), static_cast<int32_t>(d.tokens.size()));
  std::mt19937 rng(5);
  for (int i = 0; i < 50; ++i) {
    const std::string s = testing_util::RandomUtf8(rng, 60);
    EXPECT_EQ(a->Encode(s, true).value(), b->Encode(s, true).value());
  }
}

TEST(Tokenizer, SpecialTokensParsedOnlyWhenAsked) {
  auto tok = Tokenizer::FromData(MakeTinyBpe(200));
  ASSERT_TRUE(tok.ok());
  const int32_t im_start = tok->FindToken("<|im_start|>").value();
  const int32_t im_end = tok->FindToken("<|im_end|>").value();
  const std::string text = "<|im_start|>user\nhello<|im_end|>\n";
  auto on = tok->Encode(text, true);
  auto off = tok->Encode(text, false);
  ASSERT_TRUE(on.ok() && off.ok());
  EXPECT_EQ(on->front(), im_start);
  EXPECT_EQ(std::count(on->begin(), on->end(), im_end), 1);
  EXPECT_EQ(std::count(off->begin(), off->end(), im_start), 0);
  EXPECT_EQ(std::count(off->begin(), off->end(), im_end), 0);
  EXPECT_GT(off->size(), on->size());
  EXPECT_EQ(tok->Decode(*on).value(), text);
  EXPECT_EQ(tok->Decode(*off).value(), text);
  // The plain parts are encoded exactly as on their own.
  auto mid = tok->Encode("user\nhello", true);
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(std::vector<int32_t>(on->begin() + 1, on->begin() + 1 + mid->size()), *mid);
  // render_special=false drops control tokens.
  EXPECT_EQ(tok->Decode(*on, /*render_special=*/false).value(), "user\nhello\n");
  // Adjacent and partial specials.
  auto adj = tok->Encode("<|im_end|><|im_end|><|im_end", true);
  ASSERT_TRUE(adj.ok());
  EXPECT_EQ((*adj)[0], im_end);
  EXPECT_EQ((*adj)[1], im_end);
  EXPECT_NE((*adj)[2], im_end);
  EXPECT_EQ(tok->Decode(*adj).value(), "<|im_end|><|im_end|><|im_end");
}

TEST(Tokenizer, LongestSpecialMatchWinsAndUserDefinedNeedsParseSpecial) {
  TokenizerData d = MakeTinyBpe(100);
  const auto add = [&](std::string s, TokenType t) {
    d.tokens.push_back(std::move(s));
    d.token_types.push_back(static_cast<int32_t>(t));
    return static_cast<int32_t>(d.tokens.size() - 1);
  };
  const int32_t short_id = add("<tool>", TokenType::kControl);
  const int32_t long_id = add("<tool><call>", TokenType::kControl);
  const int32_t think = add("<think>", TokenType::kUserDefined);
  const int32_t unused = add("[PAD999]", TokenType::kUnused);
  auto tok = Tokenizer::FromData(d);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto ids = tok->Encode("<tool><call>x<tool>", true);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 3u);
  EXPECT_EQ((*ids)[0], long_id);
  EXPECT_EQ((*ids)[2], short_id);
  auto t1 = tok->Encode("a<think>b", true);
  auto t0 = tok->Encode("a<think>b", false);
  ASSERT_TRUE(t1.ok() && t0.ok());
  EXPECT_EQ(std::count(t1->begin(), t1->end(), think), 1);
  EXPECT_EQ(std::count(t0->begin(), t0->end(), think), 0);
  // User-defined tokens always render; unused ones never; unused text is never produced.
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{think}, false).value(), "<think>");
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{unused}).value(), "");
  auto pad = tok->Encode("[PAD999]", true);
  ASSERT_TRUE(pad.ok());
  EXPECT_EQ(std::count(pad->begin(), pad->end(), unused), 0);
  EXPECT_EQ(tok->token_type(think), TokenType::kUserDefined);
  EXPECT_EQ(tok->token_type(-1), TokenType::kUndefined);
}

TEST(Tokenizer, MergeRanksAndLeftmostTies) {
  // Hand-made vocabulary: 256 bytes + "bc", "ab", "aa".
  const auto make = [](std::vector<std::string> merges) {
    TokenizerData d;
    for (uint8_t b : tok::BytesInCanonicalOrder()) {
      d.tokens.push_back(tok::BytesToGpt2(std::string(1, static_cast<char>(b))));
      d.token_types.push_back(1);
    }
    for (const char* t : {"bc", "ab", "aa"}) {
      d.tokens.push_back(t);
      d.token_types.push_back(1);
    }
    d.merges = std::move(merges);
    return Tokenizer::FromData(d).value();
  };
  const int32_t bc = 256, ab = 257, aa = 258;
  const auto id = [](char c) {
    const auto& o = tok::BytesInCanonicalOrder();
    return static_cast<int32_t>(std::find(o.begin(), o.end(), static_cast<uint8_t>(c)) - o.begin());
  };
  EXPECT_EQ(make({"b c", "a b"}).Encode("abc", false).value(), (std::vector<int32_t>{id('a'), bc}));
  EXPECT_EQ(make({"a b", "b c"}).Encode("abc", false).value(), (std::vector<int32_t>{ab, id('c')}));
  EXPECT_EQ(make({"a a"}).Encode("aaa", false).value(), (std::vector<int32_t>{aa, id('a')}));
  EXPECT_EQ(make({"a a"}).Encode("aaaa", false).value(), (std::vector<int32_t>{aa, aa}));
  // Merges whose result is not a token are dropped (counted), not fatal.
  auto t = make({"a c", "a b"});
  EXPECT_EQ(t.n_skipped_merges(), 1);
  EXPECT_EQ(t.Encode("acab", false).value(), (std::vector<int32_t>{id('a'), id('c'), ab}));
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  auto tok = Tokenizer::FromData(MakeTinyBpe(10));
  ASSERT_TRUE(tok.ok());
  const int32_t n = tok->n_vocab();
  auto bad = tok->Decode(std::vector<int32_t>{1, 2, n});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(absl::StrCat("token id ", n)));
  auto neg = tok->TokenToPiece(-1);
  ASSERT_FALSE(neg.ok());
  EXPECT_THAT(std::string(neg.status().message()), HasSubstr("token id -1"));
}

TEST(Tokenizer, EosIds) {
  auto tok = Tokenizer::FromData(MakeTinyBpe(10));
  ASSERT_TRUE(tok.ok());
  const int32_t eot = tok->FindToken("<|endoftext|>").value();
  const int32_t im_end = tok->FindToken("<|im_end|>").value();
  EXPECT_EQ(tok->eos_id(), im_end);
  EXPECT_EQ(tok->pad_id(), eot);
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{eot, im_end}));
  EXPECT_TRUE(tok->IsEos(eot));
  EXPECT_TRUE(tok->IsEos(im_end));
  EXPECT_FALSE(tok->IsEos(tok->FindToken("<|im_start|>").value()));
  // eos pointing at another token still adds the two ChatML stops.
  TokenizerData d = MakeTinyBpe(10);
  d.eos_id = 5;
  auto t2 = Tokenizer::FromData(d);
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(t2->eos_ids(), (std::vector<int32_t>{5, eot, im_end}));
}

// ---- GGUF errors ----------------------------------------------------------------------------

absl::Status LoadStatus(const gguf::Writer& w) {
  Parsed p = Roundtrip(w);
  return Tokenizer::FromGguf(*p.file).status();
}

void WriteExcept(const TokenizerData& d, const std::string& skip, gguf::Writer* w) {
  if (skip != "tokenizer.ggml.model") w->AddString("tokenizer.ggml.model", d.model);
  if (skip != "tokenizer.ggml.pre") w->AddString("tokenizer.ggml.pre", d.pre);
  if (skip != "tokenizer.ggml.tokens") w->AddStringArray("tokenizer.ggml.tokens", d.tokens);
  if (skip != "tokenizer.ggml.token_type") w->AddI32Array("tokenizer.ggml.token_type", d.token_types);
  if (skip != "tokenizer.ggml.merges") w->AddStringArray("tokenizer.ggml.merges", d.merges);
  w->AddU32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(d.eos_id));
}

TEST(TokenizerGguf, MissingRequiredKeysAreNamed) {
  const TokenizerData d = MakeTinyBpe(20);
  for (const char* key : {"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                          "tokenizer.ggml.merges"}) {
    gguf::Writer w;
    WriteExcept(d, key, &w);
    absl::Status s = LoadStatus(w);
    ASSERT_FALSE(s.ok()) << key;
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(key));
  }
  // token_type is optional (llama.cpp: all normal).
  gguf::Writer w;
  WriteExcept(d, "tokenizer.ggml.token_type", &w);
  Parsed p = Roundtrip(w);
  auto tok = Tokenizer::FromGguf(*p.file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->token_type(0), TokenType::kNormal);
}

TEST(TokenizerGguf, InconsistentOrInvalidValues) {
  const TokenizerData good = MakeTinyBpe(20);
  {
    TokenizerData d = good;
    d.token_types.pop_back();
    gguf::Writer w;
    WriteTokenizerMetadata(d, &w);
    absl::Status s = LoadStatus(w);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("tokenizer.ggml.token_type: length"));
  }
  {
    TokenizerData d = good;
    d.token_types[7] = 9;
    gguf::Writer w;
    WriteTokenizerMetadata(d, &w);
    absl::Status s = LoadStatus(w);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("tokenizer.ggml.token_type[7]"));
  }
  {
    TokenizerData d = good;
    d.eos_id = static_cast<int32_t>(d.tokens.size());
    gguf::Writer w;
    WriteTokenizerMetadata(d, &w);
    absl::Status s = LoadStatus(w);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("tokenizer.ggml.eos_token_id"));
  }
  {
    TokenizerData d = good;
    d.merges[3] = "nospace";
    gguf::Writer w;
    WriteTokenizerMetadata(d, &w);
    absl::Status s = LoadStatus(w);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("tokenizer.ggml.merges[3]"));
  }
  {
    TokenizerData d = good;
    d.pre = "llama-bpe";
    gguf::Writer w;
    WriteTokenizerMetadata(d, &w);
    absl::Status s = LoadStatus(w);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("tokenizer.ggml.pre"));
  }
  {
    gguf::Writer w;
    w.AddString("tokenizer.ggml.model", "llama");
    absl::Status s = LoadStatus(w);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("'llama'"));
  }
  {
    // Wrong value type for a key.
    gguf::Writer w;
    WriteExcept(good, "tokenizer.ggml.tokens", &w);
    w.AddI32Array("tokenizer.ggml.tokens", {1, 2, 3});
    absl::Status s = LoadStatus(w);
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr("tokenizer.ggml.tokens"));
  }
}

TEST(TokenizerGguf, ModelNoneHasNoVocabulary) {
  TokenizerData d;
  d.model = "none";
  d.eos_id = 7;
  gguf::Writer w;
  WriteTokenizerMetadata(d, &w);
  Parsed p = Roundtrip(w);
  EXPECT_EQ(p.file->Find("tokenizer.ggml.tokens"), nullptr);
  auto tok = Tokenizer::FromGguf(*p.file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_FALSE(tok->has_vocab());
  EXPECT_EQ(tok->model_name(), "none");
  EXPECT_EQ(tok->n_vocab(), 0);
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{7}));
  auto enc = tok->Encode("hello", false);
  ASSERT_FALSE(enc.ok());
  EXPECT_EQ(enc.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(enc.status().message(), "model has no vocabulary; use --prompt-ids");
  EXPECT_FALSE(tok->Decode(std::vector<int32_t>{1}).ok());
}

TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
  auto tok = Tokenizer::FromData(MakeTinyBpe(kMaxTinyMerges));
  ASSERT_TRUE(tok.ok());
  std::mt19937 rng(11);
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> expect;
  for (int i = 0; i < 64; ++i) {
    texts.push_back(testing_util::RandomUtf8(rng, 200) + TinyBpeTrainingText());
  }
  {
    auto fresh = Tokenizer::FromData(MakeTinyBpe(kMaxTinyMerges));
    for (const auto& t : texts) expect.push_back(fresh->Encode(t, true).value());
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < 3; ++r) {
        for (size_t i = t; i < texts.size() + t; ++i) {
          const size_t k = i % texts.size();
          if (tok->Encode(texts[k], true).value() != expect[k]) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace ds
