// A byte-level pushdown automaton for one JSON text (RFC 8259) whose top-level value is an
// object: the grammar behind `response_format: {"type": "json_object"}` (json_constraint.h walks
// it over the vocabulary to mask tokens).
//
// Step(c) answers whether byte c may follow the bytes accepted so far, and takes it when it
// may. Every accepted prefix can still be completed to a valid text (the automaton is "live"):
// strings take only well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF)
// and no raw control bytes; \uXXXX escapes must pair surrogates (a high one must be followed by
// \u + a low one; a lone low one is refused at its second hex digit), so what it accepts parses
// with strict parsers (nlohmann-json, Python's json). After the top-level object closes the text
// is complete() and no byte is accepted (not even whitespace: generation should end there).
//
// Bounds that keep a generation finite and parseable everywhere (interoperability limits, not
// RFC syntax): nesting depth <= kMaxDepth, at most kMaxWhitespace consecutive whitespace bytes
// between tokens, integer parts of at most kMaxIntDigits digits and exponents of at most
// kMaxExpDigits digits (so a number never overflows a double).
//
// The state is a small trivially copyable value (the container stack is a bit per level), so a
// trie walk can copy it per node; Key() is the state as bytes for caching masks by state.
#pragma once
#include <cstdint>
#include <string_view>

namespace ds::sampling {

class JsonGrammar {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxWhitespace = 32;
  static constexpr int kMaxIntDigits = 100;
  static constexpr int kMaxExpDigits = 2;

  // Takes byte c when it may follow; returns false (state unchanged) when it may not.
  bool Step(uint8_t c);
  // Steps every byte of s; false at the first refused one (the state then holds the prefix
  // before it).
  bool Feed(std::string_view s);

  bool complete() const { return lex_ == Lex::kDone; }
  // Inside a string with no escape or UTF-8 sequence pending: any complete UTF-8 text without
  // '"', '\\' or control bytes is taken and leaves the state as it was.
  bool in_plain_string() const { return lex_ == Lex::kString && utf8_left_ == 0; }
  int depth() const { return depth_; }

  // The whole state (trivially copyable, no padding left uninitialized): equal keys = equal
  // futures.
  struct KeyBytes {
    uint64_t stack;
    uint64_t rest;
    bool operator==(const KeyBytes&) const = default;
  };
  KeyBytes Key() const;

 private:
  enum class Lex : uint8_t {
    kStart,       // before the top-level object (whitespace, '{')
    kObjFirst,    // after '{': whitespace, '"' or '}'
    kObjKey,      // after ',' in an object: whitespace, '"'
    kColon,       // after a key: whitespace, ':'
    kValue,       // after ':' or ',' in an array: whitespace, a value
    kArrFirst,    // after '[': whitespace, a value or ']'
    kAfterValue,  // after a value inside a container: whitespace, ',' or the closing bracket
    kString,      // inside a string (key_ says which kind)
    kEscape,      // after '\'
    kHex,         // inside \uXXXX (hex_left digits to go)
    kLowSlash,    // after a high surrogate escape: must see '\'
    kLowU,        // ... then 'u'
    kNumMinus,    // after '-'
    kNumZero,     // a leading 0
    kNumInt,      // integer digits
    kNumDot,      // after '.'
    kNumFrac,     // fraction digits
    kNumE,        // after 'e' / 'E'
    kNumESign,    // after the exponent's sign
    kNumExp,      // exponent digits
    kLiteral,     // inside true / false / null
    kDone,        // the top-level object closed
  };

  bool StartValue(uint8_t c);
  bool Push(bool object);
  // Ends a value (string, number, literal, container): the parent decides what comes next.
  void EndValue();
  bool StringByte(uint8_t c);
  bool NumberEnd(uint8_t c);  // a byte that ends a number: the value ends, c is stepped after
  bool IsObjectTop() const { return (stack_ >> (depth_ - 1)) & 1u; }

  uint64_t stack_ = 0;  // bit d = the container at depth d + 1 is an object (1) or array (0)
  Lex lex_ = Lex::kStart;
  uint8_t depth_ = 0;
  bool key_ = false;        // the string being read is an object key
  uint8_t ws_ = 0;          // consecutive whitespace bytes
  uint8_t utf8_left_ = 0;   // continuation bytes still due in a string
  uint8_t utf8_lo_ = 0x80;  // range of the next continuation byte
  uint8_t utf8_hi_ = 0xBF;
  uint8_t hex_left_ = 0;   // \uXXXX digits to go
  uint8_t hex_kind_ = 0;   // 0: any escape, 1: must be a low surrogate
  uint8_t hex_first_ = 0;  // value of the escape's first hex digit
  uint8_t digits_ = 0;     // digits of the current integer part / exponent
  uint8_t lit_ = 0;        // literal: 0 true, 1 false, 2 null
  uint8_t lit_pos_ = 0;    // bytes of it already read
};

}  // namespace ds::sampling
