// The one MTP switch (`--mtp K|auto|off`) shared by generate, bench, serve and worker.
#pragma once
#include <string_view>

#include "common/util/status.h"

namespace ds::spec {

struct MtpSetting {
  int drafts = 0;          // K drafts per verify step; 0 = off
  bool automatic = false;  // `auto`: DraftsForBatch picks K from the batch
};

// "off" / "0", "1".."15", or "auto". InvalidArgument names the accepted forms.
absl::StatusOr<MtpSetting> ParseMtpSetting(std::string_view text);

// Drafts per sequence for a batch of `batch` decoding sequences. A verify step of k drafts costs
// about k + 1 decode rows of compute; at one stream the card is bound by reading the weights, so
// drafts are nearly free, while a large batch is already compute-bound and drafts only add rows
// (peers report MTP losing throughput at high concurrency). `auto`: 3 drafts up to 4 sequences,
// 2 up to 16, 1 up to 32, none beyond.
int DraftsForBatch(const MtpSetting& s, int batch);

}  // namespace ds::spec
