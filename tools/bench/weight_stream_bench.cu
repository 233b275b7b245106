// weight_stream_bench: how fast can the decode matmuls' weight reads go, without the arithmetic?
// Reads the tiled Q6_K matrices of a 27B decode step (gemv_tiled.cuh's layout: 16-row tiles of
// 3,360-byte units) in the order the tiled kernel reads them, and XOR-folds the words instead of
// multiplying, per access scheme:
//   linear     every block streams a contiguous range (the card's read rate: the ceiling)
//   tile/sK    one block of 4 warps per (tile, K part); warp w loads units w, w+4, ... with the
//              kernel's 16-byte register loads (sK: K split over K blocks per tile)
//   tile2/sK   the same with the next unit's loads issued before the current one is folded
//   bulk/S     the same walk, but lane 0 of each warp streams its units into a ring of S shared
//              memory stages by cp.async.bulk (Hopper's bulk copy, mbarrier completion) and the
//              lanes read their words from shared memory
// Each launch reads a different copy of the matrix (a 4 GB arena) so that no read hits L2.
// Output: us per launch and GB/s, per matrix shape. Usage: weight_stream_bench [--reps R]
// A lab tool for kernels/cuda/README.md ("Tiled Q6_K": what bounds the decode matmuls); no test runs it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cuda/tiled_q6k.cuh"

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

namespace {

constexpr int kUnit = ds::cuda::kTileUnitBytes;  // one 16-row x 256-element tile-unit
constexpr int kWarps = 4;

__device__ __forceinline__ uint32_t Fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// A lane's loads of one unit are the kernel's own (tiled::LoadTileUnit).
using ds::cuda::tiled::LdStream;
using ds::cuda::tiled::LoadTileUnit;
using ds::cuda::tiled::TileUnit;
__device__ __forceinline__ uint32_t FoldUnit(const TileUnit& r) {
  uint32_t a = r.d ^ Fold(r.sc0) ^ Fold(r.sc1);
#pragma unroll
  for (int i = 0; i < 4; ++i) a ^= Fold(r.ql[i]);
#pragma unroll
  for (int i = 0; i < 2; ++i) a ^= Fold(r.qh[i]);
  return a;
}

__global__ void LinearKernel(const uint8_t* __restrict__ w, int64_t bytes, uint32_t* out) {
  uint32_t acc = 0;
  const int64_t n = bytes / 16;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    acc ^= Fold(LdStream(w + 16 * i));
  if (acc == 0x12345678u) *out = acc;
}

template <int kInflight>
__global__ void __launch_bounds__(kWarps * 32) TileKernel(const uint8_t* __restrict__ w, int nu,
                                                            int split, uint32_t* out) {
  const int tile = blockIdx.x / split, part = blockIdx.x % split;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int u0 = part * nu / split, u1 = (part + 1) * nu / split;
  const uint8_t* base = w + static_cast<int64_t>(tile) * nu * kUnit;
  uint32_t acc = 0;
  if constexpr (kInflight == 1) {
    for (int u = u0 + warp; u < u1; u += kWarps) {
      TileUnit r;
      LoadTileUnit(r, base + static_cast<int64_t>(u) * kUnit, lane);
      acc ^= FoldUnit(r);
    }
  } else {
    int u = u0 + warp;
    TileUnit cur;
    if (u < u1) LoadTileUnit(cur, base + static_cast<int64_t>(u) * kUnit, lane);
    for (; u < u1; u += kWarps) {
      TileUnit nxt;
      if (u + kWarps < u1) LoadTileUnit(nxt, base + static_cast<int64_t>(u + kWarps) * kUnit, lane);
      acc ^= FoldUnit(cur);
      cur = nxt;
    }
  }
  if (acc == 0x12345678u) *out = acc;
}

// The bulk-copy helpers need sm_90 (cp.async.bulk); other builds compile them to traps.
#if __CUDA_ARCH__ >= 900 || !defined(__CUDA_ARCH__)
#define DS_BULK 1
#endif
#ifdef DS_BULK
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif
__device__ __forceinline__ void BarInit(uint64_t* bar) {
#ifdef DS_BULK
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(SmemAddr(bar)));
#else
  __trap();
#endif
}
// Lane 0: arm the stage's barrier for kUnit bytes and start the copy of one unit into it.
__device__ __forceinline__ void BulkLoad(uint8_t* dst, const uint8_t* src, uint64_t* bar) {
#ifndef DS_BULK
  __trap();
#else
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(kUnit)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          SmemAddr(dst)),
      "l"(src), "r"(kUnit), "r"(SmemAddr(bar))
      : "memory");
#endif
}
__device__ __forceinline__ void BarWait(uint64_t* bar, uint32_t parity) {
#ifdef DS_BULK
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
#else
  __trap();
#endif
}

template <int kStages>
__global__ void __launch_bounds__(kWarps * 32) BulkKernel(const uint8_t* __restrict__ w, int nu,
                                                            int split, uint32_t* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t bars[kWarps][kStages];
  const int tile = blockIdx.x / split, part = blockIdx.x % split;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int u0 = part * nu / split, u1 = (part + 1) * nu / split;
  const uint8_t* base = w + static_cast<int64_t>(tile) * nu * kUnit;
  uint8_t* ring = smem + warp * kStages * kUnit;
  const int n = u1 - u0 - warp > 0 ? (u1 - u0 - warp + kWarps - 1) / kWarps : 0;  // this warp's units
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) BarInit(&bars[warp][s]);
#ifdef DS_BULK
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }
  __syncwarp();
  if (lane == 0)
    for (int i = 0; i < kStages && i < n; ++i)
      BulkLoad(ring + i * kUnit, base + static_cast<int64_t>(u0 + warp + kWarps * i) * kUnit, &bars[warp][i]);
  uint32_t acc = 0;
  for (int i = 0; i < n; ++i) {
    const int s = i % kStages;
    BarWait(&bars[warp][s], (i / kStages) & 1);
    const uint8_t* p = ring + s * kUnit;
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= Fold(*reinterpret_cast<const uint4*>(p + 512 * k + 16 * lane));
#pragma unroll
    for (int k = 0; k < 2; ++k) acc ^= Fold(*reinterpret_cast<const uint4*>(p + 2048 + 512 * k + 16 * lane));
    acc ^= Fold(*reinterpret_cast<const uint4*>(p + 3072 + 16 * g));
    acc ^= Fold(*reinterpret_cast<const uint4*>(p + 3072 + 16 * (g + 8)));
    acc ^= *reinterpret_cast<const uint32_t*>(p + 3328 + 4 * g);
    __syncwarp();  // every lane has read stage s before lane 0 refills it
    if (lane == 0 && i + kStages < n)
      BulkLoad(ring + s * kUnit, base + static_cast<int64_t>(u0 + warp + kWarps * (i + kStages)) * kUnit,
               &bars[warp][s]);
  }
  if (acc == 0x12345678u) *out = acc;
}

struct Shape {
  const char* name;
  int tiles, nu;  // 16-row tiles, 256-element units per tile
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 64;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  const int64_t arena = 4ll << 30;
  uint8_t* w = nullptr;
  uint32_t* out = nullptr;
  CHECK(cudaMalloc(&w, arena));
  CHECK(cudaMalloc(&out, 4));
  CHECK(cudaMemset(w, 0x5A, arena));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const Shape shapes[] = {{"qkv+z 16384x5120", 1024, 20},
                          {"ssm_out 5120x6144", 320, 24},
                          {"gate+up 2x17408x5120", 2176, 20},
                          {"down 5120x17408", 320, 68}};
  std::printf("weight_stream_bench on %s (%d SMs), %d launches each, us per launch / GB/s\n",
              prop.name, sms, reps);
  for (const Shape& sh : shapes) {
    const int64_t bytes = static_cast<int64_t>(sh.tiles) * sh.nu * kUnit;
    const int copies = static_cast<int>(arena / bytes);
    auto run = [&](const char* label, auto&& launch) {
      launch(w);  // warm-up
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(e0));
      for (int r = 0; r < reps; ++r) launch(w + (r % copies) * bytes);
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      CHECK(cudaGetLastError());
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = ms * 1e3 / reps;
      std::printf("  %-10s %8.1f us %7.0f GB/s\n", label, us, bytes / (us * 1e3));
    };
    std::printf("%s (%.1f MB)\n", sh.name, bytes / 1e6);
    run("linear", [&](const uint8_t* p) { LinearKernel<<<sms * 8, 256>>>(p, bytes, out); });
    for (int split : {1, 2, 4}) {
      char l[32];
      std::snprintf(l, sizeof l, "tile/s%d", split);
      run(l, [&](const uint8_t* p) { TileKernel<1><<<sh.tiles * split, 128>>>(p, sh.nu, split, out); });
      std::snprintf(l, sizeof l, "tile2/s%d", split);
      run(l, [&](const uint8_t* p) { TileKernel<2><<<sh.tiles * split, 128>>>(p, sh.nu, split, out); });
    }
    auto bulk = [&](auto stages_tag, int split) {
      constexpr int S = decltype(stages_tag)::value;
      const int smem = kWarps * S * kUnit;
      CHECK(cudaFuncSetAttribute(BulkKernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      char l[32];
      std::snprintf(l, sizeof l, "bulk%d/s%d", S, split);
      run(l, [&](const uint8_t* p) { BulkKernel<S><<<sh.tiles * split, 128, smem>>>(p, sh.nu, split, out); });
    };
    for (int split : {1, 2}) {
      bulk(std::integral_constant<int, 2>{}, split);
      bulk(std::integral_constant<int, 4>{}, split);
      bulk(std::integral_constant<int, 8>{}, split);
    }
  }
  return 0;
}
