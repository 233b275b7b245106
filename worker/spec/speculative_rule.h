// The acceptance rule of speculative decoding: the standard rule (Leviathan et al. 2023, Chen et
// al. 2023) for deterministic drafts, realized by coupling each draft with the token the target
// samples at its row.
//
// Drafts are the MTP head's most likely tokens (argmax after the request's penalties), as vLLM's
// EAGLE / MTP proposer drafts: the draft distribution q is a point mass at the draft
// d. The standard rule then keeps d with probability min(1, p(d) / q(d)) = p(d) and, on
// rejection, draws from the residual max(0, p - q) renormalized, which is p conditioned on "not
// d". Here every verify row is sampled with the sequence's own sampler — the uniform of that
// row's position (sampling::UniformAt), so y is the token plain sampling draws there — and d is
// kept iff y == d:
//   P(keep) = P(y == d) = p(d);   given y != d, y is distributed as p(. | not d).
// That is the standard rule, in distribution; and since the emitted token at every position is
// the one plain sampling draws there, a seeded stream is the same with MTP on or off, at any k,
// and after a replay (failover) that starts its draft cycles elsewhere. Greedy requests are the
// case temperature 0 (y is the argmax). tests/spec/speculative_rule_test.cc checks both facts.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace ds::spec {

// Appends to *tokens the drafts kept and the target's token after them (1 .. drafts + 1 tokens);
// returns how many drafts were kept. row_token(i) is the target's token at verify row i (row i
// follows the first i drafts); it is called for i = 0, 1, ... until a draft differs, after the
// tokens before row i were appended (a sampler reads them as its history).
template <typename RowToken>
int KeepMatchingDrafts(std::span<const int32_t> drafts, RowToken&& row_token,
                       std::vector<int32_t>* tokens) {
  int kept = 0;
  for (const int32_t d : drafts) {
    const int32_t y = row_token(kept);
    tokens->push_back(y);
    if (y != d) return kept;
    ++kept;
  }
  tokens->push_back(row_token(kept));
  return kept;
}

}  // namespace ds::spec
