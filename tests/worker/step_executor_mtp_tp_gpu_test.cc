// MTP under tensor parallelism on the CUDA backend (issue #15, docs/tp.md §10; label gpu, not run
// in CI; on a device: tools/device/mtp_tp_gpu_check.sh). Two ranks share GPU 0 through a
// host-staged Gloo collective (the collective kind does not change the MTP code path: every
// all-reduce and gather goes through the same Collective calls), each a CUDA backend over its
// shard of the demo model (F16) with a StepExecutor, as in the CPU test (worker_mtp_tp_test):
//  * greedy with MTP gives exactly the tokens of the same group without MTP (a verify runs its
//    rows through the decode path, so the numbers are the plain steps'), and the trained MTP
//    head is accepted, so the group takes fewer steps;
//  * sampled requests agree on every rank (else a step error) and repeat per seed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "common/collective/host_staged_collective.h"
#include "tests/worker/mtp_tp_group.h"

namespace ds::worker {
namespace {

using mtp_test::Outcome;

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<Outcome> RunGroup(int k, float temperature, const std::string& name) {
  return mtp_test::RunTpGroup(
      "cuda", 2, k, temperature, name,
      [](int, std::unique_ptr<GlooCollective> g) -> std::unique_ptr<Collective> {
        auto dev = NewCudaStagingDevice(0);
        EXPECT_TRUE(dev.ok()) << dev.status();
        if (!dev.ok()) return g;
        return std::make_unique<HostStagedCollective>(std::move(g), std::move(*dev));
      });
}

TEST(StepExecutorMtpTpCuda, GreedyTokensEqualTheGroupWithoutMtp) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Outcome> plain = RunGroup(0, 0.0f, "mtp_tp_cuda_plain");
  const std::vector<Outcome> mtp = RunGroup(3, 0.0f, "mtp_tp_cuda_mtp");
  ASSERT_EQ(plain[0].generated.size(), 3u);
  EXPECT_EQ(mtp[0].generated, plain[0].generated);
  EXPECT_EQ(mtp[1].generated, plain[0].generated);
  ASSERT_FALSE(mtp[0].stats.accepted.empty());
  EXPECT_GT(mtp[0].stats.accepted[0], 0);
  EXPECT_LT(mtp[0].steps, plain[0].steps);
  std::printf("CUDA TP=2 demo: %d steps plain, %d with MTP k=3 (mean accepted length %.2f)\n",
              plain[0].steps, mtp[0].steps, mtp[0].stats.mean_accepted_length());
}

TEST(StepExecutorMtpTpCuda, SampledRequestsAgreeAcrossRanksAndRepeat) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Outcome> a = RunGroup(2, 0.8f, "mtp_tp_cuda_sampled_a");
  const std::vector<Outcome> b = RunGroup(2, 0.8f, "mtp_tp_cuda_sampled_b");
  ASSERT_EQ(a[0].generated.size(), 3u);
  EXPECT_EQ(a[1].generated, a[0].generated);
  EXPECT_EQ(b[0].generated, a[0].generated);
}

}  // namespace
}  // namespace ds::worker
