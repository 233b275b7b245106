// The f16 matmul's launch planning (kernels/cuda/tiled_f16_split.cuh): plain host code, checked
// here for the cards it was measured on and others. The decisions, not the timings: those are
// the GPU benchmarks' (tiled_f16_cuda_test, TiledF16Timing.*).
#include "kernels/cuda/tiled_f16_split.cuh"

#include <gtest/gtest.h>

namespace ds::cuda {
namespace {

// Row blocks of the 27B shapes: 64 row pairs for the gate+up pair, 128 rows otherwise.
constexpr int kPair27B = 17408 / 64, kDown27B = 5120 / 128, kQkv27B = 10240 / 128;

TEST(TiledF16Split, The27BPairOn132Sms) {
  const int slots = 2 * 132;  // H100 / H200
  EXPECT_EQ(3, TiledF16SplitForSlots(kPair27B, 5120, slots));  // the one launch: 816 blocks
  const TiledF16TailSplit t = TiledF16SplitTailForSlots(kPair27B, 5120, slots);
  EXPECT_EQ(8, t.row_blocks);
  EXPECT_EQ(5, t.split);  // 4 units per block
  EXPECT_EQ(4, TiledF16SplitTailForSlots(kPair27B, 5120, slots, 0.5).split);  // the charge before
  EXPECT_EQ(1, TiledF16SplitForSlots(kPair27B - t.row_blocks, 5120, slots));  // one whole round
}

// The per-split scan that set kSplitCost to 0.4 (H100, us at 16 / 32 / 64 columns): ssm_out's 40
// row blocks x 24 units at split 4 24.1 / 26.3 / 35.1, at 5 21.8 / 24.0 / 31.6; 0.4 takes 5
// there (0.5, the charge before, took 4) and leaves the other 27B launches as they were.
TEST(TiledF16Split, The27BLaunchesOn132Sms) {
  const int slots = 2 * 132;
  EXPECT_EQ(5, TiledF16SplitForSlots(5120 / 128, 6144, slots));       // ssm_out, attn_output
  EXPECT_EQ(4, TiledF16SplitForSlots(5120 / 128, 6144, slots, 0.5));  // the charge before
  for (const double cost : {kSplitCost, 0.5}) {
    EXPECT_EQ(6, TiledF16SplitForSlots(kDown27B, 17408, slots, cost));
    EXPECT_EQ(3, TiledF16SplitForSlots(kQkv27B, 5120, slots, cost));
    EXPECT_EQ(2, TiledF16SplitForSlots(16384 / 128, 5120, slots, cost));  // GDN qkv + z
    EXPECT_EQ(2, TiledF16SplitForSlots(14336 / 128, 5120, slots, cost));  // attention q+g, k, v
    EXPECT_EQ(1, TiledF16SplitForSlots(kPair27B - 8, 5120, slots, cost));  // the pair's head
  }
}

TEST(TiledF16Split, NoTailWithinOneRoundOrPastAQuarter) {
  for (const int sms : {108, 114, 132, 142}) {
    const int slots = 2 * sms;
    SCOPED_TRACE(::testing::Message() << sms << " SMs");
    // One round or less: nothing to move.
    EXPECT_EQ(0, TiledF16SplitTailForSlots(kDown27B, 17408, slots).row_blocks);
    EXPECT_EQ(0, TiledF16SplitTailForSlots(kQkv27B, 5120, slots).row_blocks);
    EXPECT_EQ(0, TiledF16SplitTailForSlots(slots, 5120, slots).row_blocks);
    EXPECT_EQ(0, TiledF16SplitTailForSlots(3 * slots, 5120, slots).row_blocks);
    // A last round more than a quarter full stays in the launch.
    EXPECT_EQ(0, TiledF16SplitTailForSlots(slots + slots / 4 + 1, 5120, slots).row_blocks);
    // At most a quarter: the tail is the last round's row blocks, at a split of its own.
    const TiledF16TailSplit t = TiledF16SplitTailForSlots(2 * slots + slots / 4, 5120, slots);
    EXPECT_EQ(slots / 4, t.row_blocks);
    EXPECT_GE(t.split, 1);
    EXPECT_LE(t.split, kMaxSplit);
  }
  // The 27B pair on a 108-SM card (216 slots): 56 row blocks past a round, more than a quarter.
  EXPECT_EQ(0, TiledF16SplitTailForSlots(kPair27B, 5120, 2 * 108).row_blocks);
}

TEST(TiledF16Split, SplitsStayInTheirBounds) {
  for (const int slots : {160, 216, 264, 284})
    for (int rb = 1; rb <= 600; rb += 7)
      for (const int K : {512, 1024, 5120, 6144, 17408}) {
        const int s = TiledF16SplitForSlots(rb, K, slots);
        ASSERT_GE(s, 1);
        if (s > 1) {
          EXPECT_LE(s, kMaxSplit);
          EXPECT_LE(2 * s, K / kSplitUnitElems) << "rb=" << rb << " K=" << K;
          EXPECT_LE(rb * s, kSplitBlocks) << "rb=" << rb << " K=" << K;
        }
      }
}

}  // namespace
}  // namespace ds::cuda
