// How the f16 tensor-core matmul (tiled_f16.cu) cuts K over blocks: host-side planning only,
// a function of the launch's shape and the device, never of the column count (so a row's sums
// are the same bits at every column count). Internal to the kernel library. The planning itself
// is plain C++ (the *ForSlots functions, the device's slots passed in), so that CPU tests
// check its decisions for any card (tests/kernels/cpu/tiled_f16_split_test.cc).
#pragma once

#include <algorithm>
#include <cmath>

namespace ds::cuda {

// A launch whose grid would leave much of its last round idle (the 5120-row matrices: 40 row
// blocks; the 27B ffn pair: 272 blocks, a round and 8 blocks at 2 per SM) cuts K into up to
// kMaxSplit ranges (>= 2 units each); split x row blocks stays <= kSplitBlocks, which bounds the
// scratch of partial sums.
constexpr int kMaxSplit = 8;
constexpr int kSplitBlocks = 1024;
// The f16 kernel's K unit and most columns (kUnitElems, kTiledF16MaxCols; static_asserts in
// tiled_f16_split.cu), here so that this header needs no CUDA.
constexpr int kSplitUnitElems = 256;
constexpr int kSplitMaxCols = 64;

// Blocks the device runs at once (two per SM: every form needs <= 128 registers x 256 threads).
int TiledF16Slots();

// The K split of a launch of `rb` row blocks over K (units of 256): the split s that minimises
// (rounds of rb * s blocks) / s, the time of the launch in full-K block times, plus the partial
// sums' traffic, 2 x 4 bytes per output and split against ~0.82 bytes per weight, times
// `cost` (kSplitCost). The per-split scan of the 27B's launches on an H100
// (TiledF16Timing.DISABLED_SplitScan, docs/perf/h200.md) found 0.4 better than the 0.5 before
// for one shape: ssm_out / attn_output (40 row blocks x 24 units) at split 5, 9-10% faster per
// launch than 0.5's 4 at 16 / 32 / 64 columns (the pair's tail launch also goes 4 -> 5), every
// other 27B launch unchanged. The model, same H100 call, alternated: x16 1,165.6-1,166.5 ->
// 1,180.9-1,182.7 tok/s (+1.4%), x64 2,279.3-2,282.1 -> 2,264.5-2,273.2 (-0.4%), one stream
// unchanged (`bench --f16-split-cost 0.5|0.4`).
constexpr double kSplitCost = 0.4;
int TiledF16SplitFor(int rb, int K, double cost = kSplitCost);
inline int TiledF16SplitForSlots(int rb, int K, int slots, double cost = kSplitCost) {
  const int nu = K / kSplitUnitElems;
  const double per_split = cost * 8.0 * kSplitMaxCols / (0.82 * K);
  int best = 1;
  double best_t = std::ceil(static_cast<double>(rb) / slots);
  for (int s = 2; s <= std::min(kMaxSplit, nu / 2) && rb * s <= kSplitBlocks; ++s) {
    const double t = std::ceil(static_cast<double>(rb) * s / slots) / s + s * per_split;
    if (t < best_t - 1e-9) {
      best = s;
      best_t = t;
    }
  }
  return best;
}

// Where a launch of `rb` row blocks is whole rounds of the device's slots plus a last round at
// most a quarter full (the 27B's ffn pair: 272 row blocks for the 264 slots of an H100 / H200),
// its last `row_blocks` row blocks go into a second launch, launched early, and each launch
// takes TiledF16SplitFor's split for its own row blocks (the pair: 264 at 1, then 8 at `split`
// 4), instead of the one launch's split for all (3: 816 blocks, a fourth round nearly idle).
// row_blocks = 0: one launch.
struct TiledF16TailSplit {
  int row_blocks = 0;
  int split = 1;
};
TiledF16TailSplit TiledF16SplitTail(int rb, int K, double cost = kSplitCost);
// Only a launch of whole rounds of full-K blocks plus a last round at most a quarter full. On
// an H100 the 27B pair's 264 head row blocks took 57.6 us at split 1, then its 8 tail row
// blocks at split 4 launched early 66.0 us in all, against 73.2 for the one launch at split 3
// (16 columns; 116.5 against 124.1 at 64); with the head at the one launch's split 3, 79.4.
inline TiledF16TailSplit TiledF16SplitTailForSlots(int rb, int K, int slots,
                                                   double cost = kSplitCost) {
  const int tail = rb % slots;
  if (rb <= slots || tail == 0 || 4 * tail > slots) return {};
  return {tail, TiledF16SplitForSlots(tail, K, slots, cost)};
}

}  // namespace ds::cuda
