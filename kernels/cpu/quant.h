// CPU reference for the GGUF weight formats: dequantize, dot with f32 activations, quantize.
// One table entry per format (see ggml_types.h for block sizes); block layouts: spec/model.md §10.
// All functions take n = number of elements, a multiple of the type's block size (callers check).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/gguf/ggml_types.h"

namespace ds::cpu {

// dst[0..n) = dequantized row.
void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

// sum_i dequant(row)[i] * x[i], accumulated in f32 per block and summed in f64-free order that is
// deterministic for a given (type, n). This is the reference used by matmul.
float DotRow(GgmlType type, const void* row, const float* x, int64_t n);

// Quantize a row (reference quality: nearest-value search with per-block scale fitting, used by
// gguf-synth and tests). Supported for every type with GgmlInfo(type).supported. Deterministic;
// finite inputs always give finite outputs: fp16 scales and F16/BF16 values saturate at the largest
// finite value instead of rounding to inf. In block formats NaN inputs count as 0 and +-inf as
// +-FLT_MAX; F32/F16/BF16 keep NaN/inf. Block formats are slow (IQ4_* ~2M elements/s).
void QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n);

// True when the three functions above implement `type` (same set as GgmlInfo(type).supported).
// For other types DequantizeRow writes NaN, DotRow returns NaN and QuantizeRow zero-fills.
bool QuantTypeSupported(GgmlType type);

// The chunk of DotRow's sum: DotRow = Σ over chunks, in order, of an f32 dot of the chunk's
// dequantized values (a short last chunk zero-padded). The block size; 64 for F32 / F16 / BF16;
// 0 for unsupported types. DotRowsTokens (dot_tokens.h) computes the same sums for several tokens.
int DotChunk(GgmlType type);

// The IQ4_NL / IQ4_XS non-linear codebook.
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace ds::cpu
