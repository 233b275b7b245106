// Helpers shared by the libFuzzer targets: an invariant check that aborts (libFuzzer keeps the
// input as a crash reproducer) and a UTF-8 validator written independently of
// common/tokenizer/byte_level.cc, so the targets do not check that code against itself.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace ds::fuzz {

inline void Check(bool cond, const char* target, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "%s invariant failed: %s\n", target, what);
    std::abort();
  }
}

// Well-formed UTF-8 (Unicode §3.9, table 3-7).
inline bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int n;  // continuation bytes
    unsigned char lo = 0x80, hi = 0xBF;  // range of the first continuation byte
    if (c >= 0xC2 && c <= 0xDF) n = 1;
    else if (c == 0xE0) n = 2, lo = 0xA0;
    else if (c == 0xED) n = 2, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) n = 2;
    else if (c == 0xF0) n = 3, lo = 0x90;
    else if (c == 0xF4) n = 3, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) n = 3;
    else return false;
    for (int k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const unsigned char b = s[i + k];
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return false;
    }
    i += n + 1;
  }
  return true;
}

}  // namespace ds::fuzz
