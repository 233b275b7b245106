// The chunked Gated DeltaNet prefill's sequential part (gdn_chunk.cuh, launch 2) on TF32 tensor
// cores, sm_80+: GdnPrefillArgs::scan_mma. The f32 form there spends ~0.9 TFLOP of CUDA-core
// multiply-adds on an 8,192-token 27B prefill in a loop whose every chunk also waits on its global
// loads; this one runs the three products as 3xTF32 mma (mma_tf32.cuh: f32 accuracy) and copies
// the next chunk's operands while the current one computes. The prep (launch 1) is shared.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/gdn.cuh"

namespace ds::cuda::gdn_chunk {

// Launches the scan after GdnChunkPrep for k_dim DK (32, 64 or 128) and the state's storage
// type TS (float or __nv_bfloat16; gdn_chunk.cu has dispatched both). Returns false where it
// cannot run (the device lacks its ~217 KB of shared memory at dk = 128, or dv % 4 != 0): the
// caller runs the f32 scan instead. The caller checks the architecture (sm_80+).
template <int DK, typename TS>
bool LaunchScanMma(const GdnPrefillArgs& a, cudaStream_t stream);

}  // namespace ds::cuda::gdn_chunk
