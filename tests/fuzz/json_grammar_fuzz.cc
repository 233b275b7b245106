// libFuzzer target for the JSON automaton behind `response_format: json_object`
// (common/sampling/json_grammar.h), held against nlohmann-json's strict parser:
//  - sound: a text the automaton takes whole and calls complete parses as one JSON object;
//  - complete: a text that parses as one JSON object, within the automaton's stated bounds
//    (nesting, whitespace runs, digit counts; no whitespace after the object), is taken whole;
//  - live: after any prefix it took (and before completion) some byte is still taken, so a
//    constrained generation never reaches a state where every token is masked.
// The bounds are checked conservatively over the raw bytes (a text that might exceed one is not
// held to completeness), so the test never asks more than the header promises.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/sampling/json_grammar.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using ds::sampling::JsonGrammar;

void Check(bool cond, const char* what) { ds::fuzz::Check(cond, "json_grammar_fuzz", what); }

bool IsWs(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }

// Whether the raw bytes surely stay within JsonGrammar's bounds (over-counting is fine) and are a
// fair question for nlohmann-json.
bool WithinBounds(std::string_view s) {
  int ws = 0, digits = 0, open = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    ws = IsWs(c) ? ws + 1 : 0;
    if (ws > JsonGrammar::kMaxWhitespace) return false;
    digits = IsDigit(c) ? digits + 1 : 0;
    if (digits > JsonGrammar::kMaxIntDigits) return false;
    if (c == '{' || c == '[') ++open;
    if ((c == 'e' || c == 'E')) {
      size_t j = i + 1;
      if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
      size_t n = 0;
      while (j + n < s.size() && IsDigit(s[j + n])) ++n;
      if (n > JsonGrammar::kMaxExpDigits) return false;
    }
  }
  // nlohmann-json's lexer ends its input at a NUL byte, so "{}\0..." parses there: such texts
  // say nothing about the automaton.
  return open <= JsonGrammar::kMaxDepth && !s.empty() && !IsWs(s.back()) &&
         s.find('\0') == std::string_view::npos;
}

bool SomeByteTaken(const JsonGrammar& g) {
  for (int c = 0; c < 256; ++c) {
    JsonGrammar copy = g;
    if (copy.Step(static_cast<uint8_t>(c))) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  JsonGrammar g;
  size_t taken = 0;
  while (taken < size && g.Step(data[taken])) {
    ++taken;
    // Liveness at a sample of the prefixes (every one would cost 256 steps per byte).
    if (taken % 13 == 0 && !g.complete()) Check(SomeByteTaken(g), "no dead end after a prefix");
  }
  if (!g.complete()) Check(SomeByteTaken(g), "no dead end where the input was refused");
  if (g.complete()) {
    Check(!SomeByteTaken(g), "nothing after the object");
  }

  const auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const bool object = !parsed.is_discarded() && parsed.is_object();
  if (taken == size && g.complete()) Check(object, "a complete text parses as a JSON object");
  if (object && WithinBounds(text)) {
    Check(taken == size, "a JSON object within the bounds is taken whole");
    Check(g.complete(), "a JSON object within the bounds completes");
  }
  return 0;
}
