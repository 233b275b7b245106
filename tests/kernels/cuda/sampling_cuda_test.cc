// The CUDA sampler (kernels/cuda/sampling.cu) against the CPU sampler (common/sampling/sampler.h):
//   * token equality given the same uniform (the one the CPU sampler draws from the request's
//     seed) over many random rows, vocabulary sizes and parameter combinations, both through the
//     candidate fast path and forced through the general path; a mismatch is allowed only where
//     the uniform lies within kEps of the GPU token's cumulative-probability interval (ascending
//     id order), and those are counted and bounded;
//   * a chi-square test of the GPU draw distribution against the CPU-computed probabilities;
//   * ArgmaxSplitRows (kernels/cuda/argmax.cuh) against the CPU sampler's greedy token and
//     SampleRows' greedy rows, over every shape (ties, NaN, +-inf), odd sizes and unaligned rows;
//   * a timing loop (printed, not asserted) at vocabulary 248320.
// Needs a GPU (ctest label `gpu`).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "common/sampling/rng.h"
#include "common/sampling/sampler.h"
#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/sampling/test_util.h"

namespace ds::cuda {
namespace {

using sampling::Rng;
using sampling::Sampler;
using sampling::SamplingParams;

constexpr int kVocab = 248320;
// Allowed distance of the uniform from a cumulative-probability boundary for a token mismatch.
// The CPU's whole-vocabulary path sums weights in float lanes (relative error ~1e-7); every other
// sum on either side is double.
constexpr double kEps = 1e-6;

enum class Shape { kDecoder, kFlat, kPeaked, kTies, kSpecial };
const char* ShapeName(Shape s) {
  switch (s) {
    case Shape::kDecoder:
      return "decoder";
    case Shape::kFlat:
      return "flat";
    case Shape::kPeaked:
      return "peaked";
    case Shape::kTies:
      return "ties";
    case Shape::kSpecial:
      return "special";
  }
  return "?";
}

// Irwin-Hall(4) bulk with strong tokens, like decoder logits (tests/sampling/sampler_test.cc).
// kPeaked: the strong tokens dominate the mass (a typical LLM step, small nucleus); kDecoder: the
// bulk holds most of the mass (nucleus of many thousand tokens); kTies: values on a 0.5 grid and
// a repeated maximum; kSpecial: NaN, -inf and a +inf among them.
std::vector<float> MakeLogits(int n, uint64_t seed, Shape shape) {
  Rng rng(seed);
  const float spread = shape == Shape::kFlat ? 0.3f : 2.0f;
  std::vector<float> l(n);
  for (float& v : l) {
    double s = 0;
    for (int k = 0; k < 4; ++k) s += rng.NextDouble();
    v = static_cast<float>((s - 2.0) * 1.732 * spread);
  }
  const int spikes = std::min(n, 8);
  for (int k = 0; k < spikes; ++k) {
    const float boost = shape == Shape::kPeaked ? 26.0f - 1.5f * k : 10.0f - k;
    l[rng.Next() % n] += boost;
  }
  if (shape == Shape::kTies) {
    for (float& v : l) v = std::round(v * 2.0f) / 2.0f;
    const float top = *std::max_element(l.begin(), l.end());
    for (int k = 0; k < 3; ++k) l[rng.Next() % n] = top;
  }
  if (shape == Shape::kSpecial) {
    for (int k = 0; k < std::max(1, n / 100); ++k) l[rng.Next() % n] = std::nanf("");
    for (int k = 0; k < std::max(1, n / 200); ++k) l[rng.Next() % n] = -INFINITY;
    if (rng.Next() % 2 == 0) l[rng.Next() % n] = INFINITY;
  }
  return l;
}

template <typename T>
T Pick(Rng& rng, std::initializer_list<T> v) {
  return *(v.begin() + rng.Next() % v.size());
}

SamplingParams RandomParams(Rng& rng, int n) {
  SamplingParams p;
  p.temperature = Pick(rng, {0.0f, 0.25f, 0.7f, 1.0f, 1.0f, 1.3f});
  const int k = Pick(rng, {0, 0, 0, 1, 5, 40, 300, 1024, 1025, 3000, -1, -2});
  p.top_k = k == -1 ? std::max(n - 1, 0) : (k == -2 ? n : k);
  p.top_p = Pick(rng, {1.0f, 1.0f, 0.5f, 0.9f, 0.95f, 0.999f});
  p.min_p = Pick(rng, {0.0f, 0.0f, 0.0f, 0.02f, 0.1f, 0.6f});
  if (rng.Next() % 2 == 0) {
    p.repetition_penalty = Pick(rng, {1.0f, 1.1f, 0.9f, 1.3f});
    p.presence_penalty = Pick(rng, {0.0f, 0.5f, -0.5f});
    p.frequency_penalty = Pick(rng, {0.0f, 0.3f, 1.5f});
    p.penalty_last_n = Pick(rng, {64, 64, -1, 0, 7});
  }
  p.seed = rng.Next() | 1;
  return p;
}

// Prompt + generated ids: repeats, some of the largest logits (so penalties move the maximum),
// and out-of-range ids the samplers must ignore.
std::vector<int32_t> RandomHistory(Rng& rng, const std::vector<float>& logits) {
  const int n = static_cast<int>(logits.size());
  std::vector<int32_t> top(std::min(n, 16));
  std::vector<int32_t> idx(n);
  for (int i = 0; i < n; ++i) idx[i] = i;
  std::partial_sort(idx.begin(), idx.begin() + top.size(), idx.end(), [&](int a, int b) {
    const float x = std::isnan(logits[a]) ? -INFINITY : logits[a];
    const float y = std::isnan(logits[b]) ? -INFINITY : logits[b];
    return x > y || (x == y && a < b);
  });
  std::copy(idx.begin(), idx.begin() + top.size(), top.begin());
  std::vector<int32_t> h(rng.Next() % 200);
  for (int32_t& t : h) {
    const uint64_t r = rng.Next() % 10;
    if (r < 3)
      t = top[rng.Next() % top.size()];
    else if (r == 3)
      t = Pick(rng, {-1, n, n + 7});
    else
      t = static_cast<int32_t>(rng.Next() % std::min(n, 64));  // small-id repeats
  }
  return h;
}

struct Case {
  SamplingParams p;
  std::vector<int32_t> hist;
  double u = 0;
  int32_t cpu = -1;
};

// GPU tokens for `cases`, all sharing one logits row (ld = 0).
std::vector<int32_t> RunGpu(const std::vector<float>& logits, const std::vector<Case>& cases,
                            int flags) {
  const int n = static_cast<int>(logits.size());
  std::vector<SampleRowParams> rows;
  std::vector<PenaltyPair> pairs;
  for (const Case& c : cases) PackSampleRow(c.p, c.hist, n, c.u, false, &rows, &pairs);
  Dev<float> dl(logits.size());
  dl.Up(logits);
  Dev<SampleRowParams> dp(rows.size());
  dp.Up(rows);
  Dev<PenaltyPair> dq(pairs.size());
  dq.Up(pairs);
  Dev<int32_t> out(rows.size());
  const absl::Status st =
      SampleRows(dl.p, 0, static_cast<int>(rows.size()), n, dp.p, dq.p, out.p, nullptr, flags);
  EXPECT_TRUE(st.ok()) << st.ToString();
  DS_CUDA_CHECK(cudaDeviceSynchronize());
  return out.Down(rows.size());
}

struct Tally {
  int rows = 0, mismatches = 0, boundary = 0;
};

// Checks one GPU token against the CPU's for the same uniform; see kEps.
void Check(const std::vector<float>& logits, const Case& c, int32_t gpu, const std::string& what,
           Tally* t) {
  ++t->rows;
  if (gpu == c.cpu) return;
  ++t->mismatches;
  Sampler ref(c.p);
  std::vector<std::pair<int32_t, double>> d = ref.Distribution(logits, c.hist);
  std::sort(d.begin(), d.end());
  double cum = 0, lo = -1, hi = -1;
  for (const auto& [id, p] : d) {
    if (id == gpu) {
      lo = cum;
      hi = cum + p;
      break;
    }
    cum += p;
  }
  const bool near = c.p.temperature > 0 && lo >= 0 && c.u >= lo - kEps && c.u <= hi + kEps;
  if (near) {
    ++t->boundary;
    return;
  }
  ADD_FAILURE() << what << ": gpu token " << gpu << " (interval [" << lo << ", " << hi
                << ")) != cpu token " << c.cpu << " for u = " << c.u << ", n = " << logits.size()
                << ", T = " << c.p.temperature << ", top_k = " << c.p.top_k
                << ", top_p = " << c.p.top_p << ", min_p = " << c.p.min_p
                << ", rep = " << c.p.repetition_penalty << ", pres = " << c.p.presence_penalty
                << ", freq = " << c.p.frequency_penalty << ", last_n = " << c.p.penalty_last_n
                << ", history " << c.hist.size();
}

void RunMatch(int n, Shape shape, uint64_t seed, int n_cases, Tally* fast, Tally* general) {
  const std::vector<float> logits = MakeLogits(n, seed, shape);
  Rng rng(seed * 7919 + 1);
  std::vector<Case> cases(n_cases);
  for (Case& c : cases) {
    c.p = RandomParams(rng, n);
    c.hist = RandomHistory(rng, logits);
    Sampler s(c.p);
    c.u = s.UniformAt(c.hist.size());
    c.cpu = s.Sample(logits, c.hist).token;
  }
  const std::string what = std::string(ShapeName(shape)) + " n=" + std::to_string(n);
  const std::vector<int32_t> g0 = RunGpu(logits, cases, 0);
  const std::vector<int32_t> g1 = RunGpu(logits, cases, kSampleForceGeneral);
  for (int i = 0; i < n_cases; ++i) {
    Check(logits, cases[i], g0[i], what + " fast", fast);
    Check(logits, cases[i], g1[i], what + " general", general);
  }
}

void Report(const char* name, const Tally& t) {
  std::printf("[ sampling ] %s: %d rows, %d mismatches, all within %.0e of a boundary: %d\n", name,
              t.rows, t.mismatches, kEps, t.boundary);
  EXPECT_EQ(t.mismatches, t.boundary);
  // Expected count ~ rows * 4 * kEps (~0): more means a systematic offset, not rounding.
  EXPECT_LE(t.boundary, 2 + t.rows / 200);
}

TEST(SampleRows, MatchesCpuSamplerFullVocab) {
  Tally fast, general;
  const Shape shapes[] = {Shape::kDecoder, Shape::kPeaked,  Shape::kFlat,
                          Shape::kTies,    Shape::kSpecial, Shape::kPeaked};
  uint64_t seed = 100;
  for (Shape s : shapes) RunMatch(kVocab, s, ++seed, 64, &fast, &general);
  Report("vocab 248320, fast path", fast);
  Report("vocab 248320, general path", general);
}

TEST(SampleRows, MatchesCpuSamplerOddSizes) {
  Tally fast, general;
  const int sizes[] = {1, 2, 7, 31, 33, 255, 257, 1000, 1025, 4095, 4097, 5000, 70001, 262145};
  uint64_t seed = 500;
  for (int n : sizes) {
    for (Shape s : {Shape::kDecoder, Shape::kPeaked, Shape::kTies, Shape::kSpecial})
      RunMatch(n, s, ++seed, 24, &fast, &general);
  }
  Report("odd sizes, fast path", fast);
  Report("odd sizes, general path", general);
}

TEST(SampleRows, SkipRowsAndGreedyMatchArgmax) {
  const int n = 5000;
  std::vector<float> logits = MakeLogits(n, 9, Shape::kTies);
  std::vector<SampleRowParams> rows;
  std::vector<PenaltyPair> pairs;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  PackSampleRow(greedy, {}, n, 0.5, false, &rows, &pairs);
  PackSampleRow(greedy, {}, n, 0.5, true, &rows, &pairs);
  Dev<float> dl(n);
  dl.Up(logits);
  Dev<SampleRowParams> dp(rows.size());
  dp.Up(rows);
  Dev<PenaltyPair> dq(1);
  Dev<int32_t> out(2), am(1);
  ASSERT_OK(SampleRows(dl.p, 0, 2, n, dp.p, dq.p, out.p, nullptr));
  Dev<float> value(kArgmaxParts);
  Dev<int32_t> index(kArgmaxParts);
  Dev<uint32_t> tickets(1);
  DS_CUDA_CHECK(cudaMemset(tickets.p, 0, sizeof(uint32_t)));
  ASSERT_OK(ArgmaxSplitRows(dl.p, n, 1, n, ArgmaxScratch{value.p, index.p, tickets.p, 1}, am.p,
                            nullptr));
  const std::vector<int32_t> got = out.Down(2);
  EXPECT_EQ(got[0], am.Down(1)[0]);
  EXPECT_EQ(got[1], -1);
}

// The split argmax (a row over 32 blocks, the last one reducing) picks the CPU sampler's greedy
// token, hence SampleRows' greedy one: every shape (ties across slices, NaN, -inf, +inf), sizes
// from 1 to past the vocabulary, 1..64 rows, aligned and unaligned rows (ld = n + 1: the scalar
// path), all -inf / all NaN rows (token 0), and repeated launches on the same scratch (each must
// leave its tickets zero).
TEST(ArgmaxSplitRows, MatchesTheCpuSamplersGreedyToken) {
  constexpr int kMaxRows = 64;
  Dev<float> value(kMaxRows * kArgmaxParts);
  Dev<int32_t> index(kMaxRows * kArgmaxParts);
  Dev<uint32_t> tickets(kMaxRows);
  DS_CUDA_CHECK(cudaMemset(tickets.p, 0, kMaxRows * sizeof(uint32_t)));
  const ArgmaxScratch scratch{value.p, index.p, tickets.p, kMaxRows};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  int checked = 0;
  for (int n : {1, 3, 31, 128, 1000, 4097, 65536, kVocab, 262145}) {
    for (const int rows : {1, 4, 64}) {
      if (static_cast<int64_t>(rows) * n > 4 * kVocab) continue;
      for (int64_t ld : {static_cast<int64_t>(n), static_cast<int64_t>(n) + 1}) {
        std::vector<float> all(static_cast<size_t>(rows) * ld, 0.0f);
        std::vector<int32_t> want(rows);
        for (int r = 0; r < rows; ++r) {
          const Shape shape = static_cast<Shape>((r + n) % 5);
          std::vector<float> l = MakeLogits(n, 1000 * n + r, shape);
          if (r == 1) std::fill(l.begin(), l.end(), -INFINITY);
          if (r == 2) std::fill(l.begin(), l.end(), std::nanf(""));
          if (r == 3 && n > 64) {  // the same maximum in the first and the last slice
            l[n - 1] = 1e30f;
            l[5] = 1e30f;
          }
          std::copy(l.begin(), l.end(), all.begin() + r * ld);
          want[r] = Sampler(greedy).Sample(l, {}).token;
        }
        Dev<float> dl(all);
        Dev<int32_t> out(rows);
        for (int launch = 0; launch < 2; ++launch) {
          out.Poison();
          ASSERT_OK(ArgmaxSplitRows(dl.p, ld, rows, n, scratch, out.p, nullptr));
          EXPECT_EQ(out.Down(rows), want) << "n " << n << " rows " << rows << " ld " << ld
                                          << " launch " << launch;
        }
        checked += rows;
      }
    }
  }
  EXPECT_EQ(tickets.Down(kMaxRows), std::vector<uint32_t>(kMaxRows, 0u));
  EXPECT_GT(checked, 200);
  Dev<int32_t> out(1);
  EXPECT_FALSE(ArgmaxSplitRows(value.p, 1, kMaxRows + 1, 1, scratch, out.p, nullptr).ok());
}

// SampleRows' greedy rows and the split argmax agree on decoder-like rows of the full vocabulary.
TEST(ArgmaxSplitRows, EqualsSampleRowsGreedy) {
  constexpr int kRows = 8;
  std::vector<float> all;
  std::vector<SampleRowParams> rows;
  std::vector<PenaltyPair> pairs;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  for (int r = 0; r < kRows; ++r) {
    const std::vector<float> l = MakeLogits(kVocab, 77 + r, r % 2 ? Shape::kDecoder : Shape::kTies);
    all.insert(all.end(), l.begin(), l.end());
    PackSampleRow(greedy, {}, kVocab, 0.0, false, &rows, &pairs);
  }
  Dev<float> dl(all);
  Dev<SampleRowParams> dp(rows);
  Dev<PenaltyPair> dq(1);
  Dev<int32_t> sampled(kRows), split(kRows);
  Dev<float> value(kRows * kArgmaxParts);
  Dev<int32_t> index(kRows * kArgmaxParts);
  Dev<uint32_t> tickets(kRows);
  DS_CUDA_CHECK(cudaMemset(tickets.p, 0, kRows * sizeof(uint32_t)));
  ASSERT_OK(SampleRows(dl.p, kVocab, kRows, kVocab, dp.p, dq.p, sampled.p, nullptr));
  ASSERT_OK(ArgmaxSplitRows(dl.p, kVocab, kRows, kVocab,
                            ArgmaxScratch{value.p, index.p, tickets.p, kRows}, split.p, nullptr));
  EXPECT_EQ(split.Down(kRows), sampled.Down(kRows));
}

// Observed counts against expected probabilities: cells with expected count >= 5 alone, the rest
// merged; draws of probability-0 tokens are reported separately.
double ChiSquareMerged(const std::map<int32_t, int64_t>& counts,
                       const std::vector<std::pair<int32_t, double>>& dist, int64_t draws, int* dof,
                       int64_t* outside) {
  std::map<int32_t, double> p;
  for (const auto& [id, q] : dist) p[id] = q;
  *outside = 0;
  for (const auto& [id, c] : counts)
    if (!p.count(id)) *outside += c;
  double chi = 0, rest_e = 0;
  int64_t rest_o = 0;
  int cells = 0;
  for (const auto& [id, q] : p) {
    const double e = q * draws;
    const auto it = counts.find(id);
    const int64_t o = it == counts.end() ? 0 : it->second;
    if (e >= 5) {
      chi += (o - e) * (o - e) / e;
      ++cells;
    } else {
      rest_e += e;
      rest_o += o;
    }
  }
  if (rest_e >= 5) {
    chi += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
    ++cells;
  }
  *dof = std::max(cells - 1, 1);
  return chi;
}

TEST(SampleRows, ChiSquareAgainstCpuDistribution) {
  struct Cfg {
    const char* name;
    int n;
    Shape shape;
    SamplingParams p;
    bool history;
    int flags;
  };
  const std::vector<Cfg> cfgs = {
      {"T=1 full vocab", kVocab, Shape::kPeaked, {.temperature = 1.0f}, false, 0},
      {"T=1.3 decoder", 20000, Shape::kDecoder, {.temperature = 1.3f}, false, 0},
      {"T=0.8 top_k=50", kVocab, Shape::kDecoder, {.temperature = 0.8f, .top_k = 50}, false, 0},
      {"T=1 top_p=0.9", kVocab, Shape::kPeaked, {.temperature = 1.0f, .top_p = 0.9f}, false, 0},
      {"T=2 top_p=0.95 flat (general)",
       30000,
       Shape::kFlat,
       {.temperature = 2.0f, .top_p = 0.95f},
       false,
       0},
      {"T=0.7 min_p=0.01", kVocab, Shape::kPeaked, {.temperature = 0.7f, .min_p = 0.01f}, false, 0},
      {"T=1 top_k=2000 top_p=0.5 (general)",
       kVocab,
       Shape::kDecoder,
       {.temperature = 1.0f, .top_k = 2000, .top_p = 0.5f},
       false,
       0},
      {"penalties top_k=40 top_p=0.95",
       kVocab,
       Shape::kPeaked,
       {.temperature = 1.0f,
        .top_k = 40,
        .top_p = 0.95f,
        .repetition_penalty = 1.2f,
        .presence_penalty = 0.5f,
        .frequency_penalty = 0.2f},
       true,
       0},
      {"top_k=40 forced general",
       kVocab,
       Shape::kPeaked,
       {.temperature = 1.0f, .top_k = 40},
       false,
       kSampleForceGeneral},
  };
  constexpr int kRows = 8192, kLaunches = 16;
  constexpr int64_t kDraws = static_cast<int64_t>(kRows) * kLaunches;
  uint64_t seed = 900;
  for (const Cfg& cfg : cfgs) {
    const std::vector<float> logits = MakeLogits(cfg.n, ++seed, cfg.shape);
    Rng hr(seed);
    const std::vector<int32_t> hist =
        cfg.history ? RandomHistory(hr, logits) : std::vector<int32_t>{};
    Sampler ref(cfg.p);
    const auto dist = ref.Distribution(logits, hist);
    Dev<float> dl(logits.size());
    dl.Up(logits);
    Dev<SampleRowParams> dp(kRows);
    Dev<PenaltyPair> dq(std::max<size_t>(hist.size(), 1));
    Dev<int32_t> out(kRows);
    Rng urng(seed * 31);
    std::map<int32_t, int64_t> counts;
    for (int l = 0; l < kLaunches; ++l) {
      std::vector<SampleRowParams> rows;
      std::vector<PenaltyPair> pairs;
      // One row packed with the history, the others copy its pairs range (identical penalties).
      PackSampleRow(cfg.p, hist, cfg.n, 0.0, false, &rows, &pairs);
      for (int r = 1; r < kRows; ++r) rows.push_back(rows[0]);
      for (SampleRowParams& r : rows) r.uniform = urng.NextDouble();
      dp.Up(rows);
      dq.Up(pairs);
      ASSERT_OK(SampleRows(dl.p, 0, kRows, cfg.n, dp.p, dq.p, out.p, nullptr, cfg.flags));
      for (int32_t t : out.Down(kRows)) ++counts[t];
    }
    int dof = 0;
    int64_t outside = 0;
    const double chi = ChiSquareMerged(counts, dist, kDraws, &dof, &outside);
    const double crit = sampling::testing::ChiSquareCritical(dof);
    std::printf(
        "[ sampling ] chi-square %-36s support %7zu, dof %5d: chi2 %10.1f (critical %.1f)\n",
        cfg.name, dist.size(), dof, chi, crit);
    EXPECT_EQ(outside, 0) << cfg.name << ": draws outside the CPU distribution's support";
    EXPECT_LT(chi, crit) << cfg.name;
  }
}

// Benchmark, not a test (DISABLED_: ctest skips it; docs/conventions.md "Benchmarks"): kernel time
// per launch at vocabulary 248320 for 1 and 32 rows and, for comparison, the host path per row
// (device-to-host copy of the row + Sampler::Sample). Run it with
//   sampling_cuda_test --gtest_also_run_disabled_tests --gtest_filter='SampleRows.DISABLED_Timing*'
TEST(SampleRows, DISABLED_TimingVocab248320) {
  struct Cfg {
    const char* name;
    Shape shape;
    SamplingParams p;
    int flags;
  };
  const std::vector<Cfg> cfgs = {
      {"greedy (SampleRows)", Shape::kPeaked, {.temperature = 0.0f}, 0},
      {"T=1 full vocab", Shape::kPeaked, {.temperature = 1.0f}, 0},
      {"T=0.8 top_k=40", Shape::kPeaked, {.temperature = 0.8f, .top_k = 40}, 0},
      {"T=0.7 top_k=20 top_p=0.8",
       Shape::kPeaked,
       {.temperature = 0.7f, .top_k = 20, .top_p = 0.8f},
       0},
      {"T=1 top_p=0.95 peaked", Shape::kPeaked, {.temperature = 1.0f, .top_p = 0.95f}, 0},
      {"T=1 top_p=0.95 decoder (general)",
       Shape::kDecoder,
       {.temperature = 1.0f, .top_p = 0.95f},
       0},
      {"T=0.7 min_p=0.05", Shape::kPeaked, {.temperature = 0.7f, .min_p = 0.05f}, 0},
      {"top_k=40 + penalties(64)",
       Shape::kPeaked,
       {.temperature = 0.8f, .top_k = 40, .repetition_penalty = 1.1f, .presence_penalty = 0.3f},
       0},
      {"top_k=40 forced general",
       Shape::kPeaked,
       {.temperature = 0.8f, .top_k = 40},
       kSampleForceGeneral},
      {"top_k=2000 top_p=0.95 (general)",
       Shape::kDecoder,
       {.temperature = 1.0f, .top_k = 2000, .top_p = 0.95f},
       0},
  };
  constexpr int kMaxRows = 32, kIters = 30;
  cudaEvent_t e0, e1;
  DS_CUDA_CHECK(cudaEventCreate(&e0));
  DS_CUDA_CHECK(cudaEventCreate(&e1));
  Dev<float> dl(static_cast<size_t>(kMaxRows) * kVocab);
  Dev<SampleRowParams> dp(kMaxRows);
  Dev<PenaltyPair> dq(kMaxRows * 64);
  Dev<int32_t> out(kMaxRows);
  std::printf(
      "[ sampling ] timing, vocab %d: us per launch (1 row | 32 rows)  vs host path per row\n",
      kVocab);
  {
    std::vector<float> all;
    for (int r = 0; r < kMaxRows; ++r) {
      std::vector<float> l = MakeLogits(kVocab, 8000 + r, Shape::kPeaked);
      all.insert(all.end(), l.begin(), l.end());
    }
    dl.Up(all);
    Dev<float> value(kMaxRows * kArgmaxParts);
    Dev<int32_t> index(kMaxRows * kArgmaxParts);
    Dev<uint32_t> tickets(kMaxRows);
    DS_CUDA_CHECK(cudaMemset(tickets.p, 0, kMaxRows * sizeof(uint32_t)));
    const ArgmaxScratch scratch{value.p, index.p, tickets.p, kMaxRows};
    for (int rows : {1, 4, kMaxRows}) {
      Dev<int32_t> am(rows);
      DS_CUDA_CHECK(cudaEventRecord(e0));
      for (int it = 0; it < kIters; ++it)
        ASSERT_OK(ArgmaxSplitRows(dl.p, kVocab, rows, kVocab, scratch, am.p, nullptr));
      DS_CUDA_CHECK(cudaEventRecord(e1));
      DS_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      DS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      std::printf("[ sampling ]   %-36s %8.1f us (%d rows)\n", "ArgmaxSplitRows",
                  1e3 * ms / kIters, rows);
    }
  }
  // 32 rows of each shape, generated once.
  std::map<Shape, std::vector<float>> rows_of;
  for (Shape sh : {Shape::kPeaked, Shape::kDecoder}) {
    std::vector<float>& all = rows_of[sh];
    for (int r = 0; r < kMaxRows; ++r) {
      const std::vector<float> l = MakeLogits(kVocab, 8000 + r, sh);
      all.insert(all.end(), l.begin(), l.end());
    }
  }
  for (const Cfg& cfg : cfgs) {
    const std::vector<float>& all = rows_of.at(cfg.shape);
    dl.Up(all);
    Rng hr(5);
    const std::vector<int32_t> hist =
        RandomHistory(hr, std::vector<float>(all.begin(), all.begin() + kVocab));
    std::vector<SampleRowParams> rows;
    std::vector<PenaltyPair> pairs;
    Rng urng(77);
    for (int r = 0; r < kMaxRows; ++r)
      PackSampleRow(cfg.p, hist, kVocab, urng.NextDouble(), false, &rows, &pairs);
    dp.Up(rows);
    dq.Up(pairs);
    double us[2];
    int k = 0;
    for (int nrows : {1, kMaxRows}) {
      ASSERT_OK(SampleRows(dl.p, kVocab, nrows, kVocab, dp.p, dq.p, out.p, nullptr, cfg.flags));
      DS_CUDA_CHECK(cudaEventRecord(e0));
      for (int it = 0; it < kIters; ++it)
        ASSERT_OK(SampleRows(dl.p, kVocab, nrows, kVocab, dp.p, dq.p, out.p, nullptr, cfg.flags));
      DS_CUDA_CHECK(cudaEventRecord(e1));
      DS_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      DS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      us[k++] = 1e3 * ms / kIters;
    }
    // Host path for one row: pageable copy (as StepOutput::logits) and the CPU sampler.
    std::vector<float> host(kVocab);
    Sampler cpu(cfg.p);
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < 10; ++it) {
      DS_CUDA_CHECK(cudaMemcpy(host.data(), dl.p, sizeof(float) * kVocab, cudaMemcpyDeviceToHost));
      (void)cpu.Sample(host, hist);
    }
    const double host_us =
        1e6 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 10;
    std::printf("[ sampling ]   %-36s %8.1f us | %8.1f us   host %8.1f us/row\n", cfg.name, us[0],
                us[1], host_us);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace ds::cuda
