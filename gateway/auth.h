// Bearer-token authentication: the one check every public and admin handler runs first, a thin
// adapter over common/auth (token files with permission and length rules, constant-time compare).
// Handlers pass the call's `authorization` metadata values, so the check has no gRPC types and a
// later interceptor (or an HTTP front end) can call the same function.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "common/auth/bearer.h"
#include "common/util/status.h"

namespace ds::gw {

class KeySet {
 public:
  KeySet() = default;  // open: every call passes
  // One token per line, '#' comments; refused when world-readable or a token is shorter than
  // auth::kMinTokenLength.
  static absl::StatusOr<KeySet> FromFile(const std::string& path);
  static KeySet FromTokens(std::vector<std::string> tokens);

  bool open() const { return tokens_.open(); }
  // OK, or UNAUTHENTICATED for missing, malformed or unknown credentials.
  absl::Status Check(const std::vector<std::string_view>& authorization_values) const;

 private:
  auth::TokenSet tokens_;
};

}  // namespace ds::gw
