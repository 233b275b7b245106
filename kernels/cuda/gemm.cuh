// Prefill matmul through cuBLAS: Y[T, M] = X[T, K] · W[M, K]ᵀ with 16-bit operands (weights
// dequantized by dequant.cuh) and fp32 accumulation and output.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

class CublasGemm {
 public:
  static absl::StatusOr<CublasGemm*> Create();  // caller owns
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // w: [M, K] 16-bit, x: [T, K] 16-bit (same kind, bf16 when `bf16`), y: [T, ldy] f32.
  // beta = 1 accumulates into y (residual add); beta = 0 overwrites.
  // x_scale (f16 only): x was scaled into f16's range by ConvertF32ToHalfScaled (dequant.cuh);
  // x_scale[1] (device memory) is its 1 / s, read by cuBLAS as alpha (device pointer mode), so
  // y = beta * y + (1 / s) * W (s x) without a host sync. beta must then be 0 or 1.
  absl::Status Run(const void* w, const void* x, float* y, int M, int K, int T, int64_t ldy,
                   bool bf16, float beta, cudaStream_t stream, const float* x_scale = nullptr);
  // Same product with f32 operands (F32 weights used in place: no dequant), fp32 compute.
  absl::Status RunF32(const float* w, const float* x, float* y, int M, int K, int T, int64_t ldy,
                      float beta, cudaStream_t stream);
  // Batched strided product for attention: for b < batch,
  //   C_b[m, n] = alpha * sum_k A_b[m, k] * B_b[n, k]  (all row-major views, "NT"), or with
  //   b_is_kn: C_b[m, n] = alpha * sum_k A_b[m, k] * B_b[k, n] ("NN").
  // A, B 16-bit (f16), C f32 or 16-bit per c_f32. Leading dimensions are row strides in elements.
  absl::Status BatchedF16(const void* A, int64_t lda, int64_t sA, const void* B, int64_t ldb,
                          int64_t sB, bool b_is_kn, void* C, int64_t ldc, int64_t sC, bool c_f32,
                          int M, int N, int K, int batch, float alpha, cudaStream_t stream);

 private:
  CublasGemm() = default;
  cublasHandle_t handle_ = nullptr;
  float* consts_ = nullptr;  // device {0, 1}: beta in device pointer mode
};

}  // namespace ds::cuda
