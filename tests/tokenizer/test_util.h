// Helpers shared by the tokenizer tests.
#pragma once
#include <random>
#include <string>

#include "common/tokenizer/byte_level.h"

namespace ds::testing_util {

// Random well-formed UTF-8 mixing ASCII, whitespace, Latin-1, combining marks, CJK and astral
// (emoji) code points.
inline std::string RandomUtf8(std::mt19937& rng, int n_cps) {
  std::string s;
  std::uniform_int_distribution<int> cls(0, 9);
  for (int i = 0; i < n_cps; ++i) {
    uint32_t cp = 0;
    switch (cls(rng)) {
      case 0: case 1: case 2: cp = std::uniform_int_distribution<uint32_t>('a', 'z')(rng); break;
      case 3: cp = " \n\t\r'0123456789.,!?"[std::uniform_int_distribution<int>(0, 19)(rng)]; break;
      case 4: cp = std::uniform_int_distribution<uint32_t>(0xA0, 0x24F)(rng); break;
      case 5: cp = std::uniform_int_distribution<uint32_t>(0x300, 0x36F)(rng); break;
      case 6: cp = std::uniform_int_distribution<uint32_t>(0x4E00, 0x9FFF)(rng); break;
      case 7: cp = std::uniform_int_distribution<uint32_t>(0x1F300, 0x1FAFF)(rng); break;
      case 8: cp = std::uniform_int_distribution<uint32_t>(0x3040, 0x30FF)(rng); break;
      default: cp = std::uniform_int_distribution<uint32_t>(0x20, 0x7E)(rng); break;
    }
    tok::AppendUtf8(cp, &s);
  }
  return s;
}

inline std::string RandomBytes(std::mt19937& rng, int n) {
  std::string s;
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(byte(rng)));
  return s;
}

}  // namespace ds::testing_util
