#include "common/sampling/json_grammar.h"

#include <cstring>

namespace ds::sampling {
namespace {

bool IsWs(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
int HexValue(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

constexpr std::string_view kLiterals[3] = {"true", "false", "null"};

}  // namespace

JsonGrammar::KeyBytes JsonGrammar::Key() const {
  // Fields packed by hand: the struct's own bytes would include padding.
  uint64_t r = static_cast<uint64_t>(lex_);
  r |= uint64_t{depth_} << 8;
  r |= uint64_t{key_} << 16;
  r |= uint64_t{ws_} << 17;
  r |= uint64_t{utf8_left_} << 25;
  r |= uint64_t{hex_left_} << 28;
  r |= uint64_t{hex_kind_} << 31;
  r |= uint64_t{hex_first_} << 32;
  r |= uint64_t{digits_} << 33;
  r |= uint64_t{lit_} << 41;
  r |= uint64_t{lit_pos_} << 43;
  r |= uint64_t{utf8_lo_} << 46;
  r |= uint64_t{utf8_hi_} << 54;  // bits 0..61 used: every field fits its width
  return KeyBytes{depth_ == 0 ? 0 : stack_ & (depth_ >= 64 ? ~0ull : ((1ull << depth_) - 1)), r};
}

bool JsonGrammar::Feed(std::string_view s) {
  for (char c : s)
    if (!Step(static_cast<uint8_t>(c))) return false;
  return true;
}

bool JsonGrammar::Push(bool object) {
  if (depth_ >= kMaxDepth) return false;
  if (object)
    stack_ |= 1ull << depth_;
  else
    stack_ &= ~(1ull << depth_);
  ++depth_;
  lex_ = object ? Lex::kObjFirst : Lex::kArrFirst;
  return true;
}

void JsonGrammar::EndValue() {
  lex_ = depth_ == 0 ? Lex::kDone : Lex::kAfterValue;
  digits_ = 0;  // leftovers of the value would make equal states look different to Key()
  lit_ = 0;
}

bool JsonGrammar::StartValue(uint8_t c) {
  switch (c) {
    case '{':
      return Push(true);
    case '[':
      return Push(false);
    case '"':
      lex_ = Lex::kString;
      key_ = false;
      return true;
    case '-':
      lex_ = Lex::kNumMinus;
      digits_ = 0;
      return true;
    case 't':
    case 'f':
    case 'n':
      lex_ = Lex::kLiteral;
      lit_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      lit_pos_ = 1;
      return true;
    default:
      if (!IsDigit(c)) return false;
      lex_ = c == '0' ? Lex::kNumZero : Lex::kNumInt;
      digits_ = 1;
      return true;
  }
}

bool JsonGrammar::StringByte(uint8_t c) {
  if (utf8_left_ > 0) {
    if (c < utf8_lo_ || c > utf8_hi_) return false;
    --utf8_left_;
    utf8_lo_ = 0x80;
    utf8_hi_ = 0xBF;
    return true;
  }
  if (c == '"') {
    if (key_) {
      key_ = false;
      lex_ = Lex::kColon;
    } else {
      EndValue();
    }
    return true;
  }
  if (c == '\\') {
    lex_ = Lex::kEscape;
    return true;
  }
  if (c < 0x20) return false;  // control characters must be escaped
  if (c < 0x80) return true;
  // UTF-8 lead bytes (RFC 3629 table): the first continuation byte's range excludes overlongs,
  // surrogates (ED A0..BF) and code points above U+10FFFF.
  if (c >= 0xC2 && c <= 0xDF) {
    utf8_left_ = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    utf8_left_ = 2;
    if (c == 0xE0) utf8_lo_ = 0xA0;
    if (c == 0xED) utf8_hi_ = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    utf8_left_ = 3;
    if (c == 0xF0) utf8_lo_ = 0x90;
    if (c == 0xF4) utf8_hi_ = 0x8F;
  } else {
    return false;  // continuation byte without a lead, C0, C1, F5..FF
  }
  return true;
}

bool JsonGrammar::NumberEnd(uint8_t c) {
  // A number is always inside a container here (the top level is an object), so what ends it is
  // whitespace, ',' or the closing bracket: the state after the value decides.
  const JsonGrammar saved = *this;
  EndValue();
  if (Step(c)) return true;
  *this = saved;
  return false;
}

bool JsonGrammar::Step(uint8_t c) {
  if (IsWs(c)) {
    switch (lex_) {
      case Lex::kStart:
      case Lex::kObjFirst:
      case Lex::kObjKey:
      case Lex::kColon:
      case Lex::kValue:
      case Lex::kArrFirst:
      case Lex::kAfterValue:
        if (ws_ >= kMaxWhitespace) return false;
        ++ws_;
        return true;
      default:
        break;
    }
  }
  const uint8_t ws_before = ws_;
  ws_ = 0;
  bool ok = false;
  switch (lex_) {
    case Lex::kStart:
      ok = c == '{' && Push(true);
      break;
    case Lex::kObjFirst:
      if (c == '}') {
        --depth_;
        EndValue();
        ok = true;
      } else if (c == '"') {
        lex_ = Lex::kString;
        key_ = true;
        ok = true;
      }
      break;
    case Lex::kObjKey:
      if (c == '"') {
        lex_ = Lex::kString;
        key_ = true;
        ok = true;
      }
      break;
    case Lex::kColon:
      if (c == ':') {
        lex_ = Lex::kValue;
        ok = true;
      }
      break;
    case Lex::kValue:
      ok = StartValue(c);
      break;
    case Lex::kArrFirst:
      if (c == ']') {
        --depth_;
        EndValue();
        ok = true;
      } else {
        ok = StartValue(c);
      }
      break;
    case Lex::kAfterValue:
      if (c == ',') {
        lex_ = IsObjectTop() ? Lex::kObjKey : Lex::kValue;
        ok = true;
      } else if (c == (IsObjectTop() ? '}' : ']')) {
        --depth_;
        EndValue();
        ok = true;
      }
      break;
    case Lex::kString:
      ok = StringByte(c);
      break;
    case Lex::kEscape:
      if (c == 'u') {
        lex_ = Lex::kHex;
        hex_left_ = 4;
        hex_kind_ = 0;
        hex_first_ = 0;
        ok = true;
      } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                 c == 'r' || c == 't') {
        lex_ = Lex::kString;
        ok = true;
      }
      break;
    case Lex::kHex: {
      const int v = HexValue(c);
      if (v < 0) break;
      // Surrogates are decided by the first two digits: D8..DB high, DC..DF low.
      if (hex_left_ == 4) {
        if (hex_kind_ == 1 && v != 0xD) break;
        hex_first_ = v == 0xD;  // might be a surrogate
      } else if (hex_left_ == 3) {
        const bool surrogate = hex_first_ && v >= 8;
        const bool low = surrogate && v >= 0xC;
        if (hex_kind_ == 1 && !low) break;         // the pair's second half must be low
        if (hex_kind_ == 0 && low) break;          // a lone low surrogate
        hex_first_ = hex_kind_ == 0 && surrogate;  // now: a high surrogate needs its pair
      }
      ok = true;
      if (--hex_left_ == 0) {
        lex_ = hex_first_ ? Lex::kLowSlash : Lex::kString;
        hex_first_ = 0;
        hex_kind_ = 0;
      }
      break;
    }
    case Lex::kLowSlash:
      if (c == '\\') {
        lex_ = Lex::kLowU;
        ok = true;
      }
      break;
    case Lex::kLowU:
      if (c == 'u') {
        lex_ = Lex::kHex;
        hex_left_ = 4;
        hex_kind_ = 1;
        hex_first_ = 0;
        ok = true;
      }
      break;
    case Lex::kNumMinus:
      if (IsDigit(c)) {
        lex_ = c == '0' ? Lex::kNumZero : Lex::kNumInt;
        digits_ = 1;
        ok = true;
      }
      break;
    case Lex::kNumZero:
    case Lex::kNumInt:
      if (IsDigit(c) && lex_ == Lex::kNumInt) {
        ok = digits_ < kMaxIntDigits;
        if (ok) ++digits_;
      } else if (c == '.') {
        lex_ = Lex::kNumDot;
        digits_ = 0;
        ok = true;
      } else if (c == 'e' || c == 'E') {
        lex_ = Lex::kNumE;
        digits_ = 0;
        ok = true;
      } else if (!IsDigit(c)) {
        ok = NumberEnd(c);
        return ok ? true : (ws_ = ws_before, false);
      }
      break;
    case Lex::kNumDot:
      if (IsDigit(c)) {
        lex_ = Lex::kNumFrac;
        ok = true;
      }
      break;
    case Lex::kNumFrac:
      if (IsDigit(c)) {
        ok = true;
      } else if (c == 'e' || c == 'E') {
        lex_ = Lex::kNumE;
        ok = true;
      } else {
        ok = NumberEnd(c);
        return ok ? true : (ws_ = ws_before, false);
      }
      break;
    case Lex::kNumE:
      if (c == '+' || c == '-') {
        lex_ = Lex::kNumESign;
        ok = true;
        break;
      }
      [[fallthrough]];
    case Lex::kNumESign:
      if (IsDigit(c)) {
        lex_ = Lex::kNumExp;
        digits_ = 1;
        ok = true;
      }
      break;
    case Lex::kNumExp:
      if (IsDigit(c)) {
        ok = digits_ < kMaxExpDigits;
        if (ok) ++digits_;
      } else {
        ok = NumberEnd(c);
        return ok ? true : (ws_ = ws_before, false);
      }
      break;
    case Lex::kLiteral: {
      const std::string_view lit = kLiterals[lit_];
      if (c == static_cast<uint8_t>(lit[lit_pos_])) {
        ok = true;
        if (++lit_pos_ == lit.size()) {
          lit_pos_ = 0;
          EndValue();
        }
      }
      break;
    }
    case Lex::kDone:
      break;
  }
  if (!ok) ws_ = ws_before;
  return ok;
}

}  // namespace ds::sampling
