// "--flag value" / "--switch" parsing for deltactl; repeatable flags keep every value. Unknown
// flags are errors so a typo never falls back to a default.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/util/status.h"

namespace ds::ctl {

class Flags {
 public:
  static absl::StatusOr<Flags> Parse(int argc, char** argv, const std::set<std::string>& valued,
                                     const std::set<std::string>& switches);
  bool Has(const std::string& f) const { return values_.count(f) > 0; }
  std::string Str(const std::string& f, const std::string& dflt = "") const;
  std::vector<std::string> All(const std::string& f) const;
  // Strict: the whole value is a number within [lo, hi] (what the wire field holds), else an error
  // naming the flag and the range: "4294967297" is refused for a uint32 field, not wrapped to 1.
  absl::StatusOr<int64_t> Int(const std::string& f, int64_t dflt, int64_t lo, int64_t hi) const;
  absl::StatusOr<uint64_t> Uint(const std::string& f, uint64_t dflt) const;
  // Finite numbers only.
  absl::StatusOr<double> Float(const std::string& f, double dflt, double lo, double hi) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

// Strict integer parsing shared by the flags and positional arguments: `what` names the value.
absl::StatusOr<int64_t> ParseInt(const std::string& what, const std::string& s, int64_t lo,
                                 int64_t hi);

// "1,2,3" -> ids (errors name the bad element).
absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& s);

}  // namespace ds::ctl
