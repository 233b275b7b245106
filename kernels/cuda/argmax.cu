// ArgmaxSplitRows (argmax.cuh): a row's slices in parallel blocks, the last block reduces.
#include <cfloat>
#include <climits>

#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/argmax_reduce.cuh"
#include "kernels/cuda/common.cuh"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;

// The CPU sampler's view of a logit (common/sampling/kernels.cc Sanitize).
__device__ __forceinline__ float Sanitized(float v) {
  return isnan(v) ? -INFINITY : (v == INFINITY ? FLT_MAX : v);
}

// The block's best (value, index) into thread 0 (every thread must call it).
__device__ __forceinline__ void BlockBest(float& bv, int& bi) {
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  WarpBest(bv, bi);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    bv = lane < kThreads / 32 ? sv[lane] : -INFINITY;
    bi = lane < kThreads / 32 ? si[lane] : INT_MAX;
    WarpBest(bv, bi);
  }
}

__global__ void __launch_bounds__(kThreads, 4)  // 4 blocks per SM: no spill at the unroll of 4
    ArgmaxSplitKernel(const float* __restrict__ logits, int64_t ld, int n, int parts,
                      float* __restrict__ pv, int32_t* __restrict__ pi, uint32_t* tickets,
                      int32_t* __restrict__ out) {
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();
  const int row = blockIdx.y, part = blockIdx.x;
  const float* x = logits + static_cast<int64_t>(row) * ld;
  // Slices are multiples of 4 logits, so a slice of an aligned row starts 16-byte aligned.
  const int chunk = ((n + parts - 1) / parts + 3) & ~3;
  const int begin = min(n, part * chunk), end = min(n, begin + chunk);
  float bv = -INFINITY;
  int bi = INT_MAX;
  if ((reinterpret_cast<uintptr_t>(x) & 15) == 0) {
    const int n4 = (end - begin) >> 2;
    const float4* x4 = reinterpret_cast<const float4*>(x + begin);
#pragma unroll 4
    for (int k = threadIdx.x; k < n4; k += kThreads) {
      const float4 v = __ldg(x4 + k);
      const int i = begin + 4 * k;
      Better(bv, bi, Sanitized(v.x), i);
      Better(bv, bi, Sanitized(v.y), i + 1);
      Better(bv, bi, Sanitized(v.z), i + 2);
      Better(bv, bi, Sanitized(v.w), i + 3);
    }
    for (int i = begin + 4 * n4 + threadIdx.x; i < end; i += kThreads)
      Better(bv, bi, Sanitized(__ldg(x + i)), i);
  } else {
    for (int i = begin + threadIdx.x; i < end; i += kThreads)
      Better(bv, bi, Sanitized(__ldg(x + i)), i);
  }
  BlockBest(bv, bi);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    pv[row * parts + part] = bv;
    pi[row * parts + part] = bi;
    __threadfence();  // the slot is visible before the ticket says so
    last = atomicAdd(&tickets[row], 1u) == static_cast<uint32_t>(parts - 1);
  }
  __syncthreads();
  if (!last) return;
  // The row's last block: every slot is written (their tickets came first). L2 reads (__ldcg):
  // the slots were written by other SMs.
  __threadfence();
  bv = -INFINITY;
  bi = INT_MAX;
  for (int p = threadIdx.x; p < parts; p += kThreads)
    Better(bv, bi, __ldcg(pv + row * parts + p), __ldcg(pi + row * parts + p));
  BlockBest(bv, bi);
  if (threadIdx.x == 0) {
    out[row] = bi == INT_MAX ? 0 : bi;  // an empty row (n = 0) or only -inf / NaN: token 0
    tickets[row] = 0;                   // ready for the next launch (and graph replays)
  }
}

}  // namespace

absl::Status ArgmaxSplitRows(const float* logits, int64_t ld, int rows, int n,
                             const ArgmaxScratch& s, int32_t* out, cudaStream_t stream,
                             bool early) {
  if (rows == 0) return absl::OkStatus();
  if (rows < 0 || rows > s.max_rows || n < 0)
    return absl::InvalidArgumentError("ArgmaxSplitRows: rows outside the scratch, or n < 0");
  LaunchMaybeEarly(ArgmaxSplitKernel, dim3(kArgmaxParts, rows), kThreads, 0, stream, early, logits,
                   ld, n, int{kArgmaxParts}, s.value, s.index, s.tickets, out);
  return LastLaunchStatus("ArgmaxSplitRows");
}

}  // namespace ds::cuda
