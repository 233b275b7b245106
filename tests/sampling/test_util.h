// Double-precision references and statistics helpers for the sampling tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace ds::sampling::testing {

// softmax(logits / t) in double.
inline std::vector<double> SoftmaxD(const std::vector<float>& logits, double t = 1.0) {
  double m = -INFINITY;
  for (float l : logits) m = std::max(m, static_cast<double>(l) / t);
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp(logits[i] / t - m);
  for (double& v : p) v /= z;
  return p;
}

inline std::vector<double> LogSoftmaxD(const std::vector<float>& logits) {
  double m = -INFINITY;
  for (float l : logits) m = std::max(m, static_cast<double>(l));
  double z = 0;
  for (float l : logits) z += std::exp(l - m);
  std::vector<double> out;
  for (float l : logits) out.push_back(l - m - std::log(z));
  return out;
}

// Renormalize p restricted to `keep` (others 0).
inline std::vector<double> Restrict(const std::vector<double>& p, const std::vector<int>& keep) {
  std::vector<double> q(p.size(), 0.0);
  double z = 0;
  for (int k : keep) z += p[k];
  for (int k : keep) q[k] = p[k] / z;
  return q;
}

// Pearson chi-square of observed counts against expected probabilities over the cells with
// expected > 0; `*outside` receives the count drawn where the expected probability is 0.
inline double ChiSquare(const std::vector<int64_t>& counts, const std::vector<double>& p,
                        int64_t* outside = nullptr, int* dof = nullptr) {
  const int64_t n = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  double chi = 0;
  int64_t out = 0;
  int cells = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      out += counts[i];
      continue;
    }
    const double e = p[i] * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  if (outside) *outside = out;
  if (dof) *dof = cells - 1;
  return chi;
}

// Upper chi-square quantile at significance 1e-4 (z = 3.719) by the Wilson-Hilferty cube
// approximation; accurate to a few percent for dof >= 1, which is ample for a pass/fail bound.
inline double ChiSquareCritical(int dof) {
  const double k = dof, z = 3.719;
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

}  // namespace ds::sampling::testing
