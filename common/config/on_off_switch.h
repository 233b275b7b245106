// A table row for an on|off command-line switch: the flag and the bool member of an options
// struct it sets. One table per options struct (DeviceTuning, the bench's BenchOptions) lets
// the parser, the flag list and the writer all read the same rows.
#pragma once
#include <cstddef>
#include <string_view>

namespace ds {

template <typename Options>
struct OnOffSwitch {
  const char* flag;
  bool Options::*field;
};

// The member `flag` sets in `table`, or nullptr when the table has no such flag.
template <typename Options, size_t N>
bool Options::*OnOffFieldOf(const OnOffSwitch<Options> (&table)[N], std::string_view flag) {
  for (const OnOffSwitch<Options>& s : table)
    if (flag == s.flag) return s.field;
  return nullptr;
}

}  // namespace ds
