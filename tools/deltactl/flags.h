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
  absl::StatusOr<int64_t> Int(const std::string& f, int64_t dflt) const;
  absl::StatusOr<double> Float(const std::string& f, double dflt) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

// "1,2,3" -> ids (errors name the bad element).
absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& s);

}  // namespace ds::ctl
