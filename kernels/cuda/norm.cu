// RMSNorm over rows (see norm.cuh): one block per row, float4 loads when n % 4 == 0.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/norm.cuh"

namespace ds::cuda {
namespace {

__global__ void __launch_bounds__(256) RmsNormKernel(const float* __restrict__ x, int64_t ldx,
                                                     const int32_t* __restrict__ rows,
                                                     const float* __restrict__ w,
                                                     float* __restrict__ out, int n, float eps) {
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

// RMSNorm fused with the int8 activation quantization of the next GEMV (same rounding as
// QuantizeActKernel): one block per row, the normed row goes to `out` (f32, for the float-format
// and prefill consumers) and to xq/xd; one launch and one read of x instead of two.
__global__ void __launch_bounds__(256) RmsNormQuantKernel(const float* __restrict__ x,
                                                          const float* __restrict__ w,
                                                          float* __restrict__ out,
                                                          int8_t* __restrict__ xq,
                                                          float* __restrict__ xd, int n,
                                                          float eps) {
  __shared__ float scratch[32];
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* xr = x + static_cast<int64_t>(t) * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / n + eps);
  const int nb = n / 32;
  for (int b = warp; b < nb; b += blockDim.x >> 5) {
    const int i = b * 32 + lane;
    const float v = xr[i] * inv * w[i];
    out[static_cast<int64_t>(t) * n + i] = v;
    const float amax = WarpMax(fabsf(v));
    const float d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    xq[static_cast<int64_t>(t) * n + i] = static_cast<int8_t>(__float2int_rn(v * id));
    if (lane == 0) xd[static_cast<int64_t>(t) * nb + b] = d;
  }
}

}  // namespace

absl::Status RmsNormQuantize(const float* x, const float* w, float* out, int8_t* xq, float* xd,
                             int T, int n, float eps, cudaStream_t stream) {
  if (n % 32 != 0)
    return absl::InvalidArgumentError(absl::StrCat("RmsNormQuantize: n=", n, " not a multiple of 32"));
  if (T == 0) return absl::OkStatus();
  RmsNormQuantKernel<<<T, 256, 0, stream>>>(x, w, out, xq, xd, n, eps);
  return LastLaunchStatus("RmsNormQuantize");
}

absl::Status RmsNormRows(const float* x, int64_t ldx, const int32_t* rows, const float* w,
                         float* out, int T, int n, float eps, cudaStream_t stream) {
  if (T == 0) return absl::OkStatus();
  RmsNormKernel<<<T, 256, 0, stream>>>(x, ldx, rows, w, out, n, eps);
  return LastLaunchStatus("RmsNormRows");
}

}  // namespace ds::cuda
