// API-key (bearer token) authentication of gRPC calls: `authorization: Bearer <token>` metadata
// checked against the tokens of a file, in time that does not depend on how much of a token
// matched. A missing, malformed or unknown token is UNAUTHENTICATED (the credentials are not
// valid; PERMISSION_DENIED would mean valid credentials without the right).
//
// Token file: one token per line, '#' comments and blank lines ignored; tokens are at least
// kMinTokenLength printable characters without spaces. The file must not be readable by others
// (mode 0600 or 0640, owner root or the service user): a world-readable key file is refused.
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/status.h"

namespace grpc {
class ServerContext;
class Status;
}  // namespace grpc

namespace ds::auth {

inline constexpr size_t kMinTokenLength = 16;

class TokenSet {
 public:
  TokenSet() = default;  // empty: open (every call passes); callers log that loudly
  static absl::StatusOr<TokenSet> FromFile(const std::string& path);
  static absl::StatusOr<TokenSet> FromTokens(std::vector<std::string> tokens);
  // No length / charset rules (tests and programmatic use; files always go through FromFile).
  static TokenSet FromTrustedTokens(std::vector<std::string> tokens);

  bool open() const { return tokens_.empty(); }
  size_t size() const { return tokens_.size(); }
  // Compares against every token, always all of them, in constant time per token.
  bool Matches(std::string_view token) const;

 private:
  std::vector<std::string> tokens_;
};

// Compares two strings in time that depends only on `expected`'s length (not on where they differ
// nor on `given`'s length).
bool ConstantTimeEquals(std::string_view given, std::string_view expected);

// OK or UNAUTHENTICATED for the values of the `authorization` metadata key of one call.
absl::Status CheckBearer(const TokenSet& tokens, std::span<const std::string_view> authorization);

// The same for a gRPC call: reads ctx's `authorization` metadata. Returns a grpc::Status so a
// handler can `if (auto s = auth::Check(*ctx, keys); !s.ok()) return s;` as its first line.
grpc::Status Check(const grpc::ServerContext& ctx, const TokenSet& tokens);

// The client side: the first token of a token file (same format and permission rules as
// TokenSet::FromFile), i.e. what a worker or gateway sends to a scheduler started with that file.
absl::StatusOr<std::string> ReadClientToken(const std::string& path);

}  // namespace ds::auth
