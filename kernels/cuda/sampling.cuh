// GPU-side token selection so logits need not cross PCIe. Greedy (argmax) is one kernel.
// TODO(sampler): temperature / top-k / top-p / min-p / penalties on the GPU are not written yet;
// non-greedy sampling currently copies logits to the host.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

// out[r] = argmax_j logits[r * ld + j] over j < n (lowest index on ties, NaN ignored).
absl::Status ArgmaxRows(const float* logits, int64_t ld, int rows, int n, int32_t* out,
                        cudaStream_t stream);

}  // namespace ds::cuda
