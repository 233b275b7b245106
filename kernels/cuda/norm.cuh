// Row RMSNorm (spec §3.1): out[t] = x[t] / sqrt(mean(x[t]²) + eps) · w, computed in fp32.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

// x: [T, n] rows at row stride ldx (elements); optional `rows` [T] (device) picks input row
// rows[t] for output row t (used to norm only the rows that need logits). w: [n]; out: [T, n].
// `early`: launched early (common.cuh, LaunchMaybeEarly; the decode steps on sm_90+).
absl::Status RmsNormRows(const float* x, int64_t ldx, const int32_t* rows, const float* w,
                         float* out, int T, int n, float eps, cudaStream_t stream,
                         bool early = false);

// RMSNorm of contiguous rows x: [T, n] into out: [T, n] and, in the same pass, the int8 GEMV
// activations of `out` (xq: [T, n], xd: [T, n/32], as QuantizeActivations). n % 32 == 0; x, w
// and out 16-byte aligned, xq 8-byte aligned.
// `early`: launched early (common.cuh, LaunchMaybeEarly; the decode steps on sm_90+).
absl::Status RmsNormQuantize(const float* x, const float* w, float* out, int8_t* xq, float* xd,
                             int T, int n, float eps, cudaStream_t stream, bool early = false);

// RMSNorm of contiguous rows into out: [T, n] and the f16 activations of `out` for
// TiledF16Multi (xh: [T, n], xs: [T]), bit for bit what HalfActivations makes of `out`.
// n % 8 == 0; x, w and out 16-byte aligned, xh 8-byte aligned.
// `early`: launched early (common.cuh, LaunchMaybeEarly). `sums` (optional, n % 32 == 0): the
// sub-block sums HalfActivations' `sums` gives, bit for bit. `warpgroup_order` (n % 16 == 0): xh
// in the wgmma kernel's order, as HalfActivations' own flag.
absl::Status RmsNormHalf(const float* x, const float* w, float* out, uint16_t* xh, float* xs,
                         int T, int n, float eps, cudaStream_t stream, bool early = false,
                         uint16_t* sums = nullptr, bool warpgroup_order = false);

}  // namespace ds::cuda
