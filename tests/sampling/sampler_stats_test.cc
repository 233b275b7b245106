// Statistical tests: 200k draws with fixed seeds, compared against exact expected distributions
// with a Pearson chi-square bound at significance 1e-4 (ChiSquareCritical). Each test also checks
// that tokens outside the allowed set are never drawn. A power check makes sure the bound would
// catch a wrong distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "common/sampling/rng.h"
#include "common/sampling/sampler.h"
#include "tests/sampling/test_util.h"

namespace ds::sampling {
namespace {

using testing::ChiSquare;
using testing::ChiSquareCritical;
using testing::Restrict;
using testing::SoftmaxD;

constexpr int kDraws = 200000;

// The sampler keys its uniform by position (the history's length), so independent draws take
// one more position each: filler ids -1 (ignored by the penalties) go before `history`.
std::vector<int64_t> Draw(Sampler& s, const std::vector<float>& logits,
                          const std::vector<int32_t>& history = {}, int draws = kDraws) {
  std::vector<int32_t> hist(static_cast<size_t>(draws) + history.size(), -1);
  std::copy(history.begin(), history.end(), hist.end() - static_cast<ptrdiff_t>(history.size()));
  std::vector<int64_t> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i)
    ++counts[s.Sample(logits, std::span<const int32_t>(hist).last(history.size() + i)).token];
  return counts;
}

void ExpectMatches(const std::vector<int64_t>& counts, const std::vector<double>& p) {
  int64_t outside = 0;
  int dof = 0;
  const double chi = ChiSquare(counts, p, &outside, &dof);
  EXPECT_EQ(outside, 0) << "draws outside the allowed set";
  EXPECT_LT(chi, ChiSquareCritical(dof)) << "dof " << dof;
}

std::vector<float> LogitsFromProbs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double v : p) l.push_back(static_cast<float>(std::log(v)) + 3.0f);  // shift-invariant
  return l;
}

TEST(SamplerStats, Temperature07MatchesSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f};
  Sampler s({.temperature = 0.7f, .seed = 1});
  const std::vector<int64_t> counts = Draw(s, logits);
  ExpectMatches(counts, SoftmaxD(logits, 0.7));
  // Power: the same draws are far outside the bound for temperature 1 and 0.65.
  EXPECT_GT(ChiSquare(counts, SoftmaxD(logits, 1.0)), 10 * ChiSquareCritical(5));
  EXPECT_GT(ChiSquare(counts, SoftmaxD(logits, 0.65)), ChiSquareCritical(5));
  // Max abs deviation: each frequency is within 5 standard deviations sqrt(p(1-p)/n).
  const std::vector<double> p = SoftmaxD(logits, 0.7);
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_NEAR(static_cast<double>(counts[i]) / kDraws, p[i],
                5 * std::sqrt(p[i] * (1 - p[i]) / kDraws));
  }
}

TEST(SamplerStats, FullVocabDrawOnRaggedBlocks) {
  // 1003 tokens: several sum blocks plus a ragged last block and a sub-vector tail.
  std::vector<float> logits(1003);
  Rng rng(5);
  for (float& l : logits) l = static_cast<float>(rng.NextDouble() * 4.0 - 2.0);
  Sampler s({.temperature = 1.3f, .seed = 2});
  ExpectMatches(Draw(s, logits), SoftmaxD(logits, 1.3));
}

TEST(SamplerStats, TopK3NeverLeavesTop3AndMatchesRenormalized) {
  const std::vector<float> logits = {0.3f, 2.5f, -1.0f, 2.0f, 1.9f, 0.0f, 1.2f, -0.5f, 1.0f, 0.1f};
  Sampler s({.temperature = 1.0f, .top_k = 3, .seed = 3});
  const std::vector<int64_t> counts = Draw(s, logits);
  ExpectMatches(counts, Restrict(SoftmaxD(logits), {1, 3, 4}));
  EXPECT_GT(counts[1] * counts[3] * counts[4], 0);
}

TEST(SamplerStats, TopP08KeepsMinimalNucleus) {
  // Probabilities by id (shuffled so rank != id): cumulative by rank 0.4, 0.65, 0.85 -> nucleus is
  // the top three (ids 3, 0, 4) for top_p 0.8; top_p 0.6 -> ids 3, 0.
  const std::vector<double> p = {0.25, 0.05, 0.1, 0.4, 0.2};
  const std::vector<float> logits = LogitsFromProbs(p);
  Sampler s({.temperature = 1.0f, .top_p = 0.8f, .seed = 4});
  ExpectMatches(Draw(s, logits), Restrict(p, {3, 0, 4}));
  Sampler t({.temperature = 1.0f, .top_p = 0.6f, .seed = 5});
  ExpectMatches(Draw(t, logits), Restrict(p, {3, 0}));
  // Same through the top-k path (explicit candidates).
  Sampler u({.temperature = 1.0f, .top_k = 4, .top_p = 0.8f, .seed = 6});
  ExpectMatches(Draw(u, logits), Restrict(p, {3, 0, 4}));
}

TEST(SamplerStats, TopPAppliesAfterTemperature) {
  // At T=2 the probabilities flatten (sqrt): 0.5, 0.3, 0.2 -> ~0.418, 0.324, 0.258. With top_p
  // 0.45 the nucleus is {0} at T=1 but {0, 1} at T=2: temperature must come before top-p.
  const std::vector<double> p = {0.5, 0.3, 0.2};
  const std::vector<float> logits = LogitsFromProbs(p);
  Sampler s({.temperature = 2.0f, .top_p = 0.45f, .seed = 7});
  const std::vector<double> q = SoftmaxD(logits, 2.0);
  ASSERT_LT(q[0], 0.45);
  ExpectMatches(Draw(s, logits), Restrict(q, {0, 1}));
}

TEST(SamplerStats, MinPRemovesTokensBelowThreshold) {
  // p_max = 0.5, min_p 0.2 -> threshold 0.1: keep ids with p >= 0.1 (0.5, 0.2, 0.12).
  const std::vector<double> p = {0.04, 0.5, 0.09, 0.2, 0.05, 0.12};
  const std::vector<float> logits = LogitsFromProbs(p);
  Sampler s({.temperature = 1.0f, .min_p = 0.2f, .seed = 8});
  ExpectMatches(Draw(s, logits), Restrict(p, {1, 3, 5}));
  // With top-k the same filter applies to the explicit candidates.
  Sampler t({.temperature = 1.0f, .top_k = 5, .min_p = 0.2f, .seed = 9});
  ExpectMatches(Draw(t, logits), Restrict(p, {1, 3, 5}));
}

TEST(SamplerStats, PenaltiesShiftTheDistributionAsComputedByHand) {
  const std::vector<float> logits = {2.0f, 1.0f, -1.0f, 0.5f, 0.0f};
  const std::vector<int32_t> history = {0, 4, 2, 2, 3};
  Sampler s({.temperature = 0.9f,
             .repetition_penalty = 1.5f,
             .presence_penalty = 0.3f,
             .frequency_penalty = 0.2f,
             .penalty_last_n = 4,
             .seed = 10});
  const std::vector<float> penalized = {2.0f, 1.0f, -1.0f * 1.5f - 0.4f - 0.3f,
                                        0.5f / 1.5f - 0.2f - 0.3f, -0.2f - 0.3f};
  const std::vector<int64_t> counts = Draw(s, logits, history);
  ExpectMatches(counts, SoftmaxD(penalized, 0.9));
  EXPECT_GT(ChiSquare(counts, SoftmaxD(logits, 0.9)), 10 * ChiSquareCritical(4));
}

TEST(SamplerStats, FullSizeVocabTopPDraws) {
  // 248320 tokens: 4 strong tokens at scattered ids, the rest a low flat tail. Draws are cheaper
  // to count by cell: the 4 heads and "tail".
  const int n = 248320;
  std::vector<float> logits(n, -7.0f);
  const int heads[4] = {7, 100003, 248319, 55555};
  const float head_logits[4] = {8.0f, 7.5f, 7.0f, 6.0f};
  for (int k = 0; k < 4; ++k) logits[heads[k]] = head_logits[k];
  const std::vector<double> p = SoftmaxD(logits);
  double head_mass = 0;
  for (int h : heads) head_mass += p[h];
  ASSERT_GT(head_mass, 0.9);  // so top_p 0.9 keeps only heads
  for (const float top_p : {1.0f, 0.9f}) {
    Sampler s({.temperature = 1.0f, .top_p = top_p, .seed = 11});
    std::vector<int64_t> cells(5, 0);
    const int draws = 3000;
    const std::vector<int32_t> filler(draws, -1);  // one more position per draw (see Draw)
    for (int i = 0; i < draws; ++i) {
      const int32_t t = s.Sample(logits, std::span<const int32_t>(filler).first(i)).token;
      int cell = 4;
      for (int k = 0; k < 4; ++k) cell = t == heads[k] ? k : cell;
      ++cells[cell];
    }
    std::vector<double> q(5);
    for (int k = 0; k < 4; ++k) q[k] = p[heads[k]];
    q[4] = 1.0 - head_mass;
    if (top_p < 1.0f) {
      // Nucleus: cumulative head masses in rank order must reach 0.9.
      double cum = 0;
      std::vector<int> keep;
      for (int k = 0; k < 4 && cum < 0.9; ++k) {
        cum += q[k];
        keep.push_back(k);
      }
      q = Restrict(q, keep);
    }
    int64_t outside = 0;
    int dof = 0;
    const double chi = ChiSquare(cells, q, &outside, &dof);
    EXPECT_EQ(outside, 0) << top_p;
    EXPECT_LT(chi, ChiSquareCritical(dof)) << top_p;
  }
}

}  // namespace
}  // namespace ds::sampling
