// Causal prefill attention on Hopper's warpgroup tensor cores (`wgmma`, sm_90a), flash style:
// the `AttnPrefillArgs::wgmma` path of AttnPrefill (attention.cuh). Internal to kernels/cuda:
// AttnPrefill gathers the slot's K into the f16 k_tmp ([L, n_kv*hd], as for the other paths) and
// its V transposed into v_tmp ([n_kv*hd, AttnPrefillVtRows(L)], zero past L), then launches this.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"
#include "kernels/cuda/attention.cuh"

namespace ds::cuda {

// Keys per tile of the kernel; the transposed V rows are padded to a multiple of it.
constexpr int kWgmmaKeys = 64;
__host__ __device__ inline int AttnPrefillVtRows(int L) {
  return (L + kWgmmaKeys - 1) / kWgmmaKeys * kWgmmaKeys;
}

// Shapes it runs: head_dim 64, 128 or 256, a GQA group of at most 64 query heads.
bool AttnPrefillWgmmaSupports(const AttnShape& s);

// Whether this build holds the sm_90a kernel and the current device runs it (compute capability
// 9.0): checked once per process by a probe kernel, since a build for other targets compiles the
// kernel's body to nothing.
bool AttnPrefillWgmmaAvailable();

absl::Status LaunchAttnPrefillWgmma(const AttnPrefillArgs& a, cudaStream_t stream);

}  // namespace ds::cuda
