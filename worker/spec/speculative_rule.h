// The acceptance rule of speculative decoding for one draft position (Leviathan et al. 2023,
// Chen et al. 2023): a draft token d drawn from the draft distribution q is kept with probability
// min(1, p(d) / q(d)) under the target distribution p; when it is rejected, the token is drawn
// from the residual max(0, p - q) renormalized. The kept-or-resampled token is then distributed
// exactly as p, so speculative sampling changes the speed, never the output distribution.
// Greedy decoding is the special case where p and q are point masses: keep d iff it is p's token.
//
// Distributions are the sampler's processed ones (sampling::Sampler::Distribution: penalties,
// top-k, temperature, top-p, min-p applied), as sparse (token, probability) lists.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace ds::spec {

using Distribution = std::vector<std::pair<int32_t, double>>;

// Draws a token from `dist` with one uniform u in [0, 1): the first token in ascending id order
// whose cumulative probability exceeds u (the sampler's canonical order).
int32_t DrawFrom(const Distribution& dist, double u);

struct Verdict {
  bool accepted = false;
  int32_t token = -1;  // the draft when accepted, else the token drawn from the residual
};

// Judges one draft. u_accept decides the acceptance, u_resample draws from the residual (used only
// on rejection). `scratch` is a caller-kept buffer of n_vocab doubles, all zero between calls.
Verdict JudgeDraft(const Distribution& p, const Distribution& q, int32_t draft, double u_accept,
                   double u_resample, std::vector<double>* scratch);

}  // namespace ds::spec
