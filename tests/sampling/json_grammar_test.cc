// The JSON-object automaton behind response_format json_object: every construct accepted,
// invalid prefixes refused at the first byte that makes them invalid, UTF-8 and escape rules,
// the interoperability bounds, and agreement with nlohmann-json on random texts.
#include "common/sampling/json_grammar.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>

namespace ds::sampling {
namespace {

// Index of the first byte the grammar refuses, or -1 when it takes them all.
int FirstRefused(std::string_view s, JsonGrammar* out = nullptr) {
  JsonGrammar g;
  for (size_t i = 0; i < s.size(); ++i)
    if (!g.Step(static_cast<uint8_t>(s[i]))) {
      if (out) *out = g;
      return static_cast<int>(i);
    }
  if (out) *out = g;
  return -1;
}

bool NlohmannObject(std::string_view s) {
  const nlohmann::json j = nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false);
  return !j.is_discarded() && j.is_object();
}

TEST(JsonGrammar, AcceptsEveryConstruct) {
  const std::vector<std::string> ok = {
      "{}",
      " \n\t\r{ }",
      "{\"a\":1}",
      "{\"a\":[1,-0.5e+3,2E-2,0,-0,0.25,1e5,12345678901234567890,true,false,null,\"x\",{},[]]}",
      "{\"nested\":{\"b\":{\"c\":[[[]],{\"d\":null}]}}}",
      "{\"esc\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\u0000\\uD83D\\uDE00\\uffff\"}",
      "{\"utf8\":\"\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 \xef\xbf\xbf "
      "\xf4\x8f\xbf\xbf\"}",
      "{\n  \"pretty\": [\n    1,\n    2\n  ],\n  \"k\" : \"v\"\n}",
      "{\"\":\"\",\"a b\":\"\x7f\"}",
  };
  for (const std::string& s : ok) {
    JsonGrammar g;
    EXPECT_EQ(FirstRefused(s, &g), -1) << s;
    EXPECT_TRUE(g.complete()) << s;
    EXPECT_TRUE(NlohmannObject(s)) << s;  // the test's own inputs are valid JSON
  }
}

TEST(JsonGrammar, RefusesInvalidPrefixesAtTheFirstBadByte) {
  struct Case {
    std::string text;
    int refused_at;
  };
  const std::vector<Case> cases = {
      {"[1]", 0},  // top level must be an object
      {"\"x\"", 0},
      {"1", 0},
      {"{'a':1}", 1},
      {"{\"a\":01}", 6},  // no leading zeros
      {"{\"a\":1.}", 7},  // a fraction needs a digit
      {"{\"a\":.5}", 5},
      {"{\"a\":-}", 6},
      {"{\"a\":--1}", 6},
      {"{\"a\":1e}", 7},
      {"{\"a\":1e+}", 8},
      {"{\"a\":+1}", 5},
      {"{\"a\":tru}", 8},
      {"{\"a\":nulx}", 8},
      {"{\"a\":True}", 5},
      {"{\"a\":1,}", 7},  // trailing comma
      {"{,}", 1},
      {"{\"a\" 1}", 5},
      {"{\"a\":1]", 6},  // mismatched brackets
      {"{\"a\":[1}", 7},
      {"{\"a\":[1,]}", 8},
      {"{\"a\":\"\x01\"}", 6},  // raw control character in a string
      {"{\"a\":\"\n\"}", 6},
      {"{\"a\":\"\\q\"}", 7},  // unknown escape
      {"{\"a\":\"\\u12G4\"}", 10},
      {"{\"a\":\"\\uDC00\"}", 9},    // lone low surrogate: refused at its second digit
      {"{\"a\":\"\\uD800x\"}", 12},  // a high surrogate must be followed by \u
      {"{\"a\":\"\\uD800\\n\"}", 13},
      {"{\"a\":\"\\uD800\\u0041\"}", 14},   // ... and by a low one
      {"{\"a\":\"\xc0\x80\"}", 6},          // overlong lead
      {"{\"a\":\"\xe0\x80\x80\"}", 7},      // overlong 3-byte form
      {"{\"a\":\"\xed\xa0\x80\"}", 7},      // UTF-8 surrogate
      {"{\"a\":\"\xf4\x90\x80\x80\"}", 7},  // above U+10FFFF
      {"{\"a\":\"\xf5\"}", 6},
      {"{\"a\":\"\x80\"}", 6},  // continuation byte without a lead
      {"{\"a\":\"\xc3\"}", 7},  // a lead byte cut by the closing quote
      {"{}{}", 2},
      {"{1:2}", 1},  // keys are strings
  };
  for (const Case& c : cases) {
    JsonGrammar g;
    EXPECT_EQ(FirstRefused(c.text, &g), c.refused_at) << c.text;
    EXPECT_FALSE(NlohmannObject(c.text)) << c.text;
  }
}

TEST(JsonGrammar, RefusalLeavesTheStateAsItWas) {
  JsonGrammar g;
  ASSERT_TRUE(g.Feed("{\"a\":12"));
  const JsonGrammar::KeyBytes before = g.Key();
  EXPECT_FALSE(g.Step('x'));
  EXPECT_FALSE(g.Step(']'));
  EXPECT_EQ(g.Key(), before);
  EXPECT_TRUE(g.Feed("3}"));
  EXPECT_TRUE(g.complete());
}

TEST(JsonGrammar, NestingLimit) {
  std::string s = "{";
  for (int d = 2; d < JsonGrammar::kMaxDepth; ++d) s += "\"a\":{";
  s += "\"b\":[";
  JsonGrammar g;
  ASSERT_TRUE(g.Feed(s));
  EXPECT_EQ(g.depth(), JsonGrammar::kMaxDepth);
  EXPECT_FALSE(g.Step('['));  // one more level is refused
  EXPECT_FALSE(g.Step('{'));
  EXPECT_TRUE(g.Step('1'));  // scalars still fit
  ASSERT_TRUE(g.Step(']'));
  for (int d = 1; d < JsonGrammar::kMaxDepth; ++d) ASSERT_TRUE(g.Step('}')) << d;
  EXPECT_TRUE(g.complete());
  // Complete: nothing more is taken, not even whitespace (nlohmann would allow it; EOS ends).
  EXPECT_FALSE(g.Step(' '));
}

TEST(JsonGrammar, WhitespaceAndNumberBounds) {
  JsonGrammar g;
  ASSERT_TRUE(g.Feed(std::string(JsonGrammar::kMaxWhitespace, ' ')));
  EXPECT_FALSE(g.Step(' '));
  ASSERT_TRUE(g.Feed("{\"n\":"));
  ASSERT_TRUE(g.Feed(std::string(JsonGrammar::kMaxWhitespace, '\n')));  // the run starts over
  EXPECT_FALSE(g.Step('\t'));
  std::string digits = "-";
  digits.append(JsonGrammar::kMaxIntDigits, '9');
  ASSERT_TRUE(g.Feed(digits));
  EXPECT_FALSE(g.Step('9'));
  std::string exp = ".5e-";
  exp.append(JsonGrammar::kMaxExpDigits, '1');
  ASSERT_TRUE(g.Feed(exp));
  EXPECT_FALSE(g.Step('1'));
  ASSERT_TRUE(g.Feed(",\"m\":1.000000000000000000000000000001}"));  // fractions are unbounded
  EXPECT_TRUE(g.complete());
}

// Random values serialized by nlohmann (compact and indented, ASCII-escaped or raw UTF-8) are
// accepted and complete; random byte soups from JSON's alphabet are accepted-and-complete exactly
// when nlohmann parses them as an object.
TEST(JsonGrammar, AgreesWithNlohmannOnRandomTexts) {
  std::mt19937_64 rng(42);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const std::vector<std::string> strings = {
      "",          "x",       "\xc3\xa9t\xc3\xa9", "\xf0\x9f\x98\x80",
      "tab\there", "q\"uote", "back\\slash",       "\x01"};
  std::function<nlohmann::json(int)> value = [&](int depth) -> nlohmann::json {
    switch (depth > 4 ? pick(5) : pick(7)) {
      case 0:
        return nullptr;
      case 1:
        return pick(2) == 1;
      case 2:
        return static_cast<int64_t>(rng()) >> pick(63);
      case 3:
        return std::ldexp(static_cast<double>(static_cast<int64_t>(rng())), -pick(80));
      case 4:
        return strings[pick(static_cast<int>(strings.size()))];
      case 5: {
        nlohmann::json a = nlohmann::json::array();
        for (int i = pick(4); i > 0; --i) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        nlohmann::json o = nlohmann::json::object();
        for (int i = pick(4); i > 0; --i)
          o[strings[pick(static_cast<int>(strings.size()))]] = value(depth + 1);
        return o;
      }
    }
  };
  for (int trial = 0; trial < 500; ++trial) {
    nlohmann::json o = nlohmann::json::object();
    for (int i = pick(5); i > 0; --i) o[std::string(1, static_cast<char>('a' + i))] = value(1);
    for (const std::string& s : {o.dump(), o.dump(2), o.dump(-1, ' ', /*ensure_ascii=*/true)}) {
      JsonGrammar g;
      ASSERT_EQ(FirstRefused(s, &g), -1) << s;
      ASSERT_TRUE(g.complete()) << s;
    }
  }
  const std::string alphabet = "{}[]:,\"\\ 0123456789.-+eEtrufalsn\xc3\xa9";
  int parsed = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    std::string s = "{";
    for (int n = 1 + pick(12); n > 0; --n) s += alphabet[pick(static_cast<int>(alphabet.size()))];
    // The grammar ends at the closing brace (trailing whitespace is for EOS to take) and bounds
    // exponents; nlohmann takes both.
    std::string trimmed = s;
    while (!trimmed.empty() && trimmed.back() == ' ') trimmed.pop_back();
    JsonGrammar g;
    const bool grammar = FirstRefused(trimmed, &g) == -1 && g.complete();
    const bool nl = NlohmannObject(s);
    if (nl && !grammar && std::regex_search(s, std::regex("[eE][+-]?[0-9]{3}"))) continue;
    ASSERT_EQ(grammar, nl) << s;
    parsed += nl;
  }
  EXPECT_GT(parsed, 50);  // the soup does hit valid objects
}

}  // namespace
}  // namespace ds::sampling
