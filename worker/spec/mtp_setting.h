// The one MTP switch (`--mtp K|auto|off`) shared by generate, bench, serve and worker.
#pragma once
#include <string_view>

#include "common/util/status.h"

namespace ds::spec {

struct MtpSetting {
  int drafts = 0;          // K drafts per verify step; 0 = off
  bool automatic = false;  // `auto`: DraftsForBatch caps K by the batch, DraftPolicy per sequence
};

// "off" / "0", "1".."15", or "auto". InvalidArgument names the accepted forms.
absl::StatusOr<MtpSetting> ParseMtpSetting(std::string_view text);

// Drafts per sequence for a batch of `batch` decoding sequences. A verify step of k drafts costs
// about k + 1 decode rows of compute; at one stream the card is bound by reading the weights, so
// drafts are nearly free, while a large batch is already compute-bound and drafts only add rows
// (peers report MTP losing throughput at high concurrency; on the H200 a verify of 16 x 4 tokens
// of the 27B cost 4.8x a decode step, docs/perf/h200.md). `auto`: 3 drafts up to 2 sequences, 2 up
// to 4, 1 up to 8, none beyond.
int DraftsForBatch(const MtpSetting& s, int batch);

}  // namespace ds::spec
