// Block-scaled FP8 prefill matmul (gemm_fp8.cuh): the two quantizers and the cuBLASLt product.
#include "kernels/cuda/gemm_fp8.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/common.cuh"

namespace ds::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32ull << 20;  // what cuBLASLt's Hopper kernels ask at most

// Block-scaled FP8 products came with cuBLAS 12.9; older toolkits (the sm_70 build's CUDA 11.8)
// compile the quantizers only, and Fp8Gemm::Create says why it is not there.
#if CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 9)
#define DS_LT_BLOCK_SCALES 1
#else
#define DS_LT_BLOCK_SCALES 0
#endif

__device__ __forceinline__ uint32_t E4M3(float v) {
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// One warp per (token, 128-block): 4 values per lane.
__global__ void QuantizeTokensFp8Kernel(const float* __restrict__ x, int64_t tokens, int K,
                                        uint8_t* __restrict__ q, float* __restrict__ scale,
                                        int64_t ld_scale) {
  const int nb = K / kFp8Block;
  const int64_t unit = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (unit >= tokens * nb) return;
  const int64_t t = unit / nb;
  const int b = static_cast<int>(unit % nb);
  const int64_t off = t * K + static_cast<int64_t>(b) * kFp8Block + 4 * lane;
  const float4 v = *reinterpret_cast<const float4*>(x + off);
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = amax / 448.f;
  const float inv = s > 0.f ? 1.f / s : 0.f;
  *reinterpret_cast<uint32_t*>(q + off) = E4M3(v.x * inv) | (E4M3(v.y * inv) << 8) |
                                          (E4M3(v.z * inv) << 16) | (E4M3(v.w * inv) << 24);
  if (lane == 0) scale[static_cast<int64_t>(b) * ld_scale + t] = s;
}

template <typename T>
__device__ __forceinline__ float Value(const T* p, int64_t i);
template <>
__device__ __forceinline__ float Value<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ __forceinline__ float Value<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

// One block of 128 threads per 128 x 128 block: thread j owns column j (coalesced rows), the
// block's maximum through shared memory, then a second pass quantizes.
template <typename T>
__global__ void QuantizeBlocksFp8Kernel(const T* __restrict__ w, int K, uint8_t* __restrict__ q,
                                        float* __restrict__ scale) {
  __shared__ float warp_max[kFp8Block / 32];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kFp8Block;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kFp8Block + threadIdx.x;
  float amax = 0.f;
  for (int r = 0; r < kFp8Block; ++r) amax = fmaxf(amax, fabsf(Value(w, (r0 + r) * K + col)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = fmaxf(fmaxf(warp_max[0], warp_max[1]), fmaxf(warp_max[2], warp_max[3]));
  const float s = amax / 448.f;
  const float inv = s > 0.f ? 1.f / s : 0.f;
  for (int r = 0; r < kFp8Block; ++r)
    q[(r0 + r) * K + col] = static_cast<uint8_t>(E4M3(Value(w, (r0 + r) * K + col) * inv));
  if (threadIdx.x == 0) scale[static_cast<int64_t>(blockIdx.y) * ((gridDim.x + 3) & ~3u) + blockIdx.x] = s;
}

// y[t * ldy + r] (+)= src[t * M + r] for t < T: the padded tail product's rows into y.
__global__ void AddRowsKernel(const float* __restrict__ src, int M, int T, float* __restrict__ y,
                              int64_t ldy, bool accumulate) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(T) * M) return;
  const int64_t t = i / M, r = i % M;
  float* p = y + t * ldy + r;
  *p = accumulate ? src[i] + *p : src[i];
}

absl::Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLASLt ", what, " failed with status ", static_cast<int>(s)));
}

template <typename T>
absl::Status SetDesc(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const T& v,
                     const char* what) {
  return LtStatus(cublasLtMatmulDescSetAttribute(op, attr, &v, sizeof v), what);
}

// The block scales of A (the weights) and B (the activations) a product reads.
absl::Status SetScalePointers(cublasLtMatmulDesc_t op, const void* a_scale, const void* b_scale) {
  DS_RETURN_IF_ERROR(SetDesc(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale, "A_SCALE_POINTER"));
  return SetDesc(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale, "B_SCALE_POINTER");
}

}  // namespace

absl::Status QuantizeTokensFp8(const float* x, int64_t tokens, int K, uint8_t* q, float* scale,
                               int64_t ld_scale, cudaStream_t stream) {
  if (K <= 0 || K % kFp8Block != 0 || tokens < 0 || ld_scale < tokens)
    return absl::InvalidArgumentError(absl::StrCat("QuantizeTokensFp8: K = ", K, " (a multiple of ",
                                                   kFp8Block, "), ", tokens, " tokens, ld_scale ",
                                                   ld_scale));
  if (tokens == 0) return absl::OkStatus();
  const int64_t threads = tokens * (K / kFp8Block) * 32;
  QuantizeTokensFp8Kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
      x, tokens, K, q, scale, ld_scale);
  return LastLaunchStatus("QuantizeTokensFp8");
}

absl::Status QuantizeBlocksFp8(const void* w, bool bf16, int64_t rows, int K, uint8_t* q,
                               float* scale, cudaStream_t stream) {
  if (K <= 0 || K % kFp8Block != 0 || rows < 0 || rows % kFp8Block != 0)
    return absl::InvalidArgumentError(absl::StrCat("QuantizeBlocksFp8: ", rows, " x ", K,
                                                   " (both multiples of ", kFp8Block, ")"));
  if (rows == 0) return absl::OkStatus();
  const dim3 grid(K / kFp8Block, static_cast<unsigned>(rows / kFp8Block));
  if (bf16)
    QuantizeBlocksFp8Kernel<<<grid, kFp8Block, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(w), K, q, scale);
  else
    QuantizeBlocksFp8Kernel<<<grid, kFp8Block, 0, stream>>>(static_cast<const float*>(w), K, q,
                                                            scale);
  return LastLaunchStatus("QuantizeBlocksFp8");
}

// A shape's descriptors and algorithm: W is cuBLASLt's A (column-major K x M, transposed: the
// row-major [M, K] weights), X its B (column-major K x T), Y its C = D (column-major M x T with
// leading dimension ldy: the row-major [T, ldy] output).
struct Fp8Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // AlgorithmCount's list, best-ranked first (a plain array: nvcc 13.0's front end fails on a
  // std::vector of this type here).
  static constexpr int kMaxCandidates = 16;
  cublasLtMatmulAlgo_t candidates[kMaxCandidates] = {};
  int n_candidates = 0;
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

absl::StatusOr<std::unique_ptr<Fp8Gemm>> Fp8Gemm::Create(int max_tokens, int max_k, int max_m) {
  if (max_tokens < 0 || max_k <= 0 || max_k % kFp8Block != 0 || max_m <= 0)
    return absl::InvalidArgumentError(absl::StrCat("Fp8Gemm: ", max_tokens, " tokens, K ", max_k,
                                                   ", M ", max_m));
  int device = 0;
  cudaDeviceProp prop;
  DS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  DS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  if (prop.major != 9)
    return absl::FailedPreconditionError(absl::StrCat(
        "FP8 prefill: block-scaled e4m3 products need compute capability 9.0 (device ", device,
        " is ", prop.major, ".", prop.minor, ")"));
  if (!DS_LT_BLOCK_SCALES)
    return absl::UnimplementedError("FP8 prefill: this build's cuBLAS has no block-scaled products (12.9+)");
  std::unique_ptr<Fp8Gemm> g(new Fp8Gemm());
  g->max_tokens_ = max_tokens;
  g->max_k_ = max_k;
  g->max_m_ = max_m;
  DS_RETURN_IF_ERROR(LtStatus(cublasLtCreate(&g->lt_), "cublasLtCreate"));
  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&g->workspace_, kWorkspaceBytes));
  const int64_t nb = max_k / kFp8Block;
  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&g->xq_, (static_cast<int64_t>(max_tokens) + 4) * max_k));
  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&g->xs_, nb * (static_cast<int64_t>(max_tokens) + 4) * 4));
  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&g->xs_tail_, nb * 4 * 4));
  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&g->y_tail_, static_cast<int64_t>(max_m) * kFp8PadTokens * 4));
  // Whether this cuBLASLt has the product at all: a plan for the smallest shape.
  DS_RETURN_IF_ERROR(g->PlanFor(kFp8Block, kFp8Block, 4, kFp8Block).status());
  return g;
}

uint64_t Fp8Gemm::ScratchBytes(int max_tokens, int max_k, int max_m) {
  const uint64_t nb = static_cast<uint64_t>(max_k) / kFp8Block;
  return kWorkspaceBytes + (static_cast<uint64_t>(max_tokens) + 4) * max_k +
         nb * (static_cast<uint64_t>(max_tokens) + 4) * 4 + nb * 16 +
         static_cast<uint64_t>(max_m) * kFp8PadTokens * 4;
}

Fp8Gemm::~Fp8Gemm() {
  plans_.clear();
  if (lt_) cublasLtDestroy(lt_);
  for (void* p : {static_cast<void*>(xq_), static_cast<void*>(xs_), static_cast<void*>(xs_tail_),
                  static_cast<void*>(y_tail_), workspace_})
    if (p) cudaFree(p);
}

absl::StatusOr<Fp8Gemm::Plan*> Fp8Gemm::PlanFor(int M, int K, int T, int64_t ldy) {
  const auto key = std::make_tuple(M, K, T, ldy);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
#if !DS_LT_BLOCK_SCALES
  return absl::UnimplementedError("FP8 prefill: this build's cuBLAS has no block-scaled products");
#else
  auto p = std::make_unique<Plan>();
  DS_RETURN_IF_ERROR(LtStatus(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                              "cublasLtMatmulDescCreate"));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  DS_RETURN_IF_ERROR(SetDesc(p->op, CUBLASLT_MATMUL_DESC_TRANSA, ta, "TRANSA"));
  DS_RETURN_IF_ERROR(SetDesc(p->op, CUBLASLT_MATMUL_DESC_TRANSB, tb, "TRANSB"));
  DS_RETURN_IF_ERROR(SetDesc(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode, "A_SCALE_MODE"));
  DS_RETURN_IF_ERROR(SetDesc(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode, "B_SCALE_MODE"));
  const int8_t fast_accum = 0;  // f32 promotion between blocks (the block modes require it)
  DS_RETURN_IF_ERROR(SetDesc(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum, "FAST_ACCUM"));
  // cuBLASLt checks the block modes' scale pointers while it picks: a placeholder until each
  // product sets its own.
  DS_RETURN_IF_ERROR(SetScalePointers(p->op, workspace_, workspace_));
  DS_RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, K, M, K), "layout A"));
  DS_RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, K, T, K), "layout B"));
  DS_RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, M, T, ldy), "layout C"));
  if (absl::Status st = Heuristic(p.get(), 1); !st.ok())
    return absl::Status(st.code(), absl::StrCat(st.message(), ": M = ", M, ", K = ", K, ", T = ", T));
  p->algo = p->candidates[0];
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
#endif
}

absl::Status Fp8Gemm::Heuristic(Plan* p, int max) {
#if !DS_LT_BLOCK_SCALES
  return absl::UnimplementedError("FP8 prefill: this build's cuBLAS has no block-scaled products");
#else
  cublasLtMatmulPreference_t pref = nullptr;
  DS_RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
  const size_t ws = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulHeuristicResult_t results[Plan::kMaxCandidates] = {};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
      lt_, p->op, p->a, p->b, p->c, p->c, pref, std::clamp(max, 1, Plan::kMaxCandidates), results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
    return absl::UnimplementedError(absl::StrCat(
        "FP8 prefill: cuBLASLt has no block-scaled e4m3 product for this shape (status ",
        static_cast<int>(hs), ", ", found, " algorithms)"));
  p->n_candidates = 0;
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p->candidates[p->n_candidates++] = results[i].algo;
  if (p->n_candidates == 0) return absl::UnimplementedError("FP8 prefill: no usable algorithm");
  return absl::OkStatus();
#endif
}

absl::StatusOr<int> Fp8Gemm::AlgorithmCount(int M, int64_t ldy, int max) {
  if (T_ == 0 || T_ % 4 != 0)
    return absl::FailedPreconditionError("Fp8Gemm::AlgorithmCount: set activations of 4k tokens first");
  DS_ASSIGN_OR_RETURN(Plan * p, PlanFor(M, K_, T_, ldy));
  DS_RETURN_IF_ERROR(Heuristic(p, max));
  return p->n_candidates;
}

absl::Status Fp8Gemm::UseAlgorithm(int M, int64_t ldy, int index) {
  DS_ASSIGN_OR_RETURN(Plan * p, PlanFor(M, K_, T_, ldy));
  if (index < 0 || index >= p->n_candidates)
    return absl::InvalidArgumentError(absl::StrCat("Fp8Gemm::UseAlgorithm: candidate ", index, " of ",
                                                   p->n_candidates));
  p->algo = p->candidates[index];
  return absl::OkStatus();
}

absl::Status Fp8Gemm::SetActivations(const float* x, int T, int K, cudaStream_t stream) {
  if (T < 0 || T > max_tokens_ || K <= 0 || K % kFp8Block != 0 || K > max_k_)
    return absl::InvalidArgumentError(absl::StrCat("Fp8Gemm::SetActivations: ", T, " x ", K,
                                                   " (at most ", max_tokens_, " x ", max_k_, ")"));
  T_ = T;
  K_ = K;
  const int main = T & ~3, tail = T - main;
  padded_ = tail != 0 && T <= kFp8PadTokens;
  if (padded_) {
    // All T tokens and zero rows (scale 0) up to main + 4, for one product.
    const int64_t t4 = main + 4;
    DS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(xq_ + static_cast<int64_t>(T) * K, 0, (t4 - T) * K, stream));
    DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(xs_, 0, 4ull * t4 * (K / kFp8Block), stream));
    return QuantizeTokensFp8(x, T, K, xq_, xs_, t4, stream);
  }
  DS_RETURN_IF_ERROR(QuantizeTokensFp8(x, main, K, xq_, xs_, main, stream));
  if (tail == 0) return absl::OkStatus();
  // The tail's 4 rows: zeros (scale 0) past the last token.
  uint8_t* tq = xq_ + static_cast<int64_t>(max_tokens_) * max_k_;
  DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(tq, 0, 4ull * K, stream));
  DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(xs_tail_, 0, 4ull * 4 * (K / kFp8Block), stream));
  return QuantizeTokensFp8(x + static_cast<int64_t>(main) * K, tail, K, tq, xs_tail_, 4, stream);
}

absl::Status Fp8Gemm::Multiply(const uint8_t* w, const float* ws, float* y, int M, int64_t ldy,
                               bool accumulate, cudaStream_t stream) {
  if (M <= 0 || M % kFp8Block != 0 || M > max_m_ || ldy < M)
    return absl::InvalidArgumentError(absl::StrCat("Fp8Gemm::Multiply: M = ", M, " (a multiple of ",
                                                   kFp8Block, ", at most ", max_m_, "), ldy ", ldy));
  if (reinterpret_cast<uintptr_t>(w) % 16 != 0)
    return absl::InvalidArgumentError("Fp8Gemm::Multiply: weights must be 16-byte aligned");
  const int main = T_ & ~3, tail = T_ - main;
  if (padded_) {
    DS_RETURN_IF_ERROR(Product(w, ws, xq_, xs_, y_tail_, M, K_, main + 4, M, false, stream));
    const int64_t n = static_cast<int64_t>(T_) * M;
    AddRowsKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(y_tail_, M, T_, y,
                                                                              ldy, accumulate);
    return LastLaunchStatus("Fp8Gemm padded rows");
  }
  if (main > 0)
    DS_RETURN_IF_ERROR(Product(w, ws, xq_, xs_, y, M, K_, main, ldy, accumulate, stream));
  if (tail == 0) return absl::OkStatus();
  DS_RETURN_IF_ERROR(Product(w, ws, xq_ + static_cast<int64_t>(max_tokens_) * max_k_, xs_tail_,
                             y_tail_, M, K_, 4, M, false, stream));
  const int64_t n = static_cast<int64_t>(tail) * M;
  AddRowsKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      y_tail_, M, tail, y + static_cast<int64_t>(main) * ldy, ldy, accumulate);
  return LastLaunchStatus("Fp8Gemm tail rows");
}

absl::Status Fp8Gemm::Product(const uint8_t* w, const float* ws, const uint8_t* x,
                              const float* xs, float* y, int M, int K, int T, int64_t ldy,
                              bool accumulate, cudaStream_t stream) {
  DS_ASSIGN_OR_RETURN(Plan * p, PlanFor(M, K, T, ldy));
  DS_RETURN_IF_ERROR(SetScalePointers(p->op, ws, xs));
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  return LtStatus(cublasLtMatmul(lt_, p->op, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c,
                                 &p->algo, workspace_, kWorkspaceBytes, stream),
                  "cublasLtMatmul");
}

}  // namespace ds::cuda
