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

Outcome Chat(uint64_t cache_bytes, float temp) {
  Outcome o;
  Harness h(cache_bytes, 2, 96, 64, "cuda");
  std::vector<int32_t> prompt = Tokens(150, 1);
  for (RequestId turn = 1; turn <= 3; ++turn) {
    h.Add(Make(turn, prompt, 10, temp));
    EXPECT_TRUE(h.RunToEnd(&o));
    prompt.insert(prompt.end(), o.out[turn].begin(), o.out[turn].end());
    const std::vector<int32_t> user = Tokens(20, 10 + static_cast<int>(turn));
    prompt.insert(prompt.end(), user.begin(), user.end());
  }
  h.Finish(&o);
  return o;
}

TEST(PrefixCacheGpu, ChatTurnsResumeAndMatchNoCacheOnF32) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (float temp : {0.0f, 0.8f}) {
    const Outcome off = Chat(0, temp), on = Chat(uint64_t{256} << 20, temp);
    EXPECT_EQ(on.out, off.out) << "temperature " << temp;
    ASSERT_TRUE(on.resumed_at.contains(2) && on.resumed_at.contains(3));
    EXPECT_EQ(on.resumed_at.at(2), 150 + 10 - 1);
    EXPECT_EQ(on.cache.hits, 2u);
    EXPECT_EQ(on.cache.failures, 0u);
  }
}

TEST(PrefixCacheGpu, RequestsSharingAPrefixMatchNoCacheOnF32) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto run = [](uint64_t bytes) {
    Outcome o;
    Harness h(bytes, 2, 96, 64, "cuda");
    const std::vector<int32_t> prefix = Tokens(200, 3);
    for (RequestId id = 1; id <= 6; ++id) {
      std::vector<int32_t> p = prefix;
      std::vector<int32_t> suffix = Tokens(10 + 7 * static_cast<int>(id), 20 + static_cast<int>(id));
      suffix[0] = static_cast<int32_t>(245 + id);
      p.insert(p.end(), suffix.begin(), suffix.end());
      h.Add(Make(id, p, 6));
    }
    EXPECT_TRUE(h.RunToEnd(&o));
    h.Finish(&o);
    return o;
  };
  const Outcome off = run(0), on = run(uint64_t{256} << 20);
  EXPECT_EQ(on.out, off.out);
  EXPECT_EQ(on.cache.hits, 5u);
}

}  // namespace
}  // namespace ds::prefix_test
