// cuBLAS wrappers (see gemm.cuh). Row-major [T, M] outputs are cuBLAS column-major [M, T]:
// Yᵀ = W · Xᵀ, i.e. op(A) = Wᵀ-of-column-major (CUBLAS_OP_T on the [K, M] column-major view).
#include "kernels/cuda/gemm.cuh"

#include "kernels/cuda/common.cuh"

namespace ds::cuda {

static absl::Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLAS ", what, " failed with status ", static_cast<int>(s)));
}

absl::StatusOr<CublasGemm*> CublasGemm::Create() {
  auto* g = new CublasGemm();
  absl::Status st = CublasStatus(cublasCreate(&g->handle_), "cublasCreate");
  if (!st.ok()) {
    delete g;
    return st;
  }
  const float c[2] = {0.f, 1.f};
  if (cudaMalloc(&g->consts_, sizeof c) != cudaSuccess ||
      cudaMemcpy(g->consts_, c, sizeof c, cudaMemcpyHostToDevice) != cudaSuccess) {
    delete g;
    return absl::InternalError("CublasGemm: cannot allocate its 8 bytes of constants");
  }
  return g;
}

CublasGemm::~CublasGemm() {
  if (handle_) cublasDestroy(handle_);
  if (consts_) cudaFree(consts_);
}

absl::Status CublasGemm::Run(const void* w, const void* x, float* y, int M, int K, int T,
                             int64_t ldy, bool bf16, float beta, cudaStream_t stream,
                             const float* x_scale) {
  DS_RETURN_IF_ERROR(CublasStatus(cublasSetStream(handle_, stream), "cublasSetStream"));
  const cudaDataType_t dt = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  if (x_scale) {
    if (bf16 || (beta != 0.f && beta != 1.f))
      return absl::InvalidArgumentError("CublasGemm::Run: x_scale needs f16 operands and beta 0 or 1");
    // alpha = 1 / s and beta from device memory; the handle goes back to host pointers after.
    DS_RETURN_IF_ERROR(CublasStatus(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_DEVICE),
                                    "cublasSetPointerMode"));
    const cublasStatus_t s = cublasGemmEx(
        handle_, CUBLAS_OP_T, CUBLAS_OP_N, M, T, K, x_scale + 1, w, dt, K, x, dt, K,
        consts_ + (beta == 1.f ? 1 : 0), y, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    DS_RETURN_IF_ERROR(CublasStatus(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST),
                                    "cublasSetPointerMode"));
    return CublasStatus(s, "cublasGemmEx(scaled f16)");
  }
  const float alpha = 1.f;
  // C (col-major M x T, ld = ldy) = op(A) (M x K) * B (K x T); A is W viewed col-major [K, M].
  return CublasStatus(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, M, T, K, &alpha, w, dt, K, x,
                                   dt, K, &beta, y, CUDA_R_32F, static_cast<int>(ldy),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx");
}

absl::Status CublasGemm::RunF32(const float* w, const float* x, float* y, int M, int K, int T,
                                int64_t ldy, float beta, cudaStream_t stream) {
  DS_RETURN_IF_ERROR(CublasStatus(cublasSetStream(handle_, stream), "cublasSetStream"));
  const float alpha = 1.f;
  // CUBLAS_COMPUTE_32F without the TF32 math mode: true fp32 products (F32 models are checked
  // against the CPU reference at 2e-3 relative; bf16/tf32 operands would not meet that).
  return CublasStatus(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, M, T, K, &alpha, w,
                                   CUDA_R_32F, K, x, CUDA_R_32F, K, &beta, y, CUDA_R_32F,
                                   static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx(f32)");
}

absl::Status CublasGemm::BatchedF16(const void* A, int64_t lda, int64_t sA, const void* B,
                                    int64_t ldb, int64_t sB, bool b_is_kn, void* C, int64_t ldc,
                                    int64_t sC, bool c_f32, int M, int N, int K, int batch,
                                    float alpha, cudaStream_t stream) {
  DS_RETURN_IF_ERROR(CublasStatus(cublasSetStream(handle_, stream), "cublasSetStream"));
  const float beta = 0.f;
  // Row-major C[M, N] = A[M, K] · op(B) is column-major Cᵀ[N, M] = op(B)ᵀ · Aᵀ:
  // first operand is B (col-major view [K, N] when B is row-major [N, K] -> OP_T; when B is
  // row-major [K, N] its col-major view is [N, K] -> OP_N), second is A (col-major [K, M], OP_N).
  return CublasStatus(
      cublasGemmStridedBatchedEx(handle_, b_is_kn ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, N, M, K,
                                 &alpha, B, CUDA_R_16F, static_cast<int>(ldb), sB, A, CUDA_R_16F,
                                 static_cast<int>(lda), sA, &beta, C,
                                 c_f32 ? CUDA_R_32F : CUDA_R_16F, static_cast<int>(ldc), sC, batch,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
}

}  // namespace ds::cuda
