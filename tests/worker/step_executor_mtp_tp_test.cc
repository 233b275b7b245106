// MTP speculative decoding under tensor parallelism (issue #15, docs/tp.md §10): ranks as threads,
// each a CPU backend over its shard of the trained demo model (its MTP block cut like a trunk
// attention layer, the MTP head vocab-parallel) with its own StepExecutor, meeting through Gloo,
// driven through the same steps (tests/worker/mtp_drive.h). Every rank accepts and drafts for
// itself and rank 0's broadcast checks that they agree (a disagreement is a step error, which the
// driver reports); rank 0's greedy tokens equal those of one rank without MTP.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tests/worker/mtp_tp_group.h"

namespace ds::worker {
namespace {

using mtp_test::Outcome;
using mtp_test::TpOptions;

std::vector<Outcome> RunGroup(int world, int k, float temperature, const std::string& name,
                              bool follows = false) {
  return mtp_test::RunTpGroup(
      "cpu", world, k, temperature, name,
      [](int, std::unique_ptr<GlooCollective> g) -> std::unique_ptr<Collective> { return g; },
      follows);
}

TEST(StepExecutorMtpTp, GreedyTokensEqualOneRankWithoutMtp) {
  const Outcome plain = mtp_test::DriveOneRank(0, 0.0f);
  for (int world : {2, 3}) {
    const std::vector<Outcome> ranks = RunGroup(world, 3, 0.0f, "mtp_tp_greedy" + std::to_string(world));
    ASSERT_EQ(plain.generated.size(), 3u);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(ranks[r].generated, plain.generated) << "world " << world << " rank " << r;
      EXPECT_EQ(ranks[r].steps, ranks[0].steps) << "world " << world << " rank " << r;
    }
    // The trained MTP head is accepted under TP too, so the group takes fewer steps.
    ASSERT_FALSE(ranks[0].stats.accepted.empty());
    EXPECT_GT(ranks[0].stats.accepted[0], 0) << "world " << world;
    EXPECT_LT(ranks[0].steps, plain.steps) << "world " << world;
    // Acceptance metrics come from rank 0 alone (the ranks judge the same verifies).
    EXPECT_EQ(ranks[1].stats.steps, 0) << "world " << world;
  }
}

// Sampled sequences: every rank draws the same uniforms (the seeds are the requests'), so the
// group agrees on every verify, repeats per seed, and gives one rank's plain sampled tokens
// (worker/spec/speculative_rule.h). The second run gets its decodes as work that follows the
// answer in flight (SlotWork.follows, sent ahead): every rank continues from the same token.
TEST(StepExecutorMtpTp, SampledRequestsAgreeAcrossRanksAndEqualPlainSampling) {
  const Outcome plain = mtp_test::DriveOneRank(0, 0.8f);
  const std::vector<Outcome> a = RunGroup(2, 2, 0.8f, "mtp_tp_sampled_a");
  const std::vector<Outcome> b = RunGroup(2, 2, 0.8f, "mtp_tp_sampled_b", /*follows=*/true);
  ASSERT_EQ(a[0].generated.size(), 3u);
  EXPECT_EQ(a[1].generated, a[0].generated);
  EXPECT_EQ(b[0].generated, a[0].generated);
  EXPECT_EQ(b[1].generated, a[0].generated);
  EXPECT_EQ(a[0].generated, plain.generated);
  EXPECT_GT(a[0].stats.steps, 0);
}

// The MTP head is cut like the vocab-parallel lm_head: with the lm_head on rank 0 only, --mtp is
// refused when the worker starts, on every rank alike.
TEST(StepExecutorMtpTp, RefusedWithTheLmHeadOnRankZero) {
  RunRanks<GlooCollective>(
      2, "mtp_tp_rank0",
      [](int, std::unique_ptr<GlooCollective> g) { return g; },
      [&](int rank, GlooCollective& g) {
        BackendOptions bo = TpOptions(rank, 2, &g);
        bo.tp_lm_head_rank0 = true;
        auto be = CreateBackend("cpu", ResolveModelAlias("demo"), bo, SpeculativeRoom{4, 3});
        ASSERT_TRUE(be.ok()) << be.status();
        StepExecutor ex(be->get(), 3);
        ex.SetGroup(&g);
        const absl::Status s = ex.SetMtp(spec::MtpSetting{3, false});
        EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
        EXPECT_NE(s.message().find("vocab-parallel"), std::string::npos) << s;
      });
}

}  // namespace
}  // namespace ds::worker
