// The chunked (WY) form of the Gated DeltaNet prefill (spec §5.4), internal to gdn.cu's
// GdnPrefill. Two launches:
//
//   1. GdnChunkPrep, one block per (chunk of 32 tokens, value head), all in parallel: the
//      chunk's cumulative gates γ (written over g), A_rs = β_r (k_r·k_s) e^{γ_r-γ_s} (s < r),
//      T = (I + A)^-1 (unit lower triangular, by forward substitution), and from them
//        W = T diag(β e^γ) K   -> scratch      P = (Q Kᵀ ⊙ D) (s <= r) -> scratch
//        U = T diag(β) V       -> written over V in y
//   2. GdnChunkScan, one block per (value head, 32 state columns), chunks in order, the state
//      block in registers and shared memory:
//        V' = U - W S      O = diag(e^γ) Q S + P V'      S <- e^{γ_L} S + Σ_r e^{γ_L-γ_r} k_r V'_rᵀ
//
// Everything that does not depend on S (the 32-step triangular solve, the 32x32 products) moves
// out of the sequential loop, which keeps three small matrix products per chunk, register-tiled
// (8 rows x 1 column per thread, 16-byte shared-memory operands). fp32 throughout.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gdn.cuh"

namespace ds::cuda::gdn_chunk {

// Scratch floats of one (chunk, value head): W [32][dk], then P [32][32].
constexpr int64_t ScratchFloatsPerChunkHead(int dk) {
  return static_cast<int64_t>(kGdnChunk) * dk + kGdnChunk * kGdnChunk;
}

// Launches both kernels for a.T >= 1 tokens; a.y holds the conv output with q / k normalised,
// a.g / a.beta the gates (GdnPrep). Returns false when the device lacks the scan's shared memory
// (the caller falls back to the recurrence).
bool Launch(const GdnPrefillArgs& a, cudaStream_t stream);

}  // namespace ds::cuda::gdn_chunk
