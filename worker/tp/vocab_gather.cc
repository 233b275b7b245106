#include "worker/tp/vocab_gather.h"

#include <vector>

namespace ds::tp {

absl::Status GatherVocabParallel(Collective& coll, const Plan& plan, int64_t n_vocab, int n_rows,
                                 const float* local, float* gathered, float* full,
                                 const CopyColumnsFn& copy_columns) {
  std::vector<size_t> counts(plan.world);
  for (int r = 0; r < plan.world; ++r)
    counts[r] = static_cast<size_t>(n_rows) * plan.ranks[r].vocab.size();
  DS_RETURN_IF_ERROR(coll.AllGatherV(local, counts, gathered));
  // [r][n][V_r] rank-major -> [n][V]: rank r's block is an n x V_r matrix that lands in columns
  // [v0_r, v1_r) of every row.
  const float* src = gathered;
  for (int r = 0; r < plan.world; ++r) {
    const Range v = plan.ranks[r].vocab;
    if (v.size() > 0)
      DS_RETURN_IF_ERROR(copy_columns(full + v.begin, n_vocab, src, v.size(), v.size(), n_rows));
    src += static_cast<int64_t>(n_rows) * v.size();
  }
  return absl::OkStatus();
}

}  // namespace ds::tp
