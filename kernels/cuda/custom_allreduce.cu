// Kernels of the IPC all-reduce / all-gather (see custom_allreduce.cuh for the protocol).
#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/custom_allreduce.cuh"
#include "kernels/cuda/norm_group.cuh"

namespace ds::cuda {
namespace {

__device__ __forceinline__ void StoreRelease(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Block b of every rank meets here. The epoch only grows; a peer may already be one barrier
// ahead (it can pass barrier e and write e+1 before this block has read e), hence "at least e",
// compared with wrap-around arithmetic.
__device__ __forceinline__ void CarBarrier(const CarGroup& g) {
  __syncthreads();  // this block's writes of the phase are done (release below is cumulative)
  const uint32_t e = g.counters[blockIdx.x] + 1;
  if (threadIdx.x < g.world) {
    StoreRelease(&g.sig[threadIdx.x]->flag[blockIdx.x][g.rank], e);
    const uint64_t t0 = GlobalTimerNs();
    while (static_cast<int32_t>(LoadAcquire(&g.sig[g.rank]->flag[blockIdx.x][threadIdx.x]) - e) < 0) {
      if (GlobalTimerNs() - t0 > g.timeout_ns) {
        if (g.error) *reinterpret_cast<volatile uint32_t*>(g.error) = 1;
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) g.counters[blockIdx.x] = e;
}

// One float4 unit u of a message of n floats (the last unit may be partial); the caller's
// buffer may be unaligned (kAligned = false: scalar accesses).
template <bool kAligned>
__device__ __forceinline__ float4 LoadUnit(const float* p, size_t n, size_t u) {
  const size_t i = u * 4;
  if (kAligned && i + 4 <= n) return *reinterpret_cast<const float4*>(p + i);
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (i < n) v.x = p[i];
  if (i + 1 < n) v.y = p[i + 1];
  if (i + 2 < n) v.z = p[i + 2];
  if (i + 3 < n) v.w = p[i + 3];
  return v;
}
template <bool kAligned>
__device__ __forceinline__ void StoreUnit(float* p, size_t n, size_t u, float4 v) {
  const size_t i = u * 4;
  if (kAligned && i + 4 <= n) {
    *reinterpret_cast<float4*>(p + i) = v;
    return;
  }
  if (i < n) p[i] = v.x;
  if (i + 1 < n) p[i + 1] = v.y;
  if (i + 2 < n) p[i + 2] = v.z;
  if (i + 3 < n) p[i + 3] = v.w;
}

// Peers' data is read through L2 (__ldcg): L1 is not coherent with other processes' writes.
__device__ __forceinline__ float4 SumUnit(const CarGroup& g, size_t u) {
  float4 acc = __ldcg(reinterpret_cast<const float4*>(g.buf[0]) + u);
  for (int q = 1; q < g.world; ++q) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(g.buf[q]) + u);
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  return acc;
}

// units = ceil(n/4); seg = units (one-shot) or ceil(units/world) (two-shot). Index j of every
// segment belongs to the same thread in every phase and on every rank.
template <bool kTwoShot, bool kAligned>
__global__ void CarAllReduceKernel(CarGroup g, float* data, size_t n, size_t units, size_t seg) {
  float4* mine = reinterpret_cast<float4*>(g.buf[g.rank]);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t j0 = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int nseg = kTwoShot ? g.world : 1;
  for (size_t j = j0; j < seg; j += stride)
    for (int s = 0; s < nseg; ++s) {
      const size_t u = s * seg + j;
      if (u < units) mine[u] = LoadUnit<kAligned>(data, n, u);
    }
  CarBarrier(g);  // every rank's input is in its buffer
  if constexpr (!kTwoShot) {
    for (size_t j = j0; j < seg; j += stride) StoreUnit<kAligned>(data, n, j, SumUnit(g, j));
  } else {
    for (size_t j = j0; j < seg; j += stride) {
      const size_t u = g.rank * seg + j;
      if (u < units) __stcg(mine + u, SumUnit(g, u));  // my segment, reduced, in place
    }
    CarBarrier(g);  // every segment is reduced in its owner's buffer
    for (size_t j = j0; j < seg; j += stride)
      for (int s = 0; s < g.world; ++s) {
        const size_t u = s * seg + j;
        if (u < units)
          StoreUnit<kAligned>(data, n, u, __ldcg(reinterpret_cast<const float4*>(g.buf[s]) + u));
      }
  }
  CarBarrier(g);  // nobody still reads my buffer: the next call may overwrite it
}

// One block per row: the row's one-shot sum (rank order, as CarAllReduceKernel) written back
// to h, then RMSNorm and (kQuant) the int8 quantization of the normed row, 8 consecutive floats
// per thread so that a 32-float quantization block is 4 neighbouring lanes (as the layer's
// RmsNormWideKernel).
template <bool kQuant>
__global__ void __launch_bounds__(kCarThreads) CarAllReduceNormKernel(CarGroup g, float* h, int n,
                                                                      const float* w, float eps,
                                                                      float* out, int8_t* xq,
                                                                      float* xd) {
  __shared__ float scratch[32];
  const int row = blockIdx.x, groups = n / 8;
  float4* hr = reinterpret_cast<float4*>(h + static_cast<int64_t>(row) * n);
  const int64_t base_unit = static_cast<int64_t>(row) * (n / 4);
  float4* mine = reinterpret_cast<float4*>(g.buf[g.rank]) + base_unit;
  for (int u = threadIdx.x; u < n / 4; u += blockDim.x) mine[u] = hr[u];
  CarBarrier(g);  // every rank's row is in its buffer
  float ss = 0.f;
  for (int gi = threadIdx.x; gi < groups; gi += blockDim.x) {
    const float4 a = SumUnit(g, base_unit + 2 * gi), b = SumUnit(g, base_unit + 2 * gi + 1);
    hr[2 * gi] = a;
    hr[2 * gi + 1] = b;
    ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
  }
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / n + eps);
  const float4* wr = reinterpret_cast<const float4*>(w);
  float4* orow = reinterpret_cast<float4*>(out + static_cast<int64_t>(row) * n);
  int8_t* xq_row = kQuant ? xq + static_cast<int64_t>(row) * n : nullptr;
  float* xd_row = kQuant ? xd + static_cast<int64_t>(row) * (n / 32) : nullptr;
  // Uniform trip count: every lane takes part in the quantization's shuffles.
  for (int base = 0; base < groups; base += blockDim.x) {
    const int gi = base + threadIdx.x;
    const bool ok = gi < groups;
    float v[8] = {};
    if (ok)  // this thread wrote these two units of h above
      NormGroup(hr[2 * gi], hr[2 * gi + 1], wr[2 * gi], wr[2 * gi + 1], inv, v);
    StoreNormGroup<kQuant>(v, ok, gi, orow, xq_row, xd_row);
  }
  CarBarrier(g);  // nobody still reads my buffer
}

struct GatherArgs {
  size_t counts[kCarMaxRanks];
  size_t offsets[kCarMaxRanks];
};

__global__ void CarAllGatherKernel(CarGroup g, const float* in, GatherArgs a, size_t max_count,
                                   float* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t j0 = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float* mine = g.buf[g.rank];
  const size_t my_count = a.counts[g.rank];
  for (size_t i = j0; i < my_count; i += stride) __stcg(mine + i, in[i]);
  CarBarrier(g);
  for (size_t i = j0; i < max_count; i += stride)
    for (int s = 0; s < g.world; ++s)
      if (i < a.counts[s]) out[a.offsets[s] + i] = __ldcg(g.buf[s] + i);
  CarBarrier(g);
}

int GridFor(size_t work) {
  const size_t b = (work + kCarThreads - 1) / kCarThreads;
  return static_cast<int>(b < 1 ? 1 : (b > kCarMaxBlocks ? kCarMaxBlocks : b));
}

}  // namespace

absl::Status LaunchCarAllReduce(const CarGroup& g, float* data, size_t n, bool two_shot,
                                cudaStream_t stream) {
  if (n == 0 || g.world <= 1) return absl::OkStatus();
  const size_t units = (n + 3) / 4;
  const size_t seg = two_shot ? (units + g.world - 1) / g.world : units;
  const int grid = GridFor(seg);
  const bool aligned = reinterpret_cast<uintptr_t>(data) % 16 == 0;
  if (two_shot) {
    if (aligned)
      CarAllReduceKernel<true, true><<<grid, kCarThreads, 0, stream>>>(g, data, n, units, seg);
    else
      CarAllReduceKernel<true, false><<<grid, kCarThreads, 0, stream>>>(g, data, n, units, seg);
  } else {
    if (aligned)
      CarAllReduceKernel<false, true><<<grid, kCarThreads, 0, stream>>>(g, data, n, units, seg);
    else
      CarAllReduceKernel<false, false><<<grid, kCarThreads, 0, stream>>>(g, data, n, units, seg);
  }
  return LastLaunchStatus("custom all-reduce");
}

absl::Status LaunchCarAllReduceRmsNorm(const CarGroup& g, float* h, int rows, int n,
                                       const float* w, float eps, float* out, int8_t* xq,
                                       float* xd, cudaStream_t stream) {
  if (rows <= 0) return absl::OkStatus();
  if (rows > kCarMaxBlocks || n % 32 != 0)
    return absl::InvalidArgumentError(absl::StrCat("fused all-reduce + norm: ", rows, " rows of ",
                                                   n, " (at most ", kCarMaxBlocks,
                                                   " rows, n a multiple of 32)"));
  if (xq)
    CarAllReduceNormKernel<true><<<rows, kCarThreads, 0, stream>>>(g, h, n, w, eps, out, xq, xd);
  else
    CarAllReduceNormKernel<false><<<rows, kCarThreads, 0, stream>>>(g, h, n, w, eps, out, nullptr,
                                                                    nullptr);
  return LastLaunchStatus("custom all-reduce + norm");
}

absl::Status LaunchCarAllGatherV(const CarGroup& g, const float* in, const size_t* counts,
                                 const size_t* offsets, float* out, cudaStream_t stream) {
  GatherArgs a{};
  size_t max_count = 0;
  for (int q = 0; q < g.world; ++q) {
    a.counts[q] = counts[q];
    a.offsets[q] = offsets[q];
    max_count = counts[q] > max_count ? counts[q] : max_count;
  }
  if (max_count == 0) return absl::OkStatus();
  CarAllGatherKernel<<<GridFor(max_count), kCarThreads, 0, stream>>>(g, in, a, max_count, out);
  return LastLaunchStatus("custom all-gather");
}

}  // namespace ds::cuda
