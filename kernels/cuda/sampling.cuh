// GPU-side token selection so logits need not cross PCIe (plain greedy rows: argmax.cuh).
//   SampleRows: the CPU sampler's pipeline (common/sampling/sampler.h: penalties, temperature,
//     top-k, top-p, min-p, one draw) on logits already on the device. Given the uniform the CPU
//     sampler would draw for that position, the token equals the CPU sampler's up to
//     floating-point summation order (see "Sampling v2" in kernels/cuda/README.md).
// Top-n logprobs are not computed here: rows that ask for them keep the host path.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#if __cplusplus >= 202002L  // not in the C++17 sm_70 check (CUDA 11.8): tools/test.sh
#include <span>
#endif
#include <vector>

#include "common/sampling/sampling_params.h"
#include "common/util/status.h"

namespace ds::cuda {

enum SampleMode : int32_t {
  kSampleSkip = 0,    // out[r] = -1, the row is not read
  kSampleGreedy = 1,  // argmax of the penalized logits (temperature 0), lowest id on ties
  kSampleDraw = 2,    // the full pipeline with `uniform`
};

// One row of SampleRows, built on the host by PackSampleRow (plain data, copied to the device).
struct SampleRowParams {
  int32_t mode = kSampleSkip;
  int32_t top_k = 0;                // active when 0 < top_k < n
  float inv_temp = 1.0f;            // min(1 / temperature, FLT_MAX), as the CPU sampler computes it
  float top_p = 1.0f;               // active when < 1
  float min_p = 0.0f;               // clamped to [0, 1]; active when > 0
  float repetition_penalty = 1.0f;  // 1 = off (also what an invalid value <= 0 becomes)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t pen_begin = 0;  // this row's pairs: [pen_begin, pen_begin + pen_count)
  int32_t pen_count = 0;
  double uniform = 0.0;  // [0, 1): the draw
};

// A token of the penalty window and its number of occurrences there. A row's pairs are sorted by
// token (the kernel walks them alongside the vocabulary).
struct PenaltyPair {
  int32_t token;
  int32_t count;
};

// Appends the row for `params` to `rows` and its penalty window (the last penalty_last_n tokens
// of `history`, ids outside [0, n_vocab) dropped, exactly as Sampler::Sample applies it) to
// `pairs`. `uniform` is what Sampler::UniformAt(history.size()) returns for this call; it is ignored when the
// row is greedy (temperature 0), for which the CPU sampler draws nothing. skip = true appends a
// kSampleSkip row.
#if __cplusplus >= 202002L
void PackSampleRow(const sampling::SamplingParams& params, std::span<const int32_t> history,
                   int n_vocab, double uniform, bool skip, std::vector<SampleRowParams>* rows,
                   std::vector<PenaltyPair>* pairs);
#endif

// Flags for SampleRows.
inline constexpr int kSampleForceGeneral = 1;  // tests: skip the candidate fast path

// out[r] = the token of row r of logits ([rows, ld], row r at logits + r * ld; ld may be 0 for
// rows that share one row of logits). params: [rows] and pairs: [sum of pen_count] on the device.
// One 1024-thread block per row; the logits are only read. Capturable in a CUDA graph (no host
// synchronization, no allocation). n must be in [1, 2^28).
absl::Status SampleRows(const float* logits, int64_t ld, int rows, int n,
                        const SampleRowParams* params, const PenaltyPair* pairs, int32_t* out,
                        cudaStream_t stream, int flags = 0);

}  // namespace ds::cuda
