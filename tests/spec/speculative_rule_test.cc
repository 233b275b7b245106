// The speculative sampling rule (worker/spec/speculative_rule.h): a draft drawn from q and judged
// against p yields tokens distributed as p (chi-square over many draws), greedy is a point mass.
#include "worker/spec/speculative_rule.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace ds::spec {
namespace {

// Pearson chi-square of observed counts against expected probabilities; all expected >= 5 here.
double ChiSquare(const std::map<int32_t, int64_t>& counts, const Distribution& p, int64_t n) {
  double chi = 0;
  for (const auto& [id, pr] : p) {
    const double e = pr * n;
    const double o = counts.count(id) ? static_cast<double>(counts.at(id)) : 0.0;
    chi += (o - e) * (o - e) / e;
  }
  return chi;
}

TEST(SpeculativeRule, OutputFollowsTheTargetDistribution) {
  // Target and draft disagree in every way that matters: shared tokens with different mass, a
  // token only q proposes (always rejected), tokens only p has (reached only via the residual).
  const Distribution p = {{3, 0.40}, {1, 0.25}, {7, 0.20}, {2, 0.10}, {9, 0.05}};
  const Distribution q = {{1, 0.50}, {3, 0.20}, {5, 0.20}, {7, 0.10}};
  std::vector<double> scratch(16, 0.0);
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  const int64_t n = 200000;
  std::map<int32_t, int64_t> counts;
  int64_t accepted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t d = DrawFrom(q, uni(rng));
    const Verdict v = JudgeDraft(p, q, d, uni(rng), uni(rng), &scratch);
    accepted += v.accepted;
    ++counts[v.token];
  }
  for (double x : scratch) ASSERT_EQ(x, 0.0);  // the scratch is left zero
  EXPECT_EQ(counts.count(5), 0u);  // q-only token never comes out
  // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
  EXPECT_LT(ChiSquare(counts, p, n), 18.47);
  // Acceptance rate = sum_x min(p(x), q(x)) = 0.2 + 0.25 + 0.1 = 0.55.
  EXPECT_NEAR(static_cast<double>(accepted) / n, 0.55, 0.01);
}

TEST(SpeculativeRule, IdenticalDistributionsAlwaysAccept) {
  const Distribution p = {{0, 0.5}, {4, 0.3}, {2, 0.2}};
  std::vector<double> scratch(8, 0.0);
  for (double u : {0.0, 0.3, 0.999})
    for (int32_t d : {0, 2, 4}) EXPECT_TRUE(JudgeDraft(p, p, d, u, 0.5, &scratch).accepted);
}

TEST(SpeculativeRule, GreedyIsAPointMass) {
  const Distribution p = {{6, 1.0}}, q_same = {{6, 1.0}}, q_other = {{2, 1.0}};
  std::vector<double> scratch(8, 0.0);
  EXPECT_EQ(JudgeDraft(p, q_same, 6, 0.99, 0.5, &scratch).token, 6);
  const Verdict v = JudgeDraft(p, q_other, 2, 0.0, 0.7, &scratch);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 6);
}

TEST(SpeculativeRule, DrawFromUsesAscendingIdOrder) {
  const Distribution d = {{9, 0.5}, {1, 0.25}, {4, 0.25}};  // most likely first, as the sampler
  EXPECT_EQ(DrawFrom(d, 0.0), 1);
  EXPECT_EQ(DrawFrom(d, 0.26), 4);
  EXPECT_EQ(DrawFrom(d, 0.51), 9);
  EXPECT_EQ(DrawFrom(d, 0.9999999), 9);
  EXPECT_EQ(DrawFrom({}, 0.5), -1);
}

}  // namespace
}  // namespace ds::spec
