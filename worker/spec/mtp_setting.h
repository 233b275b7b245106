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

// `auto`'s most drafts per sequence (DraftsForBatch at one or two sequences; its MtpSetting's
// `drafts`, the speculative room a worker reserves).
inline constexpr int kAutoMostDrafts = 4;

// Drafts per sequence for a batch of `batch` decoding sequences. A verify step of k drafts costs
// about k + 1 decode rows of compute; at one stream the card is bound by reading the weights, so
// drafts are nearly free, while a large batch is already compute-bound and drafts only add rows
// (peers report MTP losing throughput at high concurrency; on the H200 a verify of 16 x 4 tokens
// of the 27B cost 4.8x a decode step, docs/perf/h200.md). `auto`: 4 drafts up to 2 sequences, 2 up
// to 4, 1 up to 8, none beyond; DraftPolicy takes fewer per sequence where they are rejected.
// Four at one stream since 2026-12-07: on an H100 the demo model's `generate` ran 8,454-8,462 tok/s
// at `--mtp 4` against 7,863-7,966 with `auto` (3), and on the 27B at 75% acceptance k = 4 gives
// 251.6-252.2 tok/s against 241.8-242.2 at k = 3 (docs/perf/h200.md); 6 and 8 drafts were slower
// on the demo (7,695-7,898 / 6,456-6,485).
int DraftsForBatch(const MtpSetting& s, int batch);

}  // namespace ds::spec
