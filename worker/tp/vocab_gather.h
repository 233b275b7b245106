// The vocab-parallel head's gather (docs/tp.md §4): every rank holds the logits of its own
// vocabulary rows; one all-gather gives every rank all of them, rank-major, and a strided copy
// per rank interleaves them into full rows. Used by the step runner for the model's logits and by
// the devices for the MTP head's (docs/tp.md §10), so the layout is written once.
#pragma once
#include <cstdint>
#include <functional>

#include "common/collective/collective.h"
#include "common/util/status.h"
#include "worker/tp/plan.h"

namespace ds::tp {

// dst[r * ld_dst + c] = src[r * ld_src + c] for r < rows, c < width, in the memory the
// collective works on (host for Gloo, the device's for the CUDA collectives).
using CopyColumnsFn = std::function<absl::Status(float* dst, int64_t ld_dst, const float* src,
                                                 int64_t ld_src, int64_t width, int64_t rows)>;

// local: this rank's [n_rows, V_rank]; gathered: room for [world][n_rows][V_r]; full:
// [n_rows, n_vocab]. The collective's contract applies (blocking; every rank calls it with the
// same n_rows).
absl::Status GatherVocabParallel(Collective& coll, const Plan& plan, int64_t n_vocab, int n_rows,
                                 const float* local, float* gathered, float* full,
                                 const CopyColumnsFn& copy_columns);

}  // namespace ds::tp
