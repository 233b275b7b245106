// Greedy token selection with each row split over many blocks: the CPU sampler's greedy choice
// (common/sampling/sampler.h: NaN as -inf, +inf as FLT_MAX, the lowest id among the largest; 0
// when every logit is -inf or NaN) for a few rows of a large vocabulary.
//
// Why: SampleRows (and ArgmaxRows before it) give a row one block of 1024 threads, which walks
// 248,320 logits in ~40-61 us on one SM (README "Sampling v2": compute- and latency-bound there).
// A decode step picks one row, an MTP verify 4, each draft of the chain one: the 132 SMs sit
// idle meanwhile.
// Here each row is cut into `parts` slices, one block each (16-byte loads), every block leaves its
// (value, index) in a scratch slot, and the last block of the row to finish (a ticket counter,
// reset by that block so the launch replays in a graph) reduces the slices in slice order.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

// Slices per row: 4 rows fill about one wave of 132 SMs.
inline constexpr int kArgmaxParts = 32;

// Device scratch of ArgmaxSplitRows for up to max_rows rows: kArgmaxParts slots per row and one
// ticket per row. The owner zeroes the tickets once; every launch leaves them zero.
struct ArgmaxScratch {
  float* value = nullptr;       // [max_rows * kArgmaxParts]
  int32_t* index = nullptr;     // [max_rows * kArgmaxParts]
  uint32_t* tickets = nullptr;  // [max_rows], zero between launches
  int max_rows = 0;
};

// out[r] = the greedy token of logits[r * ld + j], j < n (see the top of the file), r < rows <=
// s.max_rows. Launches that share `s` must be ordered (one stream).
// `early`: launched early (common.cuh, LaunchMaybeEarly; the decode steps on sm_90+).
absl::Status ArgmaxSplitRows(const float* logits, int64_t ld, int rows, int n,
                             const ArgmaxScratch& s, int32_t* out, cudaStream_t stream,
                             bool early = false);

}  // namespace ds::cuda
