// CPU reference ops (see ops.h).
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/util/thread_pool.h"
#include "kernels/cpu/dot_tokens.h"
#include "kernels/cpu/quant.h"

namespace ds::cpu {

void MatMul(const WeightView& w, const float* x, int64_t T, float* y, ThreadPool* pool) {
  if (T <= 0 || w.rows <= 0) return;
  ThreadPool& p = pool ? *pool : ThreadPool::Global();
  const uint64_t row_bytes = GgmlRowBytes(w.type, w.cols);
  const auto* base = static_cast<const uint8_t*>(w.data);
  // Row tiles of 8 keep a tile of weight rows in L1/L2 while all T tokens stream past it.
  constexpr int64_t kTile = 8;
  // Waking another thread costs tens of microseconds on a VM; only split when each part gets at
  // least ~256K multiply-adds (measured on the 2-core CI VM: tiny-model decode went from ~450 to
  // ~2,400 tok/s when small matmuls stopped being split).
  constexpr int64_t kMinMacsPerPart = int64_t{1} << 18;
  const int64_t grain = std::max<int64_t>(16, kMinMacsPerPart / std::max<int64_t>(1, T * w.cols));
  p.ParallelFor(
      w.rows,
      [&](int64_t r0, int64_t r1) {
        // Each row of the tile dequantized once for all tokens, and the tile's (row, token) sums
        // computed four at a time: DotRow's sums bit for bit (quant.h contract).
        for (int64_t rb = r0; rb < r1; rb += kTile) {
          const int64_t re = std::min(r1, rb + kTile);
          DotRowsTokens(w.type, base + rb * row_bytes, row_bytes, re - rb, x, w.cols, T, w.cols,
                        y + rb, w.rows);
        }
      },
      grain);
}

void GetRow(const WeightView& w, int64_t row, float* dst) {
  const uint64_t row_bytes = GgmlRowBytes(w.type, w.cols);
  DequantizeRow(w.type, static_cast<const uint8_t*>(w.data) + row * row_bytes, dst, w.cols);
}

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  double ss = 0;  // f64 accumulation: the reference should not depend on summation order noise
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  if (w) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
  }
}

void RmsNormRows(const float* x, const float* w, int64_t T, int64_t n, float eps, float* y) {
  for (int64_t t = 0; t < T; ++t) RmsNorm(x + t * n, w, n, eps, y + t * n);
}

void L2Norm(float* x, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss + eps));
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

void RopeNeox(float* x, int n_rot, int32_t pos, float base) {
  const int half = n_rot / 2;
  for (int i = 0; i < half; ++i) {
    // Angles in f64: at positions ~2.6e5 an f32 angle loses ~1e-2 rad of precision.
    const double inv_freq = std::pow(static_cast<double>(base), -2.0 * i / n_rot);
    const double theta = static_cast<double>(pos) * inv_freq;
    const float c = static_cast<float>(std::cos(theta));
    const float s = static_cast<float>(std::sin(theta));
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = a * s + b * c;
  }
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace ds::cpu
