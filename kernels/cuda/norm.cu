// RMSNorm over rows (see norm.cuh): one block per row, float4 loads when n % 4 == 0.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/half_rows.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/norm_group.cuh"

#include <algorithm>
#include <cstdint>

namespace ds::cuda {
namespace {

__global__ void __launch_bounds__(256) RmsNormKernel(const float* __restrict__ x, int64_t ldx,
                                                     const int32_t* __restrict__ rows,
                                                     const float* __restrict__ w,
                                                     float* __restrict__ out, int n, float eps) {
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();
  __shared__ float scratch[32];
  const int t = blockIdx.x;
  const int src = rows ? rows[t] : t;
  const float* xr = x + static_cast<int64_t>(src) * ldx;
  float* yr = out + static_cast<int64_t>(t) * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

// 1 / rms of a row of `groups` 8-float groups (two float4 each) read by a whole block.
__device__ __forceinline__ float RowInvRms(const float4* xr, int groups, int n, float eps,
                                           float* scratch) {
  float ss = 0.f;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    const float4 a = xr[2 * g], b = xr[2 * g + 1];
    ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z +
          b.w * b.w;
  }
  ss = BlockSum(ss, scratch);
  return rsqrtf(ss / n + eps);
}

// RMSNorm fused with the int8 activation quantization of the next GEMV (same rounding as
// QuantizeActKernel): one block per row, the normed row goes to `out` (f32, for the float-format
// and prefill consumers) and to xq/xd; one launch and one read of x instead of two.
// Decode runs it on one row, so it is latency-bound: a whole row per block with up to 1024
// threads, 8 contiguous elements per thread (two float4), so a 5120 row is one load per thread
// and pass (the first version, 256 threads with scalar loads, took ~19 us per call on the H200:
// 18% of a decode step). A 32-element quantization block is 4 neighbouring lanes.
template <bool kQuant>
__global__ void __launch_bounds__(1024) RmsNormWideKernel(const float* __restrict__ x, int64_t ldx,
                                                          const int32_t* __restrict__ rows,
                                                          const float* __restrict__ w,
                                                          float* __restrict__ out,
                                                          int8_t* __restrict__ xq,
                                                          float* __restrict__ xd, int n,
                                                          float eps) {
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();      // the column kernel after it may start loading its weights
  __shared__ float scratch[32];
  const int t = blockIdx.x, groups = n / 8;
  const int src = rows ? rows[t] : t;
  const float4* xr = reinterpret_cast<const float4*>(x + static_cast<int64_t>(src) * ldx);
  const float4* wr = reinterpret_cast<const float4*>(w);
  const float inv = RowInvRms(xr, groups, n, eps, scratch);
  float4* yr = reinterpret_cast<float4*>(out + static_cast<int64_t>(t) * n);
  int8_t* xq_row = kQuant ? xq + static_cast<int64_t>(t) * n : nullptr;
  float* xd_row = kQuant ? xd + static_cast<int64_t>(t) * (n / 32) : nullptr;
  // Uniform trip count: every lane takes part in the shuffles of the quantization.
  for (int base = 0; base < groups; base += blockDim.x) {
    const int g = base + threadIdx.x;
    const bool ok = g < groups;
    float v[8] = {};
    if (ok) NormGroup(xr[2 * g], xr[2 * g + 1], wr[2 * g], wr[2 * g + 1], inv, v);
    StoreNormGroup<kQuant>(v, ok, g, yr, xq_row, xd_row);
  }
}

// RmsNormWideKernel's normed row, then its f16 copy for TiledF16Multi with HalfActivations' own
// scaling (half_rows.cuh): the same bits as RmsNormRows followed by HalfActivations. Each thread
// re-reads the groups it wrote, so no barrier is needed between the passes beyond the max's.
__global__ void __launch_bounds__(1024)
    RmsNormHalfKernel(const float* __restrict__ x, const float* __restrict__ w,
                      float* __restrict__ out, uint16_t* __restrict__ xh, float* __restrict__ xs,
                      uint16_t* __restrict__ sums, int n, float eps, bool warpgroup_order) {
  __shared__ float scratch[32];
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();      // the f16 matmul after it may start loading its weights
  const int t = blockIdx.x, groups = n / 8;
  const float4* xr = reinterpret_cast<const float4*>(x + static_cast<int64_t>(t) * n);
  const float4* wr = reinterpret_cast<const float4*>(w);
  const float inv = RowInvRms(xr, groups, n, eps, scratch);
  float4* yr = reinterpret_cast<float4*>(out + static_cast<int64_t>(t) * n);
  float m = 0.f;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float v[8];
    NormGroup(xr[2 * g], xr[2 * g + 1], wr[2 * g], wr[2 * g + 1], inv, v);
    yr[2 * g] = make_float4(v[0], v[1], v[2], v[3]);
    yr[2 * g + 1] = make_float4(v[4], v[5], v[6], v[7]);
#pragma unroll
    for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
  }
  m = BlockMax(m, scratch);
  const int ex = HalfRowExponent(m);
  const float scale = ldexpf(1.f, 14 - ex);
  if (threadIdx.x == 0) xs[t] = ldexpf(1.f, ex - 14);
  uint16_t* hr = xh + static_cast<int64_t>(t) * n;
  // Uniform trip count: with sums, every lane takes part in the shuffles (a 32-element sub-block
  // is 4 neighbouring lanes). The sums are exact (half_rows.cuh), so HalfActivations' bits.
  for (int base = 0; base < groups; base += blockDim.x) {
    const int g = base + threadIdx.x;
    const bool ok = g < groups;
    uint2 h0 = make_uint2(0u, 0u), h1 = make_uint2(0u, 0u);
    if (ok) {
      h0 = HalfScaled4(yr[2 * g], scale);
      h1 = HalfScaled4(yr[2 * g + 1], scale);
      StoreHalf4(hr, 2 * g, h0, warpgroup_order);
      StoreHalf4(hr, 2 * g + 1, h1, warpgroup_order);
    }
    if (sums != nullptr) {
      const double sum = LaneGroupSum<4>(HalfSum4(h0) + HalfSum4(h1));
      if (ok && (g & 3) == 0) sums[static_cast<int64_t>(t) * (n / 32) + g / 4] = SubBlockSumBits(sum);
    }
  }
}

int WideThreads(int n) { return std::min(1024, (n / 8 + 31) / 32 * 32); }

// float4 access needs 16-byte aligned rows.
bool WideOk(const void* x, int64_t ldx, const float* w, const float* out, int n) {
  return n % 8 == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
}

}  // namespace

absl::Status RmsNormQuantize(const float* x, const float* w, float* out, int8_t* xq, float* xd,
                             int T, int n, float eps, cudaStream_t stream, bool early) {
  if (n % 32 != 0)
    return absl::InvalidArgumentError(absl::StrCat("RmsNormQuantize: n=", n, " not a multiple of 32"));
  if (T == 0) return absl::OkStatus();
  if (!WideOk(x, n, w, out, n) || reinterpret_cast<uintptr_t>(xq) % 8 != 0)
    return absl::InvalidArgumentError("RmsNormQuantize: x, w, out need 16-byte and xq 8-byte alignment");
  LaunchMaybeEarly(RmsNormWideKernel<true>, T, WideThreads(n), 0, stream, early, x, int64_t{n},
                   static_cast<const int32_t*>(nullptr), w, out, xq, xd, n, eps);
  return LastLaunchStatus("RmsNormQuantize");
}

absl::Status RmsNormHalf(const float* x, const float* w, float* out, uint16_t* xh, float* xs, int T,
                         int n, float eps, cudaStream_t stream, bool early, uint16_t* sums,
                         bool warpgroup_order) {
  if (T == 0) return absl::OkStatus();
  if (warpgroup_order && n % 16 != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNormHalf: the warpgroup order needs n % 16 == 0, n=", n));
  if (!WideOk(x, n, w, out, n) || reinterpret_cast<uintptr_t>(xh) % 8 != 0)
    return absl::InvalidArgumentError(
        "RmsNormHalf: x, w, out need 16-byte and xh 8-byte alignment, n % 8 == 0");
  if (sums != nullptr && n % 32 != 0)
    return absl::InvalidArgumentError(absl::StrCat("RmsNormHalf: sums need n % 32 == 0, n=", n));
  LaunchMaybeEarly(RmsNormHalfKernel, T, WideThreads(n), 0, stream, early, x, w, out, xh, xs, sums,
                   n, eps, warpgroup_order);
  return LastLaunchStatus("RmsNormHalf");
}

absl::Status RmsNormRows(const float* x, int64_t ldx, const int32_t* rows, const float* w,
                         float* out, int T, int n, float eps, cudaStream_t stream, bool early) {
  if (T == 0) return absl::OkStatus();
  if (WideOk(x, ldx, w, out, n))
    LaunchMaybeEarly(RmsNormWideKernel<false>, T, WideThreads(n), 0, stream, early, x, ldx, rows, w,
                     out, static_cast<int8_t*>(nullptr), static_cast<float*>(nullptr), n, eps);
  else
    LaunchMaybeEarly(RmsNormKernel, T, 256, 0, stream, early, x, ldx, rows, w, out, n, eps);
  return LastLaunchStatus("RmsNormRows");
}

}  // namespace ds::cuda
