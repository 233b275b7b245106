#include "tools/deltactl/flags.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ds::ctl {

absl::StatusOr<Flags> Flags::Parse(int argc, char** argv, const std::set<std::string>& valued,
                                   const std::set<std::string>& switches) {
  Flags fl;
  for (int i = 0; i < argc; ++i) {
    const std::string f = argv[i];
    if (switches.count(f)) {
      fl.values_[f].push_back("1");
    } else if (valued.count(f)) {
      if (i + 1 >= argc) return absl::InvalidArgumentError("flag " + f + " needs a value");
      fl.values_[f].push_back(argv[++i]);
    } else {
      return absl::InvalidArgumentError("unknown flag '" + f + "'");
    }
  }
  return fl;
}

std::string Flags::Str(const std::string& f, const std::string& dflt) const {
  auto it = values_.find(f);
  return it == values_.end() ? dflt : it->second.back();
}

std::vector<std::string> Flags::All(const std::string& f) const {
  auto it = values_.find(f);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<int64_t> ParseInt(const std::string& what, const std::string& s, int64_t lo,
                                 int64_t hi) {
  int64_t v = 0;
  // SimpleAtoi refuses overflow of int64 and trailing junk; the range check catches the rest.
  if (!absl::SimpleAtoi(s, &v) || v < lo || v > hi)
    return absl::InvalidArgumentError(
        absl::StrCat(what, " expects an integer in [", lo, ", ", hi, "], got '", s, "'"));
  return v;
}

absl::StatusOr<int64_t> Flags::Int(const std::string& f, int64_t dflt, int64_t lo,
                                   int64_t hi) const {
  if (!Has(f)) return dflt;
  return ParseInt(f, Str(f), lo, hi);
}

absl::StatusOr<uint64_t> Flags::Uint(const std::string& f, uint64_t dflt) const {
  if (!Has(f)) return dflt;
  uint64_t v = 0;
  if (!absl::SimpleAtoi(Str(f), &v))
    return absl::InvalidArgumentError(absl::StrCat(f, " expects an integer in [0, ", UINT64_MAX,
                                                   "], got '", Str(f), "'"));
  return v;
}

absl::StatusOr<double> Flags::Float(const std::string& f, double dflt, double lo,
                                    double hi) const {
  if (!Has(f)) return dflt;
  double v = 0;
  if (!absl::SimpleAtod(Str(f), &v) || !std::isfinite(v) || v < lo || v > hi)
    return absl::InvalidArgumentError(
        absl::StrCat(f, " expects a number in [", lo, ", ", hi, "], got '", Str(f), "'"));
  return v;
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& s) {
  std::vector<int32_t> ids;
  int i = 0;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v))
      return absl::InvalidArgumentError(
          absl::StrCat("id list element ", i, " ('", part, "') is not an integer"));
    ids.push_back(v);
    ++i;
  }
  return ids;
}

}  // namespace ds::ctl
