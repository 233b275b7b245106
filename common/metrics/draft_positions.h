// How one MTP verify counts toward acceptance by draft position (issue #15), the one rule behind
// the worker's SpecStats (Prometheus, bench) and the scheduler's per-request Finished timings: a
// verify that offered `offered` drafts and kept the first `kept` judged the positions below
// min(offered, kept + 1) (every draft before them was kept) and accepted those below `kept`.
// Acceptance at a position = accepted / judged.
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

namespace ds::metrics {

template <typename Count>
void CountDraftPositions(int offered, int kept, std::vector<Count>& judged,
                         std::vector<Count>& accepted) {
  const int n = std::min(offered, kept + 1);
  if (n <= 0) return;
  if (judged.size() < static_cast<size_t>(n)) judged.resize(static_cast<size_t>(n), 0);
  if (accepted.size() < judged.size()) accepted.resize(judged.size(), 0);
  for (int j = 0; j < n; ++j) ++judged[static_cast<size_t>(j)];
  for (int j = 0; j < kept; ++j) ++accepted[static_cast<size_t>(j)];
}

}  // namespace ds::metrics
