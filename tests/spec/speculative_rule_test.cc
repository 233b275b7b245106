// The acceptance rule (worker/spec/speculative_rule.h): keeping a deterministic draft d iff the
// target's own sample y at that row equals it is the standard rule for a point-mass draft
// distribution: P(keep) = p(d), and on rejection the token follows p(. | not d) (the residual
// max(0, p - q) renormalized). Checked over many seeds with the real sampler; and the kept-prefix
// bookkeeping of KeepMatchingDrafts.
#include "worker/spec/speculative_rule.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "common/sampling/sampler.h"

namespace ds::spec {
namespace {

using sampling::Sampler;
using sampling::SamplingParams;

TEST(SpeculativeRule, KeepsTheMatchingPrefixThenTheTargetsToken) {
  const std::vector<int32_t> drafts = {4, 5, 6};
  for (int mismatch = 0; mismatch <= 3; ++mismatch) {
    // The target agrees with the first `mismatch` drafts, then says 9 (row 3: the bonus 8).
    std::vector<int32_t> y = {4, 5, 6, 8};
    if (mismatch < 3) y[mismatch] = 9;
    std::vector<int32_t> tokens = {1, 2};
    std::vector<size_t> asked_at;  // history length when row r was asked for
    const int kept = KeepMatchingDrafts(
        drafts,
        [&](int r) {
          asked_at.push_back(tokens.size());
          return y[r];
        },
        &tokens);
    EXPECT_EQ(kept, mismatch);
    std::vector<int32_t> want = {1, 2};
    for (int i = 0; i < mismatch; ++i) want.push_back(drafts[i]);
    want.push_back(y[mismatch]);
    EXPECT_EQ(tokens, want);
    ASSERT_EQ(asked_at.size(), static_cast<size_t>(mismatch + 1));
    for (int r = 0; r <= mismatch; ++r) EXPECT_EQ(asked_at[r], 2u + r) << "row " << r;
  }
  std::vector<int32_t> tokens;
  EXPECT_EQ(KeepMatchingDrafts(std::vector<int32_t>{}, [](int) { return 3; }, &tokens), 0);
  EXPECT_EQ(tokens, std::vector<int32_t>{3});
}

// Pearson chi-square of counts against probabilities (all expected counts >= 5 here).
double ChiSquare(const std::map<int32_t, int64_t>& counts, const std::map<int32_t, double>& p,
                 int64_t n) {
  double chi = 0;
  for (const auto& [id, pr] : p) {
    const double e = pr * static_cast<double>(n);
    const double o = counts.count(id) ? static_cast<double>(counts.at(id)) : 0.0;
    chi += (o - e) * (o - e) / e;
  }
  return chi;
}

// One verify row with a draft that is not the target's most likely token, judged under 60000
// seeds: acceptance ~ p(d), rejected tokens ~ p(. | not d).
TEST(SpeculativeRule, IsTheStandardRuleForADeterministicDraft) {
  const std::vector<float> logits = {0.2f, 1.5f, -0.4f, 0.9f, 1.1f, -1.0f, 0.0f};
  const std::vector<int32_t> history = {2, 0, 3};
  const int32_t draft = 4;
  for (const SamplingParams& base : {SamplingParams{.temperature = 1.0f},
                                     SamplingParams{.temperature = 0.7f, .top_k = 4},
                                     SamplingParams{.temperature = 1.2f, .top_p = 0.9f}}) {
    std::map<int32_t, double> p;
    for (const auto& [id, pr] : Sampler(base).Distribution(logits, history)) p[id] = pr;
    ASSERT_TRUE(p.count(draft));
    const double pd = p[draft];
    std::map<int32_t, double> residual;
    for (const auto& [id, pr] : p)
      if (id != draft) residual[id] = pr / (1.0 - pd);
    const int64_t n = 60000;
    int64_t kept = 0;
    std::map<int32_t, int64_t> rejected;
    for (int64_t i = 0; i < n; ++i) {
      SamplingParams sp = base;
      sp.seed = static_cast<uint64_t>(i) + 1;
      Sampler s(sp);
      std::vector<int32_t> tokens = history;
      const std::vector<int32_t> drafts = {draft};
      // Row 1 (after a kept draft) is not under test; its token is a fixed stand-in.
      const int k = KeepMatchingDrafts(
          drafts, [&](int r) { return r == 0 ? s.Sample(logits, tokens).token : 0; }, &tokens);
      if (k == 1) {
        ++kept;
      } else {
        ++rejected[tokens.back()];
      }
    }
    EXPECT_EQ(rejected.count(draft), 0u);
    // Binomial sd of the rate: sqrt(pd (1 - pd) / n) <= 0.0021; 5 sd.
    EXPECT_NEAR(static_cast<double>(kept) / n, pd, 0.0105) << "temperature " << base.temperature;
    // P(chi2 > x) = 0.001 for 5 (top_p: 4 or 5) degrees of freedom at most: 20.5.
    EXPECT_LT(ChiSquare(rejected, residual, n - kept), 20.5) << "temperature " << base.temperature;
  }
}

}  // namespace
}  // namespace ds::spec
