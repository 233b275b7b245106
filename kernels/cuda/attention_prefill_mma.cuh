// Causal prefill attention on f16 tensor cores (sm_80+), flash style: the
// `AttnPrefillArgs::tensor_cores` path of AttnPrefill (attention.cuh). Internal to kernels/cuda:
// AttnPrefill gathers the slot's K/V into the f16 k_tmp / v_tmp and then launches this instead of
// the cuBLAS chunks (no scores / probabilities scratch is touched).
#pragma once
#include <cuda_runtime.h>

#include "common/util/status.h"
#include "kernels/cuda/attention.cuh"

namespace ds::cuda {

// Shapes it runs: head_dim 64, 128 or 256, a GQA group of at most 8 query heads.
bool AttnPrefillMmaSupports(const AttnShape& s);

// The gated attention output of the T queries (out), from q16, the gathered k_tmp / v_tmp and
// the gates in qg.
absl::Status LaunchAttnPrefillMma(const AttnPrefillArgs& a, cudaStream_t stream);

}  // namespace ds::cuda
