#include "worker/spec/speculative_rule.h"

#include <algorithm>

namespace ds::spec {
namespace {

double ProbabilityOf(const Distribution& d, int32_t token) {
  for (const auto& [id, p] : d)
    if (id == token) return p;
  return 0.0;
}

// Ascending-id order of a sparse list (the canonical draw order).
Distribution ById(Distribution d) {
  std::sort(d.begin(), d.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return d;
}

}  // namespace

int32_t DrawFrom(const Distribution& dist, double u) {
  if (dist.empty()) return -1;
  const Distribution sorted = ById(dist);
  double total = 0;
  for (const auto& e : sorted) total += e.second;
  const double target = u * total;
  double acc = 0;
  for (const auto& [id, p] : sorted) {
    acc += p;
    if (acc > target) return id;
  }
  // Rounding left u * total at the very end: the last token with weight.
  for (auto it = sorted.rbegin(); it != sorted.rend(); ++it)
    if (it->second > 0) return it->first;
  return sorted.back().first;
}

Verdict JudgeDraft(const Distribution& p, const Distribution& q, int32_t draft, double u_accept,
                   double u_resample, std::vector<double>* scratch) {
  const double pd = ProbabilityOf(p, draft);
  const double qd = ProbabilityOf(q, draft);
  // q(d) > 0 always holds for a draft drawn from q; a zero means the draft came from elsewhere
  // (a greedy draft judged by a sampling target): accept iff p gives it all the mass it can.
  const double ratio = qd > 0 ? pd / qd : (pd > 0 ? 1.0 : 0.0);
  if (u_accept < std::min(1.0, ratio)) return {true, draft};
  // Residual max(0, p - q): dense over the tokens either list names, in ascending id order.
  std::vector<double>& dense = *scratch;
  for (const auto& [id, pr] : p) dense[id] += pr;
  for (const auto& [id, qr] : q) dense[id] -= qr;
  Distribution residual;
  for (const auto& [id, pr] : p) {
    if (dense[id] > 0) residual.push_back({id, dense[id]});
    dense[id] = 0;
  }
  for (const auto& [id, qr] : q) dense[id] = 0;
  // p == q up to rounding: the residual is empty; p itself is the right fallback.
  return {false, DrawFrom(residual.empty() ? p : residual, u_resample)};
}

}  // namespace ds::spec
