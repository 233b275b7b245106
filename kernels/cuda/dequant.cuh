// Whole-matrix dequantization to a 16-bit copy (bf16 on sm_80+, f16 on sm_70/75) for the cuBLAS
// prefill path, and f32 -> 16-bit activation conversion.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"

namespace ds::cuda {

// out: [rows, K] 16-bit (bf16 when `bf16`, else f16), row-major; w: `rows` GGUF rows of K elements.
absl::Status DequantizeRows(GgmlType type, const void* w, int64_t rows, int K, void* out, bool bf16,
                            cudaStream_t stream);

// out[i] = half(x[i]) for i < n.
absl::Status ConvertF32ToHalf(const float* x, int64_t n, void* out, bool bf16, cudaStream_t stream);

}  // namespace ds::cuda
