#include "common/tokenizer/py_format.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>

namespace ds::py {
namespace {

// Decodes one UTF-8 code point at s[i]; returns its length (1 for an invalid byte, whose value is
// then not whitespace).
size_t CodePointAt(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) {
    *cp = 0xFFFFFFFF;
    return 1;
  }
  uint32_t v = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 2) {
      *cp = 0xFFFFFFFF;
      return 1;
    }
    v = (v << 6) | (c & 0x3F);
  }
  *cp = v;
  return n;
}

// Python's str.isspace(): the Unicode White_Space / bidi B, S, WS code points it accepts.
bool IsPySpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Length of the whitespace code point ending at s[end-1], 0 if none.
size_t SpaceEndingAt(std::string_view s, size_t end) {
  for (size_t n = 1; n <= 4 && n <= end; ++n) {
    const auto b = static_cast<unsigned char>(s[end - n]);
    if ((b >> 6) == 2) continue;  // continuation byte: look further back
    uint32_t cp;
    if (CodePointAt(s, end - n, &cp) != n) return 0;
    return IsPySpace(cp) ? n : 0;
  }
  return 0;
}

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

void Dump(const nlohmann::ordered_json& v, std::string* out) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::null:
      *out += "null";
      break;
    case T::boolean:
      *out += v.get<bool>() ? "true" : "false";
      break;
    case T::number_integer:
      *out += std::to_string(v.get<int64_t>());
      break;
    case T::number_unsigned:
      *out += std::to_string(v.get<uint64_t>());
      break;
    case T::number_float:
      *out += FloatRepr(v.get<double>());
      break;
    case T::string:
      AppendJsonString(v.get_ref<const std::string&>(), out);
      break;
    case T::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) *out += ", ";
        first = false;
        Dump(e, out);
      }
      out->push_back(']');
      break;
    }
    case T::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [k, e] : v.items()) {
        if (!first) *out += ", ";
        first = false;
        AppendJsonString(k, out);
        *out += ": ";
        Dump(e, out);
      }
      out->push_back('}');
      break;
    }
    default:
      *out += "null";
      break;  // binary / discarded never come from a parsed request
  }
}

}  // namespace

std::string_view LStrip(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp;
    const size_t n = CodePointAt(s, i, &cp);
    if (!IsPySpace(cp)) break;
    i += n;
  }
  return s.substr(i);
}

std::string_view RStrip(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    const size_t n = SpaceEndingAt(s, end);
    if (n == 0) break;
    end -= n;
  }
  return s.substr(0, end);
}

std::string_view Strip(std::string_view s) { return RStrip(LStrip(s)); }

std::string_view LStripChars(std::string_view s, std::string_view chars) {
  const size_t i = s.find_first_not_of(chars);
  return i == std::string_view::npos ? std::string_view() : s.substr(i);
}

std::string_view RStripChars(std::string_view s, std::string_view chars) {
  const size_t i = s.find_last_not_of(chars);
  return i == std::string_view::npos ? std::string_view() : s.substr(0, i + 1);
}

std::string FloatRepr(double v) {
  if (v != v) return "NaN";  // json.dumps spellings; a parsed JSON request never holds these
  if (v == 1.0 / 0.0) return "Infinity";
  if (v == -1.0 / 0.0) return "-Infinity";
  // Shortest round-trip digits in scientific form, then Python's layout rules.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  const int exp10 = std::atoi(sci.c_str() + e + 1);
  std::string mant = sci.substr(0, e);
  bool neg = false;
  if (!mant.empty() && mant[0] == '-') {
    neg = true;
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  std::string out = neg ? "-" : "";
  if (exp10 < -4 || exp10 >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    return out + eb;
  }
  if (exp10 < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exp10) + 1;
    if (digits.size() <= int_len) {
      out += digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return out;
}

std::string JsonDumps(const nlohmann::ordered_json& v) {
  std::string out;
  Dump(v, &out);
  return out;
}

std::string Str(const nlohmann::ordered_json& v) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::string:
      return v.get<std::string>();
    case T::boolean:
      return v.get<bool>() ? "True" : "False";
    case T::null:
      return "None";
    default:
      return JsonDumps(v);
  }
}

}  // namespace ds::py
