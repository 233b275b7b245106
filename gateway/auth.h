// Bearer-token authentication: the one check every public and admin handler runs first. Keys come
// from a file (one token per line, '#' comments); an empty key set means the listener is open.
// Handlers pass the call's `authorization` metadata values, so the check has no gRPC types and a
// later interceptor (or an HTTP front end) can call the same function.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "common/util/status.h"

namespace ds::gw {

class KeySet {
 public:
  KeySet() = default;  // open: every call passes
  static absl::StatusOr<KeySet> FromFile(const std::string& path);
  static KeySet FromTokens(std::vector<std::string> tokens);

  bool open() const { return tokens_.empty(); }
  // OK, UNAUTHENTICATED (no / malformed credentials) or PERMISSION_DENIED (unknown token).
  absl::Status Check(const std::vector<std::string_view>& authorization_values) const;

 private:
  std::vector<std::string> tokens_;
};

}  // namespace ds::gw
