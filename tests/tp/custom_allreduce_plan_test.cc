// The CPU half of the custom all-reduce (common/collective/custom_allreduce_plan.h): algorithm
// choice, chunking, the reference sum's fixed order and the one-host check.
#include "common/collective/custom_allreduce_plan.h"

#include <cstring>

#include "gtest/gtest.h"

namespace ds {
namespace {

TEST(CustomAllReducePlan, OneShotForSmallTwoShotForLargeUnlessForced) {
  CustomAllReduceOptions o;
  EXPECT_FALSE(CarUseTwoShot(5120 * 4, 2, o));             // one decode row
  EXPECT_FALSE(CarUseTwoShot(o.two_shot_min_bytes - 4, 4, o));
  EXPECT_TRUE(CarUseTwoShot(o.two_shot_min_bytes, 2, o));
  EXPECT_TRUE(CarUseTwoShot(5120 * 4 * 512, 2, o));        // a prefill micro-step
  EXPECT_FALSE(CarUseTwoShot(1 << 30, 1, o));              // one rank: nothing to do
  o.algo = CustomAllReduceOptions::Algo::kTwoShot;
  EXPECT_TRUE(CarUseTwoShot(16, 2, o));
  o.algo = CustomAllReduceOptions::Algo::kOneShot;
  EXPECT_FALSE(CarUseTwoShot(1 << 30, 2, o));
}

TEST(CustomAllReducePlan, ChunksCoverTheMessageInAlignedPieces) {
  EXPECT_TRUE(CarChunks(0, 1024).empty());
  auto c = CarChunks(2500, 1000);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0], std::make_pair(size_t{0}, size_t{1000}));
  EXPECT_EQ(c[1], std::make_pair(size_t{1000}, size_t{1000}));
  EXPECT_EQ(c[2], std::make_pair(size_t{2000}, size_t{500}));
  c = CarChunks(10, 7);  // capacity rounded down to a multiple of 4
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].second, 4u);
  EXPECT_EQ(c[2], std::make_pair(size_t{8}, size_t{2}));
  EXPECT_EQ(CarChunks(5120, 1 << 20).size(), 1u);
}

TEST(CustomAllReducePlan, ReferenceSumAddsInRankOrder) {
  // 1e8 + 1 - 1e8 in f32: left to right gives 0 (1 is lost against 1e8), another order gives 1.
  const float a[2] = {1e8f, 1.f}, b[2] = {1.f, 2.f}, c[2] = {-1e8f, 3.f};
  const float* in[3] = {a, b, c};
  float out[2];
  CarReferenceSum(in, 2, out);
  EXPECT_EQ(out[0], 0.f);
  EXPECT_EQ(out[1], 6.f);
  const float* swapped[3] = {a, c, b};
  CarReferenceSum(swapped, 2, out);
  EXPECT_EQ(out[0], 1.f);  // the order matters, hence one order for every rank
}

TEST(CustomAllReducePlan, EveryRankMustBeOnThisHost) {
  std::vector<CarRankInfo> all(3);
  for (auto& i : all) std::strcpy(i.host, "h1/boot-a");
  EXPECT_EQ(CarCheckOneHost(all, 0), "");
  std::strcpy(all[2].host, "h2/boot-b");
  const std::string why = CarCheckOneHost(all, 0);
  EXPECT_NE(why.find("rank 2 is on another host"), std::string::npos) << why;
  EXPECT_FALSE(CarHostIdentity().empty());
}

}  // namespace
}  // namespace ds
