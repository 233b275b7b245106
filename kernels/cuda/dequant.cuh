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

// f16 keeps activations in range (issue #19): the portable path (sm_70, no bf16) multiplies f16
// operands in cuBLAS, and f16 ends at 65504, while the residual stream and the FFN's silu(g)*u of
// real models reach 1e4-1e6 on some tokens. out[i] = f16(x[i] * s) with s = 1 while
// max|x| <= kF16ScaleAbove (then bit-identical to ConvertF32ToHalf), else the power of two
// 2^-e that brings max|x| to <= kF16ScaleAbove (exact: only the exponent moves; elements below
// 2^-14 / s lose bits to f16's subnormals). Everything stays on the device, so the step stays
// graph-capturable and no host sync is added: scale[0] is the max |x| (as uint32 bits, a
// non-negative float orders like its bits), scale[1] = 1 / s, which the GEMM takes as its alpha
// (CublasGemm::Run's x_scale) to undo the scaling in the f32 output. Non-finite inputs keep s = 1
// (inf / NaN propagate as before). scale: [2] floats of device memory.
inline constexpr float kF16ScaleAbove = 32768.f;
absl::Status ConvertF32ToHalfScaled(const float* x, int64_t n, void* out, float* scale,
                                    cudaStream_t stream);

}  // namespace ds::cuda
