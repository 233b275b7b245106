#include "gateway/auth.h"

#include <cctype>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace ds::gw {
namespace {

// Compares without an early exit so the time does not reveal how much of a token matched.
bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::string_view Strip(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) !=
        std::tolower(static_cast<unsigned char>(prefix[i])))
      return false;
  return true;
}

}  // namespace

absl::StatusOr<KeySet> KeySet::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read key file ", path));
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(in, line)) {
    std::string_view t = Strip(line);
    if (t.empty() || t[0] == '#') continue;
    tokens.emplace_back(t);
  }
  if (tokens.empty())
    return absl::InvalidArgumentError(absl::StrCat("key file ", path, " holds no token"));
  return FromTokens(std::move(tokens));
}

KeySet KeySet::FromTokens(std::vector<std::string> tokens) {
  KeySet k;
  k.tokens_ = std::move(tokens);
  return k;
}

absl::Status KeySet::Check(const std::vector<std::string_view>& values) const {
  if (open()) return absl::OkStatus();
  if (values.empty())
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  for (std::string_view v : values) {
    if (!StartsWithNoCase(v, "bearer ")) continue;
    std::string_view token = Strip(v.substr(7));
    bool ok = false;
    for (const std::string& t : tokens_) ok |= ConstantTimeEqual(token, t);
    if (ok) return absl::OkStatus();
    return absl::PermissionDeniedError("unknown bearer token");
  }
  return absl::UnauthenticatedError("authorization metadata is not 'Bearer <token>'");
}

}  // namespace ds::gw
