// GlooCollective between threads of one process (each thread is a rank with its own context and
// TCP mesh over loopback): sums, gathers, broadcasts and barriers give exact results; bad
// arguments come back as errors; SoloCollective is the identity.
#include "common/collective/gloo_collective.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <thread>

#include "gtest/gtest.h"
#include "tests/tp/gloo_ranks.h"

namespace ds {
namespace {

// Runs fn(rank, collective) on `world` threads, each with its own GlooCollective.
void RunGroup(int world, const std::string& name, const std::function<void(int, Collective&)>& fn) {
  RunRanks<GlooCollective>(
      world, name, [](int, std::unique_ptr<GlooCollective> g) { return g; },
      [&](int r, GlooCollective& c) { fn(r, c); });
}

TEST(GlooCollective, AllReduceSumIsExactForSmallIntegers) {
  for (int world : {2, 3, 4}) {
    RunGroup(world, "ar" + std::to_string(world), [world](int r, Collective& c) {
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.world(), world);
      EXPECT_EQ(c.name(), "gloo");
      for (size_t n : {size_t{1}, size_t{7}, size_t{4096}, size_t{300000}}) {
        std::vector<float> x(n);
        for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((r + 1) * (i % 97));
        ASSERT_TRUE(c.AllReduceSum(x.data(), n).ok());
        const float f = world * (world + 1) / 2.0f;
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(x[i], f * (i % 97)) << "n " << n << " i " << i;
      }
    });
  }
}

TEST(GlooCollective, AllGatherAndAllGatherVAreRankMajor) {
  RunGroup(3, "ag", [](int r, Collective& c) {
    float mine[2] = {10.f * r, 10.f * r + 1};
    std::vector<float> all(6, -1);
    ASSERT_TRUE(c.AllGather(mine, 2, all.data()).ok());
    EXPECT_EQ(all, (std::vector<float>{0, 1, 10, 11, 20, 21}));
    const std::vector<size_t> counts = {1, 3, 2};
    std::vector<float> in(counts[r], static_cast<float>(r + 1));
    std::vector<float> out(6, -1);
    ASSERT_TRUE(c.AllGatherV(in.data(), counts, out.data()).ok());
    EXPECT_EQ(out, (std::vector<float>{1, 2, 2, 2, 3, 3}));
    const std::vector<size_t> bad = {1, 2};
    EXPECT_EQ(c.AllGatherV(in.data(), bad, out.data()).code(), absl::StatusCode::kInvalidArgument);
  });
}

TEST(GlooCollective, BroadcastFromEveryRoot) {
  RunGroup(3, "bc", [](int r, Collective& c) {
    for (int root = 0; root < 3; ++root) {
      int32_t v[3] = {r, r, r};
      if (r == root) v[1] = 100 + root;
      ASSERT_TRUE(c.Broadcast(v, sizeof(v), root).ok());
      EXPECT_EQ(v[0], root);
      EXPECT_EQ(v[1], 100 + root);
    }
    int32_t x = 0;
    EXPECT_EQ(c.Broadcast(&x, 4, 3).code(), absl::StatusCode::kInvalidArgument);
  });
}

// A benchmark, not a test (DISABLED_: ctest skips it; docs/conventions.md "Benchmarks"): the
// per-call latency docs/perf/tp.md quotes. Run it with
//   collective_test --gtest_also_run_disabled_tests --gtest_filter='GlooCollective.DISABLED_*'
TEST(GlooCollective, DISABLED_LatencyOfSmallAllReduce) {
  RunGroup(2, "lat", [](int r, Collective& c) {
    std::vector<float> x(128 * 2, 1.f);  // one decode step's partial sums of a 128-wide model
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(c.AllReduceSum(x.data(), x.size()).ok());
    const auto t0 = std::chrono::steady_clock::now();
    const int n = 200;
    for (int i = 0; i < n; ++i) ASSERT_TRUE(c.AllReduceSum(x.data(), x.size()).ok());
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
    if (r == 0) std::printf("gloo allreduce of %zu floats, 2 ranks: %.1f us/call\n", x.size(), us);
  });
}

TEST(GlooCollective, BadOptionsAreErrors) {
  GlooOptions o;
  o.rank = 2;
  o.world = 2;
  o.store_dir = FreshDir("bad");
  EXPECT_EQ(GlooCollective::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  o.store_dir.clear();
  EXPECT_EQ(GlooCollective::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GlooCollective, MissingPeerTimesOutWithAnError) {
  GlooOptions o;
  o.rank = 0;
  o.world = 2;
  o.store_dir = FreshDir("alone");
  o.timeout = std::chrono::milliseconds(500);
  auto c = GlooCollective::Create(o);
  EXPECT_FALSE(c.ok());
}

TEST(SoloCollective, IsTheIdentity) {
  SoloCollective c;
  float x[3] = {1, 2, 3}, y[3] = {};
  EXPECT_TRUE(c.AllReduceSum(x, 3).ok());
  EXPECT_EQ(x[2], 3);
  EXPECT_TRUE(c.AllGather(x, 3, y).ok());
  EXPECT_EQ(y[1], 2);
  const size_t counts[1] = {3};
  EXPECT_TRUE(c.AllGatherV(x, counts, y).ok());
  EXPECT_TRUE(c.Broadcast(x, 12, 0).ok());
  EXPECT_FALSE(c.Broadcast(x, 12, 1).ok());
  EXPECT_TRUE(c.Barrier().ok());
}

}  // namespace
}  // namespace ds
