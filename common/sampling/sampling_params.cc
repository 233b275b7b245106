#include "common/sampling/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ds::sampling {

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;  // continuation byte without a lead, 0xC0/0xC1 (overlong) or > 0xF4
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;  // overlong
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

absl::Status Validate(const SamplingParams& p, int n_vocab) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (n_vocab <= 0) return bad("n_vocab must be positive, got ", n_vocab);
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    return bad("temperature must be a finite number >= 0 (0 = greedy), got ", p.temperature);
  }
  if (p.top_k < 0) return bad("top_k must be >= 0 (0 = off), got ", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p must be in (0, 1], got ", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p must be in [0, 1], got ", p.min_p);
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.0f) {
    return bad("repetition_penalty must be a finite number > 0 (1 = off), got ",
               p.repetition_penalty);
  }
  if (!(std::fabs(p.presence_penalty) <= kMaxAbsPenalty)) {
    return bad("presence_penalty must be in [-2, 2], got ", p.presence_penalty);
  }
  if (!(std::fabs(p.frequency_penalty) <= kMaxAbsPenalty)) {
    return bad("frequency_penalty must be in [-2, 2], got ", p.frequency_penalty);
  }
  if (p.penalty_last_n < -1) {
    return bad("penalty_last_n must be >= -1 (-1 = whole history), got ", p.penalty_last_n);
  }
  if (p.mtp_drafts < -1 || p.mtp_drafts > kMaxMtpDrafts)
    return bad("mtp must be in [0, ", kMaxMtpDrafts, "] (0 = off), got ", p.mtp_drafts);
  if (p.n_logprobs < 0 || p.n_logprobs > kMaxLogprobs) {
    return bad("n_logprobs must be in [0, ", kMaxLogprobs, "], got ", p.n_logprobs);
  }
  for (size_t i = 0; i < p.stop_ids.size(); ++i) {
    if (p.stop_ids[i] < 0 || p.stop_ids[i] >= n_vocab) {
      return bad("stop_ids[", i, "] = ", p.stop_ids[i], " is outside the vocabulary [0, ", n_vocab,
                 ")");
    }
  }
  if (p.stop_strings.size() > kMaxStopStrings) {
    return bad("stop_strings has ", p.stop_strings.size(), " entries, at most ", kMaxStopStrings,
               " allowed");
  }
  for (size_t i = 0; i < p.stop_strings.size(); ++i) {
    const std::string& s = p.stop_strings[i];
    if (s.empty()) return bad("stop_strings[", i, "] is empty");
    if (s.size() > kMaxStopStringBytes) {
      return bad("stop_strings[", i, "] is ", s.size(), " bytes, at most ", kMaxStopStringBytes,
                 " allowed");
    }
    if (!IsValidUtf8(s)) return bad("stop_strings[", i, "] is not valid UTF-8");
  }
  return absl::OkStatus();
}

}  // namespace ds::sampling
