#include "tools/cli/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace ds::cli {

absl::StatusOr<Args> Args::Parse(int argc, char** argv, const std::set<std::string>& valued,
                                 const std::set<std::string>& switches) {
  Args a;
  for (int i = 0; i < argc; ++i) {
    std::string f = argv[i];
    if (f.rfind("--", 0) != 0) return absl::InvalidArgumentError("unexpected argument '" + f + "'");
    std::string value;
    const auto eq = f.find('=');
    if (eq != std::string::npos) {
      value = f.substr(eq + 1);
      f = f.substr(0, eq);
    }
    if (switches.count(f)) {
      a.values_[f] = "1";
    } else if (valued.count(f)) {
      if (eq == std::string::npos) {
        if (i + 1 >= argc) return absl::InvalidArgumentError("flag " + f + " needs a value");
        value = argv[++i];
      }
      a.values_[f] = value;
    } else {
      return absl::InvalidArgumentError("unknown flag '" + f + "'");
    }
  }
  return a;
}

std::string Args::Str(const std::string& flag, const std::string& dflt) const {
  auto it = values_.find(flag);
  return it == values_.end() ? dflt : it->second;
}

absl::StatusOr<std::string> Args::Required(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return absl::InvalidArgumentError("missing required flag " + flag);
  return it->second;
}

absl::StatusOr<int64_t> Args::Int(const std::string& flag, int64_t dflt) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return dflt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (errno || end == it->second.c_str() || *end)
    return absl::InvalidArgumentError(flag + ": not an integer: '" + it->second + "'");
  return static_cast<int64_t>(v);
}

absl::StatusOr<uint64_t> Args::UInt(const std::string& flag, uint64_t dflt) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return dflt;
  char* end = nullptr;
  errno = 0;
  if (!it->second.empty() && it->second[0] == '-')
    return absl::InvalidArgumentError(flag + ": must not be negative");
  const unsigned long long v = std::strtoull(it->second.c_str(), &end, 10);
  if (errno || end == it->second.c_str() || *end)
    return absl::InvalidArgumentError(flag + ": not an unsigned integer: '" + it->second + "'");
  return static_cast<uint64_t>(v);
}

absl::StatusOr<bool> Args::OnOff(const std::string& flag, bool dflt) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return dflt;
  if (it->second != "on" && it->second != "off")
    return absl::InvalidArgumentError(flag + " expects on or off, got '" + it->second + "'");
  return it->second == "on";
}

absl::StatusOr<double> Args::Float(const std::string& flag, double dflt) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return dflt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(it->second.c_str(), &end);
  if (errno || end == it->second.c_str() || *end || !std::isfinite(v))
    return absl::InvalidArgumentError(flag + ": not a number: '" + it->second + "'");
  return v;
}

absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& s) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  if (s.empty()) return absl::InvalidArgumentError("empty token id list");
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || errno || *end || v < 0 || v > INT32_MAX)
      return absl::InvalidArgumentError("bad token id '" + item + "' in id list");
    ids.push_back(static_cast<int32_t>(v));
    pos = comma + 1;
  }
  return ids;
}

}  // namespace ds::cli
