// SoloCollective (see collective.h).
#include "common/collective/collective.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ds {

absl::Status SoloCollective::AllGather(const float* in, size_t n, float* out) {
  if (n) std::memmove(out, in, n * sizeof(float));
  return absl::OkStatus();
}

absl::Status SoloCollective::AllGatherV(const float* in, std::span<const size_t> counts,
                                        float* out) {
  if (counts.size() != 1)
    return absl::InvalidArgumentError(
        absl::StrCat("AllGatherV: ", counts.size(), " counts for a world of 1"));
  if (counts[0]) std::memmove(out, in, counts[0] * sizeof(float));
  return absl::OkStatus();
}

absl::Status SoloCollective::Broadcast(void*, size_t, int root) {
  if (root != 0)
    return absl::InvalidArgumentError(absl::StrCat("Broadcast: root ", root, " in a world of 1"));
  return absl::OkStatus();
}

}  // namespace ds
