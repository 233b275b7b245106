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

}  // namespace

absl::Status RmsNormRows(const float* x, int64_t ldx, const int32_t* rows, const float* w,
                         float* out, int T, int n, float eps, cudaStream_t stream) {
  if (T == 0) return absl::OkStatus();
  RmsNormKernel<<<T, 256, 0, stream>>>(x, ldx, rows, w, out, n, eps);
  return LastLaunchStatus("RmsNormRows");
}

}  // namespace ds::cuda
