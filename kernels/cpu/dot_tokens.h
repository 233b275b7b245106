// The matmul form of DotRow for several tokens (kernels/cpu/ops.cc MatMul): each weight row is
// dequantized once for all of a step's tokens, and the (row, token) sums run four at a time.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/gguf/ggml_types.h"

namespace ds::cpu {

// out[t * ldo + r] = DotRow(type, rows + r * row_stride_bytes, x + t * ldx, n) for r < n_rows,
// t < T, bit-identical, with each row dequantized once for all T tokens (into the calling
// thread's scratch) instead of once per token: the form for matmuls of several tokens.
void DotRowsTokens(GgmlType type, const void* rows, size_t row_stride_bytes, int64_t n_rows,
                   const float* x, int64_t ldx, int64_t T, int64_t n, float* out, int64_t ldo);

}  // namespace ds::cpu
