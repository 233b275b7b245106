#include "common/tokenizer/byte_level.h"

namespace ds::tok {
namespace {

bool IsPrintableGpt2(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<uint8_t, 256> canonical{};
  Tables() {
    int n = 0, k = 0;
    for (int b = 0; b < 256; ++b) {
      if (IsPrintableGpt2(b)) {
        byte_to_cp[b] = static_cast<uint32_t>(b);
        canonical[k++] = static_cast<uint8_t>(b);
      }
    }
    for (int b = 0; b < 256; ++b) {
      if (!IsPrintableGpt2(b)) {
        byte_to_cp[b] = 256u + static_cast<uint32_t>(n++);
        canonical[k++] = static_cast<uint8_t>(b);
      }
    }
  }
};

const Tables& T() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t ByteToCodepoint(uint8_t b) { return T().byte_to_cp[b]; }

std::optional<uint8_t> CodepointToByte(uint32_t cp) {
  if (cp < 256) {
    if (IsPrintableGpt2(static_cast<int>(cp))) return static_cast<uint8_t>(cp);
    return std::nullopt;
  }
  if (cp >= 256 + 68) return std::nullopt;
  // The n-th non-printable byte in increasing order maps to 256 + n.
  int n = static_cast<int>(cp - 256);
  for (int b = 0; b < 256; ++b) {
    if (!IsPrintableGpt2(b) && n-- == 0) return static_cast<uint8_t>(b);
  }
  return std::nullopt;
}

const std::array<uint8_t, 256>& BytesInCanonicalOrder() { return T().canonical; }

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string BytesToGpt2(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(c)), &out);
  return out;
}

int ValidUtf8SeqLen(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c0 = b(i);
  if (c0 < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3;
    if (c0 == 0xE0) lo = 0xA0;  // overlong
    if (c0 == 0xED) hi = 0x9F;  // surrogates
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4;
    if (c0 == 0xF0) lo = 0x90;  // overlong
    if (c0 == 0xF4) hi = 0x8F;  // > U+10FFFF
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (int k = 2; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  }
  return len;
}

uint32_t DecodeUtf8(std::string_view s, size_t i, int len) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[k])); };
  switch (len) {
    case 1: return b(i);
    case 2: return ((b(i) & 0x1F) << 6) | (b(i + 1) & 0x3F);
    case 3: return ((b(i) & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    default:
      return ((b(i) & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) |
             (b(i + 3) & 0x3F);
  }
}

std::optional<std::string> Gpt2ToBytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    int len = ValidUtf8SeqLen(text, i);
    if (len == 0) return std::nullopt;
    auto byte = CodepointToByte(DecodeUtf8(text, i, len));
    if (!byte) return std::nullopt;
    out.push_back(static_cast<char>(*byte));
    i += static_cast<size_t>(len);
  }
  return out;
}

}  // namespace ds::tok

namespace ds::tok {

size_t AppendSanitizedUtf8(std::string_view in, bool final, std::string* out) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  size_t i = 0;
  while (i < in.size()) {
    const int len = ValidUtf8SeqLen(in, i);
    if (len > 0) {
      out->append(in.substr(i, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
      continue;
    }
    // Length of the maximal subpart: how many bytes form a valid prefix of some sequence.
    const uint8_t c0 = static_cast<uint8_t>(in[i]);
    int need = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c0 >= 0xC2 && c0 <= 0xDF) {
      need = 2;
    } else if (c0 >= 0xE0 && c0 <= 0xEF) {
      need = 3;
      if (c0 == 0xE0) lo = 0xA0;
      if (c0 == 0xED) hi = 0x9F;
    } else if (c0 >= 0xF0 && c0 <= 0xF4) {
      need = 4;
      if (c0 == 0xF0) lo = 0x90;
      if (c0 == 0xF4) hi = 0x8F;
    }
    size_t k = 1;
    if (need > 0) {
      while (k < static_cast<size_t>(need) && i + k < in.size()) {
        const uint8_t c = static_cast<uint8_t>(in[i + k]);
        const bool ok = (k == 1) ? (c >= lo && c <= hi) : ((c & 0xC0) == 0x80);
        if (!ok) break;
        ++k;
      }
      if (i + k == in.size() && k < static_cast<size_t>(need) && !final) {
        return i;  // incomplete but still valid: wait for more bytes
      }
    }
    out->append(kReplacement);
    i += k;
  }
  return i;
}

}  // namespace ds::tok
