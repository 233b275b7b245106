// Small element-wise ops of the forward pass.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

// out[i] = silu(gate[i]) * up[i], i < n (SwiGLU, spec §7). out may alias gate or up.
absl::Status SiluMul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// Attention output gate (spec §6.2 step 5): o[t, h*hd + d] *= sigmoid(qg[t, h*2*hd + hd + d]).
// o: [T, n_head*hd]; qg: [T, n_head*2*hd] (per head [query | gate]).
absl::Status SigmoidGateMul(float* o, const float* qg, int T, int n_head, int hd,
                            cudaStream_t stream);

}  // namespace ds::cuda
