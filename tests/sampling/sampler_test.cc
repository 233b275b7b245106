// Exact (non-statistical) behaviour of Sampler: greedy, filters on a full-size vocabulary against
// double-precision references, penalties, logprobs, reproducibility and degenerate input.
#include "common/sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "common/sampling/rng.h"
#include "tests/sampling/test_util.h"

namespace ds::sampling {
namespace {

using testing::LogSoftmaxD;
using testing::SoftmaxD;

constexpr int kBigVocab = 248320;

// Gaussian-ish bulk (Irwin-Hall) with `spikes` strong tokens, like decoder logits.
std::vector<float> RandomLogits(int n, uint64_t seed, float spread, int spikes = 8) {
  Rng rng(seed);
  std::vector<float> l(n);
  for (float& v : l) {
    double s = 0;
    for (int k = 0; k < 4; ++k) s += rng.NextDouble();
    v = static_cast<float>((s - 2.0) * 1.732 * spread);
  }
  for (int k = 0; k < spikes; ++k) l[rng.Next() % n] += 10.0f - k;
  return l;
}

std::vector<int32_t> SortedIds(const std::vector<std::pair<int32_t, double>>& d) {
  std::vector<int32_t> ids;
  for (const auto& [id, p] : d) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Token ids of `p` sorted by probability descending, ties to the lowest id.
std::vector<int32_t> RankD(const std::vector<double>& p) {
  std::vector<int32_t> idx(p.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  return idx;
}

TEST(Sampler, GreedyPicksArgmaxTiesToLowestId) {
  Sampler s({.temperature = 0.0f});
  const std::vector<float> small = {1.0f, 3.0f, 3.0f, 2.0f};
  EXPECT_EQ(s.Sample(small, {}).token, 1);
  std::vector<float> big = RandomLogits(kBigVocab, 3, 2.0f);
  const float top = *std::max_element(big.begin(), big.end()) + 1.0f;
  big[200001] = top;
  big[150000] = top;
  big[150001] = top;
  EXPECT_EQ(s.Sample(big, {}).token, 150000);
  // top-k / top-p / min-p cannot change greedy.
  Sampler t({.temperature = 0.0f, .top_k = 2, .top_p = 0.1f, .min_p = 0.9f});
  EXPECT_EQ(t.Sample(big, {}).token, 150000);
}

TEST(Sampler, GreedyArgmaxAfterPenalties) {
  const std::vector<float> logits = {2.0f, 1.9f, -3.0f};
  Sampler plain({.temperature = 0.0f});
  EXPECT_EQ(plain.Sample(logits, std::vector<int32_t>{0}).token, 0);
  Sampler rep({.temperature = 0.0f, .repetition_penalty = 1.1f});  // 2.0 / 1.1 = 1.818 < 1.9
  EXPECT_EQ(rep.Sample(logits, std::vector<int32_t>{0}).token, 1);
  Sampler pres({.temperature = 0.0f, .presence_penalty = 0.2f});  // 2.0 - 0.2 < 1.9
  EXPECT_EQ(pres.Sample(logits, std::vector<int32_t>{0}).token, 1);
  // Outside the window (last 1 token is 2) the penalty does not apply.
  Sampler win({.temperature = 0.0f, .presence_penalty = 0.2f, .penalty_last_n = 1});
  EXPECT_EQ(win.Sample(logits, std::vector<int32_t>{0, 2}).token, 0);
}

TEST(Sampler, PenaltiesMatchHandComputation) {
  const std::vector<float> logits = {2.0f, 1.0f, -1.0f, 0.5f, 0.0f};
  // Window = last 4 = {4, 2, 2, 3}; token 0 is outside it; ids 7 and -1 are ignored.
  const std::vector<int32_t> history = {0, 7, -1, 4, 2, 2, 3};
  SamplingParams p{.temperature = 1.0f,
                   .repetition_penalty = 1.5f,
                   .presence_penalty = 0.3f,
                   .frequency_penalty = 0.2f,
                   .penalty_last_n = 4};
  const std::vector<float> expected_logits = {
      2.0f,                            // not in window
      1.0f,                            // not in history
      -1.0f * 1.5f - 2 * 0.2f - 0.3f,  // count 2, negative logit multiplied
      0.5f / 1.5f - 0.2f - 0.3f,       // count 1, positive logit divided
      0.0f * 1.5f - 0.2f - 0.3f,       // count 1, logit 0 is "not positive"
  };
  const std::vector<double> want = SoftmaxD(expected_logits);
  Sampler s(p);
  const auto dist = s.Distribution(logits, history);
  ASSERT_EQ(dist.size(), 5u);
  for (const auto& [id, prob] : dist) EXPECT_NEAR(prob, want[id], 1e-6) << id;
  // Whole-history window also penalizes token 0 (count 1).
  p.penalty_last_n = -1;
  Sampler all(p);
  std::vector<float> e2 = expected_logits;
  e2[0] = 2.0f / 1.5f - 0.2f - 0.3f;
  const std::vector<double> want2 = SoftmaxD(e2);
  for (const auto& [id, prob] : all.Distribution(logits, history)) {
    EXPECT_NEAR(prob, want2[id], 1e-6) << id;
  }
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  std::vector<float> logits = RandomLogits(5000, 11, 3.0f);
  logits[10] = logits[20] = 30.0f;  // a tie at the top: lower id first in top_logprobs
  const std::vector<double> lsm = LogSoftmaxD(logits);
  // Heavy processing must not leak into the reported logprobs.
  Sampler s({.temperature = 0.3f,
             .top_k = 7,
             .top_p = 0.9f,
             .repetition_penalty = 1.3f,
             .presence_penalty = 1.0f,
             .n_logprobs = 20});
  std::vector<int32_t> history = {10, 20, 33};
  const std::vector<int32_t> rank = RankD(std::vector<double>(lsm.begin(), lsm.end()));
  for (int i = 0; i < 50; ++i) {
    const SampleResult r = s.Sample(logits, history);
    ASSERT_GE(r.token, 0);
    EXPECT_NEAR(r.logprob, lsm[r.token], 1e-5);
    ASSERT_EQ(r.top_logprobs.size(), 20u);
    for (int k = 0; k < 20; ++k) {
      EXPECT_EQ(r.top_logprobs[k].first, rank[k]) << k;
      EXPECT_NEAR(r.top_logprobs[k].second, lsm[rank[k]], 1e-5) << k;
    }
    history.push_back(r.token);
  }
  // n_logprobs larger than the vocabulary returns all of it.
  Sampler few({.n_logprobs = 5});
  EXPECT_EQ(few.Sample(std::vector<float>{0.0f, 1.0f}, {}).top_logprobs.size(), 2u);
}

TEST(Sampler, TopKOnFullVocabMatchesReference) {
  const std::vector<float> logits = RandomLogits(kBigVocab, 5, 2.0f, 0);
  const std::vector<double> p = SoftmaxD(logits);
  const std::vector<int32_t> rank = RankD(p);
  for (int k : {1, 40, 1000}) {
    Sampler s({.temperature = 0.7f, .top_k = k});
    const auto dist = s.Distribution(logits, {});
    ASSERT_EQ(dist.size(), static_cast<size_t>(k));
    std::vector<int32_t> want(rank.begin(), rank.begin() + k);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(SortedIds(dist), want) << k;
    std::vector<float> kept;
    for (int32_t id : want) kept.push_back(logits[id]);
    const std::vector<double> q = SoftmaxD(kept, 0.7);
    for (size_t j = 0; j < want.size(); ++j) {
      const auto it =
          std::find_if(dist.begin(), dist.end(), [&](const auto& d) { return d.first == want[j]; });
      EXPECT_NEAR(it->second, q[j], 1e-6 + 1e-5 * q[j]);
    }
  }
}

TEST(Sampler, TopKTiesAreBrokenByLowestId) {
  std::vector<float> logits(1000, 0.0f);
  for (int i = 500; i < 520; ++i) logits[i] = 5.0f;  // 20 tied top tokens
  Sampler s({.top_k = 8});
  const auto dist = s.Distribution(logits, {});
  std::vector<int32_t> want;
  for (int i = 500; i < 508; ++i) want.push_back(i);
  EXPECT_EQ(SortedIds(dist), want);
}

// Minimal nucleus of p in double: shortest prefix by rank with mass >= top_p. Also returns how
// far the prefix sums before/at the cut are from top_p, so the test can check the data is not
// within float rounding of the boundary.
std::vector<int32_t> NucleusD(const std::vector<double>& p, double top_p, double* margin) {
  const std::vector<int32_t> rank = RankD(p);
  double cum = 0;
  std::vector<int32_t> out;
  for (int32_t id : rank) {
    const double before = cum;
    cum += p[id];
    out.push_back(id);
    if (cum >= top_p) {
      *margin = std::min(top_p - before, cum - top_p);
      break;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Sampler, TopPOnFullVocabKeepsExactlyTheMinimalNucleus) {
  struct Case {
    float spread, temperature, top_p;
  };
  // Nuclei from ~3k to ~215k tokens (the flat case exercises the boundary-bin refinement).
  for (const Case& c : {Case{2.0f, 0.7f, 0.8f}, Case{3.0f, 0.8f, 0.9f}, Case{1.0f, 1.0f, 0.5f},
                        Case{3.0f, 0.5f, 0.95f}, Case{0.1f, 1.0f, 0.9f}}) {
    const std::vector<float> logits = RandomLogits(kBigVocab, 9, c.spread);
    const std::vector<double> p = SoftmaxD(logits, c.temperature);
    // Nudge top_p off the float-rounding boundary of this data: weights are floats with ~2 ulp
    // exp error, so the cumulative mass at the cut is exact only to ~1e-7.
    float top_p = c.top_p;
    double margin = 0;
    std::vector<int32_t> want = NucleusD(p, top_p, &margin);
    for (int tries = 0; margin < 4e-7; ++tries) {
      ASSERT_LT(tries, 100) << "no top_p away from the boundary";
      top_p -= 3e-4f;
      want = NucleusD(p, top_p, &margin);
    }
    Sampler s({.temperature = c.temperature, .top_p = top_p});
    const auto dist = s.Distribution(logits, {});
    EXPECT_EQ(SortedIds(dist), want) << "spread " << c.spread << " nucleus " << want.size();
    double z = 0;
    for (int32_t id : want) z += p[id];
    double err = 0;
    for (const auto& [id, prob] : dist) err = std::max(err, std::fabs(prob - p[id] / z));
    EXPECT_LT(err, 1e-6);
  }
}

TEST(Sampler, TopPAfterTopK) {
  const std::vector<float> logits = RandomLogits(kBigVocab, 21, 2.0f, 0);
  const std::vector<int32_t> rank = RankD(SoftmaxD(logits));
  std::vector<float> top;
  for (int i = 0; i < 50; ++i) top.push_back(logits[rank[i]]);
  const std::vector<double> q = SoftmaxD(top, 0.8);  // q[i] is the prob of rank[i] after top-k
  double margin = 0;
  const std::vector<int32_t> nuc = NucleusD(q, 0.6f, &margin);  // positions into rank
  ASSERT_GT(margin, 1e-6);
  std::vector<int32_t> want;
  for (int32_t j : nuc) want.push_back(rank[j]);
  std::sort(want.begin(), want.end());
  Sampler s({.temperature = 0.8f, .top_k = 50, .top_p = 0.6f});
  EXPECT_EQ(SortedIds(s.Distribution(logits, {})), want);
}

TEST(Sampler, MinPOnFullVocabKeepsTokensAboveThreshold) {
  const std::vector<float> logits = RandomLogits(kBigVocab, 13, 2.0f);
  for (float min_p : {0.01f, 0.1f, 0.5f}) {
    const std::vector<double> p = SoftmaxD(logits, 0.9);
    const double pmax = *std::max_element(p.begin(), p.end());
    std::vector<int32_t> want;
    for (size_t i = 0; i < p.size(); ++i) {
      ASSERT_GT(std::fabs(p[i] - min_p * pmax), 1e-6 * pmax) << "data on the min-p boundary";
      if (p[i] >= min_p * pmax) want.push_back(static_cast<int32_t>(i));
    }
    Sampler s({.temperature = 0.9f, .min_p = min_p});
    EXPECT_EQ(SortedIds(s.Distribution(logits, {})), want) << min_p;
  }
}

TEST(Sampler, FullVocabDistributionMatchesSoftmax) {
  const std::vector<float> logits = RandomLogits(kBigVocab, 17, 2.0f);
  const std::vector<double> p = SoftmaxD(logits, 1.7);
  Sampler s({.temperature = 1.7f});
  const auto dist = s.Distribution(logits, {});
  EXPECT_EQ(dist.size(), logits.size());  // no token underflows at this spread
  double err = 0, sum = 0;
  for (const auto& [id, prob] : dist) {
    err = std::max(err, std::fabs(prob - p[id]) / p[id]);
    sum += prob;
  }
  EXPECT_LT(err, 1e-5);
  EXPECT_NEAR(sum, 1.0, 1e-6);  // block sums are float lanes
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferent) {
  const std::vector<float> logits = RandomLogits(kBigVocab, 23, 1.0f, 0);
  for (SamplingParams base :
       {SamplingParams{.temperature = 1.0f}, SamplingParams{.temperature = 1.0f, .top_k = 40},
        SamplingParams{.temperature = 1.0f, .top_p = 0.95f},
        SamplingParams{.temperature = 1.0f, .min_p = 0.05f}}) {
    base.seed = 1234;
    Sampler a(base), b(base);
    base.seed = 1235;
    Sampler c(base);
    std::vector<int32_t> ha, hb, hc;
    for (int i = 0; i < 100; ++i) {
      ha.push_back(a.Sample(logits, ha).token);
      hb.push_back(b.Sample(logits, hb).token);
      hc.push_back(c.Sample(logits, hc).token);
    }
    EXPECT_EQ(ha, hb);
    EXPECT_NE(ha, hc);
    // The draws are genuinely random: many distinct tokens.
    EXPECT_GT(std::set<int32_t>(ha.begin(), ha.end()).size(), 20u);
  }
}

// The uniform of a draw is keyed by the position of the token (the history's length), not by how
// many draws came before: a sampler that skipped positions, or a fresh one, draws the same token
// at a position (what a replay and a speculative verify rely on).
TEST(Sampler, DrawsAreKeyedByPosition) {
  const std::vector<float> logits = RandomLogits(kBigVocab, 37, 1.0f, 0);
  const SamplingParams p{.temperature = 1.0f, .top_k = 200, .seed = 99};
  Sampler run(p);
  std::vector<int32_t> hist = {5, 6, 7};
  for (int i = 0; i < 40; ++i) hist.push_back(run.Sample(logits, hist).token);
  for (size_t pos = 3; pos < hist.size(); pos += 7) {
    Sampler fresh(p);
    const std::span<const int32_t> before(hist.data(), pos);
    EXPECT_EQ(fresh.Sample(logits, before).token, hist[pos]) << pos;
    EXPECT_EQ(fresh.UniformAt(pos), UniformAt(p.seed, pos));
  }
  // Different positions draw different uniforms, so the stream is not one token repeated.
  EXPECT_GT(std::set<int32_t>(hist.begin() + 3, hist.end()).size(), 10u);
}

TEST(Sampler, ArgmaxIsTheGreedyTokenUnderPenaltiesAtAnyTemperature) {
  const std::vector<float> logits = {2.0f, 1.9f, -3.0f, 2.0f};
  Sampler hot({.temperature = 1.5f, .top_k = 3});
  EXPECT_EQ(hot.Argmax(logits, std::vector<int32_t>{0}), 0);  // tie: lowest id
  Sampler rep({.temperature = 0.7f, .repetition_penalty = 1.1f});
  EXPECT_EQ(rep.Argmax(logits, std::vector<int32_t>{0, 3}), 1);  // both 2.0s divided by 1.1
  Sampler greedy({.temperature = 0.0f, .repetition_penalty = 1.1f});
  EXPECT_EQ(greedy.Argmax(logits, std::vector<int32_t>{0, 3}),
            greedy.Sample(logits, std::vector<int32_t>{0, 3}).token);
  EXPECT_EQ(hot.Argmax({}, {}), -1);
}

TEST(Sampler, DegenerateInputNeverCrashes) {
  Sampler s({.temperature = 1.0f, .top_p = 0.9f, .n_logprobs = 3});
  EXPECT_EQ(s.Sample({}, {}).token, -1);
  const std::vector<float> all_masked(10, -INFINITY);
  const SampleResult r = s.Sample(all_masked, {});
  EXPECT_EQ(r.token, 0);
  EXPECT_EQ(r.logprob, -INFINITY);
  // NaN is never sampled; -inf is never sampled; +inf always wins.
  std::vector<float> odd = {NAN, 0.0f, -INFINITY, 0.0f, NAN};
  for (int i = 0; i < 200; ++i) {
    const int32_t t = s.Sample(odd, {}).token;
    ASSERT_TRUE(t == 1 || t == 3) << t;
  }
  odd[2] = INFINITY;
  const SampleResult w = s.Sample(odd, {});
  EXPECT_EQ(w.token, 2);
  EXPECT_NEAR(w.logprob, 0.0f, 1e-6);
  // Out-of-range history ids are ignored.
  Sampler pen({.repetition_penalty = 2.0f, .frequency_penalty = 1.0f});
  EXPECT_GE(pen.Sample(std::vector<float>{1.0f, 2.0f}, std::vector<int32_t>{-5, 2, 99}).token, 0);
}

// The draw is canonical (sampler.h step 8): the first kept token in ascending id whose cumulative
// probability exceeds u, for every filter path (top-k, a large top-p nucleus that takes the O(V)
// id sweep, min-p, full vocabulary). A device sampler relies on this to match given u.
TEST(Sampler, DrawWalksKeptTokensInAscendingId) {
  const std::vector<float> flat = RandomLogits(kBigVocab, 29, 0.5f, 0);  // nucleus > 4096 tokens
  const std::vector<float> peaked = RandomLogits(kBigVocab, 31, 2.0f);
  int checked = 0;
  for (const SamplingParams& base :
       {SamplingParams{.temperature = 1.0f, .top_k = 40},
        SamplingParams{.temperature = 0.8f, .top_k = 300, .top_p = 0.9f},
        SamplingParams{.temperature = 1.0f, .top_p = 0.95f},
        SamplingParams{.temperature = 1.0f, .min_p = 0.001f},
        SamplingParams{.temperature = 1.3f}}) {
    for (const std::vector<float>* logits : {&flat, &peaked}) {
      for (uint64_t seed = 1; seed <= 6; ++seed) {
        SamplingParams p = base;
        p.seed = seed * 977;
        Sampler s(p);
        const double u = s.UniformAt(0);
        EXPECT_EQ(u, UniformAt(p.seed, 0));
        const int32_t tok = s.Sample(*logits, {}).token;
        EXPECT_EQ(s.UniformAt(0), u);  // keyed by position: sampling changes nothing
        std::vector<std::pair<int32_t, double>> d = Sampler(p).Distribution(*logits, {});
        std::sort(d.begin(), d.end());
        double cum = 0;
        int32_t want = d.back().first;
        for (const auto& [id, q] : d) {
          cum += q;
          if (u < cum) {
            want = id;
            break;
          }
        }
        if (tok != want) {
          // Only a boundary within the float-lane rounding of the block sums may differ.
          double lo = 0, hi = -1;
          for (const auto& [id, q] : d) {
            if (id == tok) {
              hi = lo + q;
              break;
            }
            lo += q;
          }
          EXPECT_TRUE(hi >= 0 && u >= lo - 1e-6 && u <= hi + 1e-6)
              << "seed " << p.seed << " token " << tok << " want " << want;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 60);
}

TEST(Sampler, CreateValidates) {
  EXPECT_FALSE(Sampler::Create({.top_p = 0.0f}, 100).ok());
  EXPECT_TRUE(Sampler::Create({.top_p = 0.5f}, 100).ok());
}

}  // namespace
}  // namespace ds::sampling
