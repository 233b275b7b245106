#include "gateway/auth.h"

namespace ds::gw {

absl::StatusOr<KeySet> KeySet::FromFile(const std::string& path) {
  KeySet k;
  DS_ASSIGN_OR_RETURN(k.tokens_, auth::TokenSet::FromFile(path));
  return k;
}

KeySet KeySet::FromTokens(std::vector<std::string> tokens) {
  KeySet k;
  k.tokens_ = auth::TokenSet::FromTrustedTokens(std::move(tokens));
  return k;
}

absl::Status KeySet::Check(const std::vector<std::string_view>& values) const {
  return auth::CheckBearer(tokens_, values);
}

}  // namespace ds::gw
