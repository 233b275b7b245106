// Split-K decode attention on f16 tensor cores (sm_80+), the `AttnDecodeArgs::tensor_cores`
// path of AttnDecode (attention.cuh). Internal to kernels/cuda: AttnDecode checks the shape,
// launches this for the partials and runs the shared combine.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/attention.cuh"

namespace ds::cuda {

// Shapes it runs: head_dim 32, 64, 128 or 256, a GQA group of at most 8 query heads.
bool AttnDecodeMmaSupports(const AttnShape& s);

// Writes the partials (acc, max, sum) of every (sequence, head, split) that AttnCombineKernel
// merges, in the layout of the SIMT kernel. Grid (n_kv, n_splits, n_seqs).
void LaunchAttnDecodeMma(const AttnDecodeArgs& a, cudaStream_t stream);

}  // namespace ds::cuda
