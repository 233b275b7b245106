#include "worker/spec/mtp_setting.h"

#include <charconv>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/sampling/sampling_params.h"

namespace ds::spec {

absl::StatusOr<MtpSetting> ParseMtpSetting(std::string_view text) {
  if (text == "off" || text == "0") return MtpSetting{};
  if (text == "auto") return MtpSetting{kAutoMostDrafts, true};
  int k = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), k);
  if (ec != std::errc() || end != text.data() + text.size() || k < 1 || k > sampling::kMaxMtpDrafts)
    return absl::InvalidArgumentError(absl::StrCat("--mtp takes off, auto or a draft count 1..",
                                                   sampling::kMaxMtpDrafts, ", not '",
                                                   std::string(text), "'"));
  return MtpSetting{k, false};
}

int DraftsForBatch(const MtpSetting& s, int batch) {
  if (!s.automatic) return s.drafts;
  if (batch <= 2) return kAutoMostDrafts;
  if (batch <= 4) return 2;
  if (batch <= 8) return 1;
  return 0;
}

}  // namespace ds::spec
