// Token masks for response_format json_object: the trie walk equals a brute-force check of every
// token, and the Sampler fed masked random logits always writes one valid JSON object (parsed by
// nlohmann-json) over many seeds and sampling settings, greedy included; a replay that accepts
// the same tokens again reaches the same state.
#include "common/sampling/json_constraint.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/sampling/rng.h"
#include "common/sampling/sampler.h"

namespace ds::sampling {
namespace {

// A byte-level-BPE-like vocabulary: every single byte, JSON-shaped pieces, words, UTF-8 pieces
// (whole and cut), escapes, numbers; two end ids with no text (as control tokens are given).
struct TestVocab {
  std::vector<std::string> bytes;
  std::vector<int32_t> end_ids;
};

TestVocab MakeVocab() {
  TestVocab v;
  for (int b = 0; b < 256; ++b) v.bytes.push_back(std::string(1, static_cast<char>(b)));
  const std::vector<std::string> pieces = {"{\"",
                                           "\":",
                                           "\": ",
                                           "\",",
                                           "\", \"",
                                           "\"}",
                                           "}}",
                                           "]}",
                                           "}]",
                                           "},",
                                           "],",
                                           "[{",
                                           "{}",
                                           "[]",
                                           "true",
                                           "false",
                                           "null",
                                           "tr",
                                           "ue",
                                           "fal",
                                           "se",
                                           "nu",
                                           "ll",
                                           " true",
                                           " null",
                                           "\n  ",
                                           "\n",
                                           "  ",
                                           "    ",
                                           "name",
                                           " the",
                                           "hello",
                                           "world",
                                           "key",
                                           "value",
                                           "-0.5e+3",
                                           "1e5",
                                           "0.",
                                           "12",
                                           "345",
                                           ".25",
                                           "e-",
                                           "E+",
                                           "-1",
                                           "00",
                                           "\\n",
                                           "\\\"",
                                           "\\u00",
                                           "\\uD83D",
                                           "\\uDE00",
                                           "\\u",
                                           "\xc3\xa9",
                                           "\xe6\x97\xa5\xe6\x9c\xac",
                                           "\xf0\x9f\x98\x80",
                                           "\xe6\x97",
                                           "\x97\xa5",
                                           "\xf0\x9f",
                                           "caf\xc3\xa9",
                                           "\"a\"",
                                           "\"b\": [",
                                           "{\"x\": {\"y\": [1, 2]}}",
                                           ",\n",
                                           ", ",
                                           ": {",
                                           "}\n",
                                           "\"\"",
                                           "\\\\",
                                           "\\/",
                                           "\\t"};
  for (const std::string& p : pieces) v.bytes.push_back(p);
  v.end_ids = {static_cast<int32_t>(v.bytes.size()), static_cast<int32_t>(v.bytes.size() + 1)};
  v.bytes.push_back("");  // <|im_end|>
  v.bytes.push_back("");  // <|endoftext|>
  v.bytes.push_back("");  // another control token, never allowed
  return v;
}

std::vector<uint64_t> BruteForce(const TestVocab& v, const JsonGrammar& g) {
  std::vector<uint64_t> m((v.bytes.size() + 63) / 64, 0);
  bool any = false;
  for (size_t i = 0; i < v.bytes.size(); ++i) {
    JsonGrammar c = g;
    if (!g.complete() && !v.bytes[i].empty() && c.Feed(v.bytes[i])) {
      m[i / 64] |= 1ull << (i % 64);
      any = true;
    }
  }
  if (!any)
    for (int32_t e : v.end_ids) m[e / 64] |= 1ull << (e % 64);
  return m;
}

TEST(JsonConstraint, TrieWalkEqualsBruteForce) {
  const TestVocab v = MakeVocab();
  JsonVocab vocab(v.bytes, v.end_ids);
  const std::vector<std::string> prefixes = {"",
                                             "  ",
                                             "{",
                                             "{\"",
                                             "{\"a",
                                             "{\"a\"",
                                             "{\"a\":",
                                             "{\"a\": [",
                                             "{\"a\":[1",
                                             "{\"a\":[1,",
                                             "{\"a\":-",
                                             "{\"a\":0",
                                             "{\"a\":1.",
                                             "{\"a\":1e",
                                             "{\"a\":t",
                                             "{\"a\":\"\\",
                                             "{\"a\":\"\\u",
                                             "{\"a\":\"\\uD83D",
                                             "{\"a\":\"\\uD83D\\",
                                             "{\"a\":\"\xe6",
                                             "{\"a\":\"\xe6\x97",
                                             "{}",
                                             "{\"a\":{\"b\":[[",
                                             "{\"a\":1}"};
  for (const std::string& p : prefixes) {
    JsonGrammar g;
    ASSERT_TRUE(g.Feed(p)) << p;
    EXPECT_EQ(vocab.Allowed(g), BruteForce(v, g)) << p;
    EXPECT_EQ(vocab.Allowed(g), BruteForce(v, g)) << p << " (cached)";
  }
  EXPECT_GT(vocab.hits(), 0u);
}

struct RunResult {
  std::string text;
  std::vector<int32_t> tokens;
  bool ended = false;  // an end id was sampled
};

// One generation: random logits each step (the "model"), masked, sampled.
RunResult Generate(const TestVocab& v, std::shared_ptr<JsonVocab> vocab, SamplingParams params,
                   uint64_t logit_seed, int max_tokens) {
  Sampler sampler(params);
  JsonConstraint c(vocab);
  Rng rng(logit_seed);
  RunResult r;
  std::vector<float> logits(v.bytes.size());
  for (int step = 0; step < max_tokens; ++step) {
    for (size_t i = 0; i < logits.size(); ++i) {
      logits[i] = static_cast<float>(rng.NextDouble() * 8.0 - 4.0);
      // A nudge to close things, or random walks over the nesting depth take very long.
      const std::string& b = v.bytes[i];
      if (b.find_first_of("}]\"") != std::string::npos) logits[i] += step > 60 ? 4.0f : 1.0f;
    }
    c.Mask(logits);
    const SampleResult s = sampler.Sample(logits, r.tokens);
    EXPECT_TRUE(c.Accept(s.token).ok()) << "sampled a masked token " << s.token;
    r.tokens.push_back(s.token);
    if (std::find(v.end_ids.begin(), v.end_ids.end(), s.token) != v.end_ids.end()) {
      r.ended = true;
      EXPECT_TRUE(c.complete()) << "an end id before the object was complete: " << r.text;
      break;
    }
    r.text += v.bytes[s.token];
  }
  return r;
}

TEST(JsonConstraint, SampledOutputIsAlwaysOneJsonObject) {
  const TestVocab v = MakeVocab();
  auto vocab = std::make_shared<JsonVocab>(v.bytes, v.end_ids);
  std::vector<SamplingParams> settings(5);
  settings[0].temperature = 0.0f;  // greedy
  settings[1].temperature = 1.0f;
  settings[2].temperature = 0.7f;
  settings[2].top_p = 0.9f;
  settings[3].temperature = 1.3f;
  settings[3].top_k = 20;
  settings[3].min_p = 0.01f;
  settings[4].temperature = 0.9f;
  settings[4].repetition_penalty = 1.3f;
  settings[4].presence_penalty = 0.5f;
  settings[4].frequency_penalty = 0.5f;
  int ended = 0, runs = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed)
    for (SamplingParams p : settings) {
      p.seed = seed;
      const RunResult r = Generate(v, vocab, p, seed * 7919, 400);
      ++runs;
      if (!r.ended) continue;  // cut by max_tokens: a prefix (checked by Accept above)
      ++ended;
      const nlohmann::json j = nlohmann::json::parse(r.text, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << "seed " << seed << ": " << r.text;
      EXPECT_TRUE(j.is_object()) << r.text;
    }
  EXPECT_GT(ended, runs * 9 / 10) << "most runs should complete within 400 tokens";
}

TEST(JsonConstraint, ReplayReachesTheSameStateAndMasks) {
  const TestVocab v = MakeVocab();
  auto vocab = std::make_shared<JsonVocab>(v.bytes, v.end_ids);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 99;
  const RunResult r = Generate(v, vocab, p, 12345, 300);
  ASSERT_GT(r.tokens.size(), 10u);
  for (size_t cut : {size_t{1}, r.tokens.size() / 2, r.tokens.size() - 1}) {
    JsonConstraint a(vocab), b(vocab);
    for (size_t i = 0; i < cut; ++i) ASSERT_TRUE(a.Accept(r.tokens[i]).ok());
    for (size_t i = 0; i < cut; ++i) ASSERT_TRUE(b.Accept(r.tokens[i]).ok());
    EXPECT_EQ(a.grammar().Key(), b.grammar().Key());
    std::vector<float> la(v.bytes.size(), 0.0f), lb(v.bytes.size(), 0.0f);
    a.Mask(la);
    vocab->ClearCache();  // the replaying worker computes its masks afresh
    b.Mask(lb);
    EXPECT_EQ(la, lb);
  }
}

TEST(JsonConstraint, RefusesTokensOutsideTheMask) {
  const TestVocab v = MakeVocab();
  auto vocab = std::make_shared<JsonVocab>(v.bytes, v.end_ids);
  JsonConstraint c(vocab);
  EXPECT_FALSE(c.Accept('[').ok());
  EXPECT_FALSE(c.Accept(v.end_ids[0]).ok());  // not before the object is complete
  EXPECT_FALSE(c.Accept(-1).ok());
  ASSERT_TRUE(c.Accept('{').ok());
  ASSERT_TRUE(c.Accept('}').ok());
  EXPECT_TRUE(c.complete());
  std::vector<float> l(v.bytes.size(), 1.0f);
  c.Mask(l);
  for (size_t i = 0; i < l.size(); ++i) {
    const bool end = std::find(v.end_ids.begin(), v.end_ids.end(), i) != v.end_ids.end();
    EXPECT_EQ(std::isinf(l[i]), !end) << i;  // only the end ids are left
  }
  EXPECT_TRUE(c.Accept(v.end_ids[1]).ok());
}

}  // namespace
}  // namespace ds::sampling
