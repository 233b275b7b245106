// Element-wise ops (see elementwise.cuh).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"

namespace ds::cuda {
namespace {

__global__ void SiluMulKernel(const float* __restrict__ g, const float* __restrict__ u,
                              float* __restrict__ o, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) o[i] = Silu(g[i]) * u[i];
}

__global__ void SigmoidGateKernel(float* __restrict__ o, const float* __restrict__ qg, int T,
                                  int n_head, int hd) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t width = static_cast<int64_t>(n_head) * hd;
  if (i >= T * width) return;
  const int64_t t = i / width;
  const int h = static_cast<int>((i % width) / hd), d = static_cast<int>(i % hd);
  o[i] *= Sigmoid(qg[t * 2 * width + static_cast<int64_t>(h) * 2 * hd + hd + d]);
}

}  // namespace

absl::Status SiluMul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  SiluMulKernel<<<CeilDiv(n, 256), 256, 0, stream>>>(gate, up, out, n);
  return LastLaunchStatus("SiluMul");
}

absl::Status SigmoidGateMul(float* o, const float* qg, int T, int n_head, int hd,
                            cudaStream_t stream) {
  if (T == 0) return absl::OkStatus();
  SigmoidGateKernel<<<CeilDiv(static_cast<int64_t>(T) * n_head * hd, 256), 256, 0, stream>>>(
      o, qg, T, n_head, hd);
  return LastLaunchStatus("SigmoidGateMul");
}

}  // namespace ds::cuda
