// Block-scaled FP8 prefill matmul (issue #22): weights and activations in e4m3 with DeepSeek-V3's
// block scales, multiplied by cuBLASLt on Hopper's FP8 tensor cores (1.5-1.7x bf16's rate at the
// 27B's prefill shapes on an H100: tools/device/gemm_dtype_ceiling.py).
//
// The scheme and its CPU reference: kernels/cpu/fp8_ref.h. Weights: one f32 scale per 128 x 128
// block, made once at load from their dequantized rows (QuantizeBlocksFp8); activations: one per
// token and 128-element block, per step (QuantizeTokensFp8). Lossy against the 16-bit path: e4m3
// keeps 3 significant bits of every value (docs/quality.md "FP8 prefill").
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "common/util/status.h"

namespace ds::cuda {

inline constexpr int kFp8Block = 128;
// Fp8Gemm: products of up to this many tokens with T % 4 != 0 run padded in one product.
inline constexpr int kFp8PadTokens = 64;

// q[t * K + k] = e4m3(x[t * K + k] * (1 / s)), s = amax / 448 of token t's 128-block b = k / 128
// (saturating, round to nearest even; an all-zero block: s = 0, q = 0); scale[b * ld_scale + t]
// = s. K % 128 == 0. Bit for bit ds::cpu::QuantizeTokensFp8.
absl::Status QuantizeTokensFp8(const float* x, int64_t tokens, int K, uint8_t* q, float* scale,
                               int64_t ld_scale, cudaStream_t stream);

// The weights' form: one scale per 128 x 128 block, scale[(r / 128) * Fp8BlockScaleLd(K) + k / 128]
// (cuBLASLt's BLK128x128 layout: a row block's K blocks, padded to a multiple of 4), from
// bf16 rows (`bf16`) or f32 ones. rows % 128 == 0, K % 128 == 0. Bit for bit
// ds::cpu::QuantizeBlocksFp8 on the same (f32) values.
absl::Status QuantizeBlocksFp8(const void* w, bool bf16, int64_t rows, int K, uint8_t* q,
                               float* scale, cudaStream_t stream);
inline constexpr int64_t Fp8BlockScaleLd(int K) { return (K / kFp8Block + 3) / 4 * 4; }
// Floats of QuantizeBlocksFp8's scales for a rows x K matrix.
inline constexpr int64_t Fp8BlockScaleFloats(int64_t rows, int K) {
  return rows / kFp8Block * Fp8BlockScaleLd(K);
}

// y[t * ldy + r] (+)= sum over k of the dequantized w[r, k] * x[t, k] for r < M, t < T, through
// cuBLASLt (VEC128 scales for x, BLK128x128 for w, f32 output; `accumulate` adds into y).
// cuBLASLt reads the activations' scales as [K / 128][T] with T a multiple of 4, so the
// activations are quantized here, in that layout. T % 4 != 0: up to kFp8PadTokens tokens (decode
// steps) all T zero-padded to a multiple of 4 in one product into a scratch, whose T rows are then
// added or copied into y (one read of the weights); more (prefill pieces) the first T & ~3 tokens
// straight into y and the last T % 4, padded to 4, in a second product through the scratch.
// Plans are cached per shape; not thread-safe (one per device and worker).
class Fp8Gemm {
 public:
  // Scratch for up to max_tokens x max_k activations and max_m output rows. An error (with the
  // reason) where cuBLASLt has no block-scaled e4m3 product (it has one on compute capability 9.0
  // with cuBLAS 12.9+).
  static absl::StatusOr<std::unique_ptr<Fp8Gemm>> Create(int max_tokens, int max_k, int max_m);
  // The device bytes Create allocates for those limits.
  static uint64_t ScratchBytes(int max_tokens, int max_k, int max_m);
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  // Quantizes x [T, K] (f32 rows) for the products that follow. K % 128 == 0.
  absl::Status SetActivations(const float* x, int T, int K, cudaStream_t stream);
  // The product of the activations last set with w [M, K] e4m3 (16-byte aligned rows) and its
  // scales ws (QuantizeBlocksFp8). M % 128 == 0, M <= max_m, ldy >= M.
  absl::Status Multiply(const uint8_t* w, const float* ws, float* y, int M, int64_t ldy,
                        bool accumulate, cudaStream_t stream);

  // Measurement (Fp8Timing's decode table): the algorithms cuBLASLt's heuristic offers, best-ranked
  // first (at most `max`), for the product of the activations last set (a multiple of 4 tokens)
  // with an M-row matrix into rows of ldy; UseAlgorithm makes that shape's products take
  // candidate `index` of the list (0 is what Multiply uses unless told).
  absl::StatusOr<int> AlgorithmCount(int M, int64_t ldy, int max);
  absl::Status UseAlgorithm(int M, int64_t ldy, int index);

 private:
  struct Plan;
  Fp8Gemm() = default;
  absl::Status Heuristic(Plan* p, int max);  // fills p->candidates
  absl::StatusOr<Plan*> PlanFor(int M, int K, int T, int64_t ldy);
  absl::Status Product(const uint8_t* w, const float* ws, const uint8_t* x, const float* xs,
                       float* y, int M, int K, int T, int64_t ldy, bool accumulate,
                       cudaStream_t stream);
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  int max_tokens_ = 0, max_k_ = 0, max_m_ = 0;
  uint8_t* xq_ = nullptr;       // [max_tokens, max_k] e4m3, then 4 padded tail rows
  float* xs_ = nullptr;         // [max_k / 128][T & ~3] (padded_: [max_k / 128][T rounded up to 4])
  float* xs_tail_ = nullptr;    // [max_k / 128][4]
  float* y_tail_ = nullptr;     // [kFp8PadTokens, max_m]: the padded products' rows
  int T_ = 0, K_ = 0;           // what SetActivations last quantized
  bool padded_ = false;         // T_ % 4 != 0 and T_ <= kFp8PadTokens: one padded product
  std::map<std::tuple<int, int, int, int64_t>, std::unique_ptr<Plan>> plans_;
};

}  // namespace ds::cuda
