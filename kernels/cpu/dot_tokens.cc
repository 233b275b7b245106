// DotRowsTokens (dot_tokens.h): DotRow's chunked sums for several tokens per dequantized row.
#include "kernels/cpu/dot_tokens.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/dot_f32.h"
#include "kernels/cpu/quant.h"

namespace ds::cpu {

void DotRowsTokens(GgmlType type, const void* rows, size_t row_stride_bytes, int64_t n_rows,
                   const float* x, int64_t ldx, int64_t T, int64_t n, float* out, int64_t ldo) {
  const int L = DotChunk(type);
  if (L == 0) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < n_rows; ++r) out[t * ldo + r] = std::nanf("");
    return;
  }
  // The chunks of DotBlocks / DotScalar: the same DotF32 calls in the same order, so each
  // (row, token) sum is DotRow's bit for bit; only the dequantization is shared by the tokens.
  // Per thread, kept between calls: the dequantized rows and the tokens' zero-padded tails.
  thread_local std::vector<float> rows_f32, tails;
  const int64_t padded = (n + L - 1) / L * L;
  const auto* base = static_cast<const uint8_t*>(rows);
  // F32 rows without a short chunk are read where they are (a copy would be the only work of
  // their "dequantization"); everything else goes through the scratch rows, zero-padded.
  const bool in_place = type == GgmlType::F32 && padded == n && row_stride_bytes % 4 == 0 &&
                        reinterpret_cast<uintptr_t>(rows) % 4 == 0;
  auto row_of = [&](int64_t r) -> const float* {
    return in_place ? reinterpret_cast<const float*>(base + r * row_stride_bytes)
                    : rows_f32.data() + r * padded;
  };
  if (!in_place) {
    rows_f32.resize(static_cast<size_t>(n_rows * padded));
    for (int64_t r = 0; r < n_rows; ++r) {
      float* w = rows_f32.data() + r * padded;
      DequantizeRow(type, base + r * row_stride_bytes, w, n);
      std::fill(w + n, w + padded, 0.0f);
    }
  }
  const int64_t full = n / L * L;  // the chunks that need no padding
  // A short last chunk reads each token's tail from a zero-padded copy, as DotScalar does.
  if (full < n) {
    tails.assign(static_cast<size_t>(T * L), 0.0f);
    for (int64_t t = 0; t < T; ++t) std::copy(x + t * ldx + full, x + t * ldx + n, tails.data() + t * L);
  }
  // The (row, token) sums four at a time, token-major; the pairs of a group need not share a row
  // or a token (DotF32x4 keeps each one's order).
  const int64_t n_pairs = n_rows * T;
  for (int64_t p0 = 0; p0 < n_pairs; p0 += 4) {
    const int m = static_cast<int>(std::min<int64_t>(4, n_pairs - p0));
    const float* w[4];
    const float* xt[4];
    int64_t t_of[4], r_of[4];
    for (int k = 0; k < 4; ++k) {
      const int64_t p = p0 + std::min(k, m - 1);  // a short group repeats its last pair
      t_of[k] = p / n_rows;
      r_of[k] = p % n_rows;
      w[k] = row_of(r_of[k]);
      xt[k] = x + t_of[k] * ldx;
    }
    float total[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d[4];
    const float* wc[4];
    const float* xc[4];
    for (int64_t c = 0; c < full; c += L) {
      for (int k = 0; k < 4; ++k) {
        wc[k] = w[k] + c;
        xc[k] = xt[k] + c;
      }
      DotF32x4(wc, xc, L, d);
      for (int k = 0; k < 4; ++k) total[k] += d[k];
    }
    if (full < n) {
      for (int k = 0; k < 4; ++k) {
        wc[k] = w[k] + full;
        xc[k] = tails.data() + t_of[k] * L;
      }
      DotF32x4(wc, xc, L, d);
      for (int k = 0; k < 4; ++k) total[k] += d[k];
    }
    for (int k = 0; k < m; ++k) out[t_of[k] * ldo + r_of[k]] = total[k];
  }
}

}  // namespace ds::cpu
