// The fused MTP draft chain's resident plan (kernels/cuda/mtp_chain_plan.h): which weight rows
// each block of the cluster keeps in shared memory. Plain host code; the kernel that follows the
// plan is checked on a GPU (mtp_gpu_test, FusedDraftChain.SameDraftsAsThePerKernelChain).
#include "kernels/cuda/mtp_chain_plan.h"

#include <gtest/gtest.h>

namespace ds::cuda {
namespace {

// The trained demo model's MTP block (models/demo/README.md): hidden 256, FFN 512, 4 query heads
// and 2 KV heads of 64 (q with its gate: 512 rows), vocabulary 4096 (the tied head).
std::array<MtpChainMatShape, kMtpChainResidentMats> DemoMats() {
  return {{{256, 512},
           {512, 256},
           {128, 256},
           {128, 256},
           {256, 256},
           {512, 256},
           {512, 256},
           {256, 512},
           {4096, 256}}};
}

// What a block of the demo's resident form has for weights on an H100 / H200: 227 KiB of opt-in
// shared memory less the kernel's vectors (45,328 bytes at these widths).
constexpr size_t kDemoBudget = 232448 - 45328;

TEST(MtpChainPlan, DemoOnSixteenBlocksKeepsAllButPartOfTheHead) {
  const MtpChainResidentPlan p = PlanMtpChainResident(DemoMats(), 2, 16, kDemoBudget);
  // Every block's share of eh, q, k, v, o, gate, up and down: ceil(rows / 16) rows each.
  const int whole[] = {16, 32, 8, 8, 16, 32, 32, 16};
  for (int m = 0; m < 8; ++m) EXPECT_EQ(p.rows[m], whole[m]) << m;
  // 98,304 bytes for those; the rest of the budget takes 173 of the block's 256 head rows.
  EXPECT_EQ(p.offset[8], 98304u);
  EXPECT_EQ(p.rows[8], 173);
  EXPECT_LE(p.bytes, kDemoBudget);
  EXPECT_GT(p.bytes + 512, kDemoBudget);  // not one more head row would fit
}

TEST(MtpChainPlan, RegionsFollowEachOtherAlignedAndWithinTheBudget) {
  for (size_t elem : {2, 4})
    for (int blocks : {1, 2, 8, 16})
      for (size_t budget : {size_t{0}, size_t{1000}, size_t{50000}, kDemoBudget, size_t{1} << 24}) {
        SCOPED_TRACE(::testing::Message() << elem << " bytes, " << blocks << " blocks, " << budget);
        const auto mats = DemoMats();
        const MtpChainResidentPlan p = PlanMtpChainResident(mats, elem, blocks, budget);
        size_t off = 0;
        bool any_short = false;
        for (int m = 0; m < kMtpChainResidentMats; ++m) {
          const size_t owned = (mats[m].rows + blocks - 1) / blocks;
          const size_t row_bytes = mats[m].cols * elem;
          EXPECT_EQ(p.offset[m], off);
          EXPECT_EQ(p.offset[m] % 16, 0u);
          EXPECT_GE(p.rows[m], 0);
          EXPECT_LE(static_cast<size_t>(p.rows[m]), owned);
          off += static_cast<size_t>(p.rows[m]) * row_bytes;
          // A matrix kept in part took every row that fitted at its turn.
          if (static_cast<size_t>(p.rows[m]) < owned) {
            any_short = true;
            EXPECT_LT(budget - off, row_bytes) << m;
          }
        }
        EXPECT_EQ(p.bytes, off);
        EXPECT_LE(p.bytes, budget);
        if (budget >= (size_t{1} << 24)) EXPECT_FALSE(any_short);  // everything fits
      }
}

TEST(MtpChainPlan, FewerBlocksOwnMoreRows) {
  const MtpChainResidentPlan p8 = PlanMtpChainResident(DemoMats(), 2, 8, size_t{1} << 24);
  EXPECT_EQ(p8.rows[0], 32);   // eh: 256 rows over 8 blocks
  EXPECT_EQ(p8.rows[8], 512);  // the head: 4096 rows over 8 blocks
  // Rows that do not divide: block 0 owns the extra one, and the plan is for it.
  std::array<MtpChainMatShape, kMtpChainResidentMats> odd{};
  odd[0] = {17, 8};
  EXPECT_EQ(PlanMtpChainResident(odd, 2, 16, 1000).rows[0], 2);
  EXPECT_EQ(PlanMtpChainResident(odd, 2, 0, 1000).bytes, 0u);  // no blocks: nothing planned
}

}  // namespace
}  // namespace ds::cuda
