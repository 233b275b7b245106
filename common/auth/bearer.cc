#include "common/auth/bearer.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ds::auth {

bool ConstantTimeEquals(std::string_view given, std::string_view expected) {
  // The loop runs over `expected` only; bytes past the end of `given` compare against 0 and a
  // length difference is folded in without branching.
  volatile unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff = diff | static_cast<unsigned char>(g ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

absl::StatusOr<TokenSet> TokenSet::FromTokens(std::vector<std::string> tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError("no token given");
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (t.size() < kMinTokenLength)
      return absl::InvalidArgumentError(absl::StrCat("token ", i + 1, " is ", t.size(),
                                                     " characters; use at least ", kMinTokenLength,
                                                     " (e.g. openssl rand -hex 32)"));
    for (unsigned char c : t)
      if (c <= ' ' || c >= 0x7f)
        return absl::InvalidArgumentError(
            absl::StrCat("token ", i + 1, " has a space or non-printable character"));
  }
  TokenSet s;
  s.tokens_ = std::move(tokens);
  return s;
}

TokenSet TokenSet::FromTrustedTokens(std::vector<std::string> tokens) {
  TokenSet s;
  s.tokens_ = std::move(tokens);
  return s;
}

namespace {

// The checked, non-empty token list of a token file.
absl::StatusOr<std::vector<std::string>> ReadTokens(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0)
    return absl::NotFoundError(absl::StrCat("token file ", path, " does not exist"));
  if (!S_ISREG(st.st_mode))
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is not a regular file"));
  if (st.st_mode & S_IROTH)
    return absl::PermissionDeniedError(
        absl::StrCat("token file ", path,
                     " is readable by everyone; chmod 0640 (owner root, group deltaserve)"));
  std::ifstream in(path);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("cannot read token file ", path));
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view t = absl::StripAsciiWhitespace(line);
    if (t.empty() || t[0] == '#') continue;
    tokens.emplace_back(t.data(), t.size());
  }
  if (tokens.empty())
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " holds no token"));
  return tokens;
}

}  // namespace

absl::StatusOr<TokenSet> TokenSet::FromFile(const std::string& path) {
  DS_ASSIGN_OR_RETURN(std::vector<std::string> tokens, ReadTokens(path));
  absl::StatusOr<TokenSet> s = FromTokens(std::move(tokens));
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.status().message()));
  return s;
}

absl::StatusOr<std::string> ReadClientToken(const std::string& path) {
  // Through FromTokens: a client token obeys the same length / charset rules as the server's.
  DS_ASSIGN_OR_RETURN(std::vector<std::string> tokens, ReadTokens(path));
  std::string first = tokens.front();
  absl::StatusOr<TokenSet> s = TokenSet::FromTokens({first});
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.status().message()));
  return first;
}

bool TokenSet::Matches(std::string_view token) const {
  bool ok = false;
  for (const std::string& t : tokens_) ok |= ConstantTimeEquals(token, t);
  return ok;
}

absl::Status CheckBearer(const TokenSet& tokens, std::span<const std::string_view> values) {
  if (tokens.open()) return absl::OkStatus();
  if (values.empty())
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  if (values.size() > 1)
    return absl::UnauthenticatedError("more than one 'authorization' metadata value");
  const absl::string_view v(values[0].data(), values[0].size());
  if (!absl::StartsWithIgnoreCase(v, "bearer "))
    return absl::UnauthenticatedError("authorization metadata is not 'Bearer <token>'");
  const absl::string_view token = absl::StripAsciiWhitespace(v.substr(7));
  if (!tokens.Matches(std::string_view(token.data(), token.size())))
    return absl::UnauthenticatedError("invalid bearer token");
  return absl::OkStatus();
}

grpc::Status Check(const grpc::ServerContext& ctx, const TokenSet& tokens) {
  if (tokens.open()) return grpc::Status::OK;
  std::vector<std::string_view> values;
  const auto& md = ctx.client_metadata();
  for (auto [it, end] = md.equal_range("authorization"); it != end; ++it)
    values.emplace_back(it->second.data(), it->second.size());
  absl::Status s = CheckBearer(tokens, values);
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(s.message()));
}

}  // namespace ds::auth
