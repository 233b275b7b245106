// Prefix cache on the CUDA backend (issue #17; label `gpu`, not run in CI): the harness of
// prefix_cache_test.cc over the CUDA backend and the tiny synth model in F32, checkpoints in
// device memory. A chat's turns and requests sharing a prefix give the same tokens with the cache
// as without it, greedy and seeded, while turns 2 and 3 and the sharing requests really resume.
// (With the cache a resumed sequence prefills its suffix in other pieces than a cold one; on F32
// the piece lengths change only the last bits of the f32 sums, below any token decision here.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "tests/worker/prefix_cache_harness.h"

namespace ds::prefix_test {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(PrefixCacheGpu, ChatTurnsResumeAndMatchNoCacheOnF32) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (float temp : {0.0f, 0.8f}) {
    const Outcome off = Chat(0, temp, "cuda"), on = Chat(uint64_t{256} << 20, temp, "cuda");
    EXPECT_EQ(on.out, off.out) << "temperature " << temp;
    ASSERT_TRUE(on.resumed_at.contains(2) && on.resumed_at.contains(3));
    EXPECT_EQ(on.resumed_at.at(2), 150 + 10 - 1);
    EXPECT_EQ(on.cache.hits, 2u);
    EXPECT_EQ(on.cache.failures, 0u);
  }
}

TEST(PrefixCacheGpu, RequestsSharingAPrefixMatchNoCacheOnF32) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const Outcome off = Agents(0, 0, "cuda"), on = Agents(uint64_t{256} << 20, 0, "cuda");
  EXPECT_EQ(on.out, off.out);
  EXPECT_EQ(on.cache.hits, 5u);
}

}  // namespace
}  // namespace ds::prefix_test
