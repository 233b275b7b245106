// Token sampling for one sequence.
//
// Sample() applies, in this order (the llama.cpp / vLLM order):
//   1. penalties on the logits of tokens in the last `penalty_last_n` history tokens:
//      repetition: logit > 0 ? logit / repetition_penalty : logit * repetition_penalty, then
//      logit -= count * frequency_penalty + presence_penalty (count = occurrences in the window);
//   2. temperature == 0: greedy argmax of the penalized logits, ties to the lowest token id
//      (top-k/top-p/min-p cannot change an argmax, and no uniform is used);
//   3. top-k: keep the k largest penalized logits (ties to the lowest id);
//   4. temperature: logit / temperature;
//   5. softmax over the kept tokens;
//   6. top-p: keep the shortest prefix of tokens sorted by probability (descending, ties to the
//      lowest id) whose cumulative probability is >= top_p (always at least one token);
//   7. min-p: drop tokens whose probability is < min_p * (largest probability);
//   8. draw one token from the renormalized result with one uniform double u: the first token, in
//      ascending id order, whose cumulative weight exceeds u * (total weight). The order is
//      canonical (the same for every filter path) so that a device sampler given the same u picks
//      the same token (kernels/cuda/sampling.cuh). u is keyed by (seed, position of the token
//      being sampled = history.size()): UniformAt. So the token at a position does not depend on
//      how many draws came before it: a replay after failover, a speculative verify (which samples
//      each row and keeps drafts while they match, worker/spec/speculative_rule.h) and plain
//      decoding give the same stream for a seed.
//
// SampleResult::logprob is the log-softmax of the chosen token under the model's *unmodified*
// distribution (raw logits: no penalties, temperature or truncation), as the OpenAI API reports
// it; top_logprobs are the n_logprobs most likely tokens of that same unmodified distribution,
// most likely first, ties to the lowest id.
//
// Cost for a vocabulary V: a few vectorized O(V) passes (copy+max, exp-sum for the raw
// log-normalizer, exp for the weights); top-k is a buffered threshold selection (O(V), no sort of
// the vocabulary); top-p without top-k is a radix select on the weights' float bits: a mass
// histogram (8 bins per octave) finds the bin where the nucleus ends, tokens above it are kept
// unsorted, and only the boundary bin is refined and sorted. Measured on one loaded core
// (sampling_bench, CPU time): greedy ~0.24 ms, top-k 40 ~0.27 ms, top-p 0.95 ~0.73 ms per call.
//
// Degenerate input: NaN logits are treated as -inf and +inf as FLT_MAX; if every logit is -inf
// the distribution is undefined and token 0 is returned with logprob -inf. History ids outside
// [0, V) are ignored. An empty logits span yields token -1.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sampling/rng.h"
#include "common/sampling/sampling_params.h"

namespace ds::sampling {

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;  // log p(token) under the unmodified distribution (see top of file)
  std::vector<std::pair<int32_t, float>> top_logprobs;  // [min(n_logprobs, V)], most likely first
};

class Sampler {
 public:
  // `params` should have passed Validate(); out-of-range values are clamped, never a crash.
  explicit Sampler(SamplingParams params);
  // Validates first.
  static absl::StatusOr<Sampler> Create(SamplingParams params, int n_vocab);

  // logits: [V] for the next position; history: prompt + generated tokens so far, oldest first.
  SampleResult Sample(std::span<const float> logits, std::span<const int32_t> history);

  // The distribution step 8 draws from: (token, probability) for every token with non-zero
  // probability, most likely first (ties to the lowest id); probabilities sum to 1. For greedy it
  // is the argmax with probability 1. Used by tests (statistics of the draw).
  std::vector<std::pair<int32_t, double>> Distribution(std::span<const float> logits,
                                                       std::span<const int32_t> history);

  const SamplingParams& params() const { return params_; }

  // The uniform Sample() draws for the token at `position` (its history's length), for a device
  // sampler given the logits. Greedy calls (temperature 0) use none.
  double UniformAt(size_t position) const {
    return sampling::UniformAt(params_.seed, static_cast<uint64_t>(position));
  }

  // Sample()'s token with the uniform u instead of UniformAt(history.size()): a device sampler's
  // row, which draws with the uniform of its own position (DeviceSampleRow::uniform) whatever the
  // history it is given (the rows of a speculative verify share one).
  int32_t TokenWith(std::span<const float> logits, std::span<const int32_t> history, double u);

  // The token a temperature-0 Sample() would return under these penalties (argmax of the
  // penalized logits, lowest id on ties), whatever the temperature: a speculative draft.
  int32_t Argmax(std::span<const float> logits, std::span<const int32_t> history);

 private:
  struct Candidate {
    float v;  // logit, then weight exp((logit - max) / T)
    int32_t id;
  };

  // Copies the sanitized logits into work_; returns their max.
  float Load(std::span<const float> logits);
  // Steps 1-7. Returns the greedy token, or -1 with the distribution left in either cand_
  // (explicit_ = true; weights, total_) or work_ + block_sums_ (the whole vocabulary; total_).
  int32_t Filter(float raw_max, std::span<const int32_t> history);
  bool ApplyPenalties(std::span<const int32_t> history);
  void TopPFullVocab();
  void FinishExplicit(bool apply_top_p);
  int32_t Draw(double u) const;
  void SortCandidatesById();
  static void SelectTopK(const float* x, size_t n, size_t k, std::vector<Candidate>& out);
  static bool Better(const Candidate& a, const Candidate& b) {
    return a.v > b.v || (a.v == b.v && a.id < b.id);
  }

  SamplingParams params_;
  std::vector<float> work_;          // [V] sanitized logits -> penalized logits -> weights
  std::vector<int32_t> counts_;      // [V] zero between calls; penalty occurrence counts
  std::vector<double> block_sums_;   // [ceil(V / kSumBlock)] weight sums (whole-vocab mode)
  std::vector<double> hist_;         // [4, 1040] top-p weight-mass histograms (padded copies)
  std::vector<Candidate> cand_;      // [<= V] explicit candidates
  std::vector<Candidate> boundary_;  // [<= V] top-p: tokens of the bin where the nucleus ends
  std::vector<int32_t> idx_;         // [<= V] token ids passing a weight threshold
  std::vector<Candidate> lp_cand_;   // [<= kMaxLogprobs] raw top logprobs
  std::vector<float> dense_;         // [V] all zero between calls; large id sorts
  bool explicit_ = false;
  double total_ = 0.0;  // sum of the weights the draw sees
};

}  // namespace ds::sampling
