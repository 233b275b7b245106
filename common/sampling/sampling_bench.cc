// Micro-benchmark of Sampler::Sample over a Qwen3.5-sized vocabulary (248320 logits).
// Logits mimic a decoder: a Gaussian bulk plus a handful of strong candidates.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "common/sampling/rng.h"
#include "common/sampling/sampler.h"

namespace ds::sampling {
namespace {

constexpr int kVocab = 248320;

std::vector<float> MakeLogits(uint64_t seed, float spread) {
  Rng rng(seed);
  std::vector<float> logits(kVocab);
  for (float& l : logits) {
    // Irwin-Hall(4) approximates a normal without std:: distributions.
    double s = 0;
    for (int k = 0; k < 4; ++k) s += rng.NextDouble();
    l = static_cast<float>((s - 2.0) * 1.732 * spread);
  }
  for (int k = 0; k < 16; ++k) logits[rng.Next() % kVocab] += 12.0f - 0.5f * k;
  return logits;
}

void Run(benchmark::State& state, SamplingParams params, float spread) {
  const std::vector<float> logits = MakeLogits(1, spread);
  std::vector<int32_t> history;
  Rng rng(2);
  for (int i = 0; i < 512; ++i) history.push_back(static_cast<int32_t>(rng.Next() % kVocab));
  Sampler sampler(params);
  for (auto _ : state) {
    SampleResult r = sampler.Sample(logits, history);
    benchmark::DoNotOptimize(r);
  }
}

void BM_Greedy(benchmark::State& s) { Run(s, {.temperature = 0.0f}, 2.0f); }
void BM_Full(benchmark::State& s) { Run(s, {.temperature = 1.0f}, 2.0f); }
void BM_TopK40(benchmark::State& s) { Run(s, {.temperature = 0.7f, .top_k = 40}, 2.0f); }
void BM_TopP095(benchmark::State& s) { Run(s, {.temperature = 0.7f, .top_p = 0.95f}, 2.0f); }
// A flat distribution: the nucleus spans most of the vocabulary (worst case for top-p).
void BM_TopP095Flat(benchmark::State& s) { Run(s, {.temperature = 1.0f, .top_p = 0.95f}, 0.1f); }
void BM_MinP(benchmark::State& s) { Run(s, {.temperature = 0.7f, .min_p = 0.05f}, 2.0f); }
void BM_TopK40Penalties(benchmark::State& s) {
  Run(s,
      {.temperature = 0.7f,
       .top_k = 40,
       .repetition_penalty = 1.1f,
       .presence_penalty = 0.5f,
       .frequency_penalty = 0.5f,
       .penalty_last_n = -1,
       .n_logprobs = 5},
      2.0f);
}

BENCHMARK(BM_Greedy)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Full)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopK40)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopP095)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopP095Flat)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MinP)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopK40Penalties)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace ds::sampling

BENCHMARK_MAIN();
