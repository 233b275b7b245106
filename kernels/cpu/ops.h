// CPU reference element-wise / row ops and the quantized matmul used by the CPU backend.
// All activations are f32 row-major; weights are GGUF rows of any supported ggml type.
#pragma once
#include <cmath>
#include <cstdint>

#include "common/gguf/ggml_types.h"

namespace ds {
class ThreadPool;
}

namespace ds::cpu {

// A weight matrix in GGUF layout: `rows` rows of `cols` contiguous elements of `type`
// (PyTorch [out=rows, in=cols], ggml ne = {cols, rows}).
struct WeightView {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;  // [rows, row_bytes]
  int64_t cols = 0;            // in
  int64_t rows = 0;            // out
};

// y[T, rows] = x[T, cols] · Wᵀ. Every element is one ds::cpu::DotRow, so the result of a token row
// does not depend on T or on which other rows are in the batch (batched == unbatched, bit-exact).
// Parallel over output rows on `pool` (nullptr: ThreadPool::Global()); each weight row is read once
// per call and reused for all T tokens while it is hot in cache.
void MatMul(const WeightView& w, const float* x, int64_t T, float* y, ThreadPool* pool = nullptr);

// dst[0..cols) = dequantized row `row` of w (embedding lookup).
void GetRow(const WeightView& w, int64_t row, float* dst);

// y = x / sqrt(mean(x²) + eps) · w  over n elements (w may be nullptr = 1). y may alias x.
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y);
// Row-wise over [T, n].
void RmsNormRows(const float* x, const float* w, int64_t T, int64_t n, float eps, float* y);

// x ← x · rsqrt(Σx² + eps) (HF l2norm used by the GDN q/k), in place.
void L2Norm(float* x, int64_t n, float eps);

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
// PyTorch softplus (beta 1, threshold 20): identity above the threshold.
inline float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// NeoX ("rotate half") RoPE on the first n_rot dims of one head vector x[head_dim]:
// pair (i, i + n_rot/2), θ_i = pos · base^(−2i/n_rot); dims ≥ n_rot pass through.
void RopeNeox(float* x, int n_rot, int32_t pos, float base);

// In-place numerically stable softmax over n elements.
void Softmax(float* x, int64_t n);

}  // namespace ds::cpu

