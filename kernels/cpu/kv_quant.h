// CPU reference of the KV cache quantization (CUDA KV cache, --kv-type): one head row of n
// elements (n a multiple of 32 for the block types) to F16 / Q8_0 / Q4_0 GGML blocks and back.
// The CUDA QkvPrep kernel implements exactly these rules (tests/kernels/cuda/kv_quant_cuda_test.cc
// compares the blocks bitwise), so they are spelled out:
//   F16:  round-to-nearest-even, overflow to inf, NaN kept (as __float2half_rn);
//   Q8_0, Q4_0: inputs sanitized first (NaN -> 0, +-inf -> +-FLT_MAX), so blocks are finite;
//   Q8_0: d = f16(f32(amax / 127)) (the division in double, f16 saturating at 65504);
//         q = rint(x * (1 / d)) in double (half to even) clamped to [-127, 127]; d == 0 -> q = 0.
//         Identical to QuantizeRow(GgmlType::Q8_0).
//   Q4_0: m = the element of largest |x| (lowest index on ties, sign kept, as ggml);
//         d = f16(f32(m / -8)) (saturating); q = clamp(rint(x * (1 / d)), -8, 7) + 8 in double
//         (one multiply, no fused add to differ between compilers); d == 0 -> q = 8. So m maps to q
//         = 0 exactly (ggml's choice: the 16 levels are -8..7, the larger side of the range gets
//         the extra level). Rounding is against the stored f16 d, half to even (ggml truncates x/d
//         + 8.5 with its unrounded d).
#pragma once
#include <cstdint>

#include "common/gguf/ggml_types.h"

namespace ds::cpu {

// True for F16, Q8_0, Q4_0.
bool KvQuantSupported(GgmlType type);

// dst = GgmlRowBytes(type, n) bytes. Unsupported types zero-fill nothing and return false.
bool QuantizeKvRow(GgmlType type, const float* src, void* dst, int64_t n);

// dst[0..n) = dequantized row (F16: the half value; Q8_0: d*q; Q4_0: d*(q-8)), exact in f32.
bool DequantizeKvRow(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace ds::cpu
