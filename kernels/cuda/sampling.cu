// Argmax over the vocabulary (see sampling.cuh): one block of 1024 threads per row.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.cuh"

namespace ds::cuda {
namespace {

__device__ __forceinline__ void Better(float& bv, int& bi, float v, int i) {
  if (v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}

__global__ void __launch_bounds__(1024) ArgmaxKernel(const float* __restrict__ logits, int64_t ld,
                                                     int n, int32_t* __restrict__ out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * ld;
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = row[i];
    if (!isnan(v)) Better(bv, bi, v, i);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    Better(bv, bi, ov, oi);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    bv = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      Better(bv, bi, ov, oi);
    }
    if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

}  // namespace

absl::Status ArgmaxRows(const float* logits, int64_t ld, int rows, int n, int32_t* out,
                        cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  ArgmaxKernel<<<rows, 1024, 0, stream>>>(logits, ld, n, out);
  return LastLaunchStatus("ArgmaxRows");
}

}  // namespace ds::cuda
