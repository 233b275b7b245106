// How the f16 tensor-core matmul (tiled_f16.cu) cuts K over blocks: host-side planning only,
// a function of the launch's shape and the device, never of the column count (so a row's sums
// are the same bits at every column count). Internal to the kernel library.
#pragma once

namespace ds::cuda {

// A launch whose grid would leave much of its last round idle (the 5120-row matrices: 40 row
// blocks; the 27B ffn pair: 272 blocks, a round and 8 blocks at 2 per SM) cuts K into up to
// kMaxSplit ranges (>= 2 units each); split x row blocks stays <= kSplitBlocks, which bounds the
// scratch of partial sums.
constexpr int kMaxSplit = 8;
constexpr int kSplitBlocks = 1024;

// Blocks the device runs at once (two per SM: every form needs <= 128 registers x 256 threads).
int TiledF16Slots();

// The K split of a launch of `rb` row blocks over K (units of 256): the split s that minimises
// (rounds of rb * s blocks) / s, the time of the launch in full-K block times, plus the partial
// sums' traffic, 2 x 4 bytes per output and split against ~0.82 bytes per weight (half of it:
// the partials mostly stay in L2).
int TiledF16SplitFor(int rb, int K);

// Where a launch of `rb` row blocks is whole rounds of the device's slots plus a last round at
// most a quarter full (the 27B's ffn pair: 272 row blocks for the 264 slots of an H100 / H200),
// its last `row_blocks` row blocks go into a second launch, launched early, and each launch
// takes TiledF16SplitFor's split for its own row blocks (the pair: 264 at 1, then 8 at `split`
// 4), instead of the one launch's split for all (3: 816 blocks, a fourth round nearly idle).
// row_blocks = 0: one launch. Computed once per shape, then cached.
struct TiledF16TailSplit {
  int row_blocks = 0;
  int split = 1;
};
TiledF16TailSplit TiledF16SplitTail(int rb, int K);

}  // namespace ds::cuda
