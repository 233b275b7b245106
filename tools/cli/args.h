// Minimal "--flag value" / "--switch" parser for the CLI subcommands. Unknown flags are errors so a
// typo never silently falls back to a default.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/util/status.h"

namespace ds::cli {

class Args {
 public:
  // `valued`: flags that take a value; `switches`: boolean flags.
  static absl::StatusOr<Args> Parse(int argc, char** argv, const std::set<std::string>& valued,
                                    const std::set<std::string>& switches);

  bool Has(const std::string& flag) const { return values_.count(flag) > 0; }
  std::string Str(const std::string& flag, const std::string& dflt = "") const;
  absl::StatusOr<std::string> Required(const std::string& flag) const;
  absl::StatusOr<int64_t> Int(const std::string& flag, int64_t dflt) const;
  absl::StatusOr<double> Float(const std::string& flag, double dflt) const;
  absl::StatusOr<uint64_t> UInt(const std::string& flag, uint64_t dflt) const;
  // An on|off switch with a value (config::OnOffFlag's wording for anything else).
  absl::StatusOr<bool> OnOff(const std::string& flag, bool dflt) const;

 private:
  std::map<std::string, std::string> values_;
};

// "1,2,3" -> {1,2,3}; errors name the bad element.
absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& s);

}  // namespace ds::cli
