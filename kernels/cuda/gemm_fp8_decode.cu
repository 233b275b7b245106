// The FP8 product at decode widths (gemm_fp8_decode.cuh): e4m3 MMA straight from global memory.
#include "kernels/cuda/gemm_fp8_decode.cuh"

#include <algorithm>
#include <atomic>

#include "kernels/cuda/common.cuh"

namespace ds::cuda {
namespace {

constexpr int kBlock = 128;           // the scheme's block (rows and K)
constexpr int kThreads = 128;         // 4 warps x 32 rows = one row block
constexpr int kMaxSplitBlocks = 1024; // row blocks x K splits that the scratch holds partials for
constexpr int kMaxSplits = 32;
constexpr int kMaxRangeBlocks = 16;   // K blocks per block at most: its activations fit shared memory
// Weight blocks in flight per thread (register sets). 3 and 4 took 255 registers and spilled
// at every width (ptxas, sm_90a); 2 fits three blocks per SM at up to 16 tokens.
constexpr int kStages = 2;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define DS_FP8_MMA 1
#else
#define DS_FP8_MMA 0
#endif

// Weights are read once: past L1 (the activations, read by every warp, stay there).
__device__ __forceinline__ uint4 LoadStreamed(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// d += a (16 x 32, rows) * b (32 x 8, columns), e4m3 inputs, f32 accumulator.
__device__ __forceinline__ void MmaE4M3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
#if DS_FP8_MMA
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// One K block's weight operands of a thread: its 16 + 16 bytes of rows g and g + 8 of each of
// its two row tiles.
struct WeightBlock {
  uint4 a[2][2][2];  // [row tile][g, g + 8][bytes 16t.., 64 + 16t..]
};

__device__ __forceinline__ void LoadWeights(WeightBlock& o, const uint8_t* const (&wrow)[2][2],
                                            int c, int t) {
  const int off = c * kBlock + 16 * t;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int p = 0; p < 2; ++p) o.a[mt][h][p] = LoadStreamed(wrow[mt][h] + off + 64 * p);
}

// The block's activations in shared memory: token n's bytes of the split's K range at
// n * xrow_bytes (a multiple of 128 plus 64, so that the 8 tokens x 4 threads of a warp's
// 16-byte reads fall in distinct banks per quarter warp), then the range's token scales.
__host__ __device__ constexpr int XRowBytes(int range_blocks) { return range_blocks * kBlock + 64; }

template <int NT>
__device__ __forceinline__ void MultiplyBlock(const WeightBlock& o, const uint8_t* xsm,
                                              int xrow_bytes, const float* xs_sm, float wscale,
                                              int g, int t, float (&acc)[2][NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint8_t* xp = xsm + (8 * nt + g) * xrow_bytes + 16 * t;
    const uint4 b0 = *reinterpret_cast<const uint4*>(xp), b1 = *reinterpret_cast<const uint4*>(xp + 64);
    const float s0 = wscale * xs_sm[8 * nt + 2 * t], s1 = wscale * xs_sm[8 * nt + 2 * t + 1];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        // Step s takes words 2(s & 1), + 1 of the 16-byte load s / 2: thread t's k's of rows and
        // token alike (the registers' k order of m16n8k32: a0 / b0 then a2 / b1).
        const int p = s >> 1, w0 = 2 * (s & 1);
        const uint4& b = p ? b1 : b0;
        MmaE4M3(part, Word(o.a[mt][0][p], w0), Word(o.a[mt][1][p], w0),
                Word(o.a[mt][0][p], w0 + 1), Word(o.a[mt][1][p], w0 + 1), Word(b, w0),
                Word(b, w0 + 1));
      }
      acc[mt][nt][0] = fmaf(part[0], s0, acc[mt][nt][0]);
      acc[mt][nt][1] = fmaf(part[1], s1, acc[mt][nt][1]);
      acc[mt][nt][2] = fmaf(part[2], s0, acc[mt][nt][2]);
      acc[mt][nt][3] = fmaf(part[3], s1, acc[mt][nt][3]);
    }
  }
}

// Grid (M / 128, splits); block 128; dynamic shared memory SharedBytes(NT, the largest range).
// partial: [row block][split][T][128] f32; counters: one per row block, zero between products.
template <int NT>
__global__ void __launch_bounds__(kThreads, NT <= 2 ? 3 : 1) Fp8DecodeKernel(const Fp8DecodeArgs a, int splits,
                                                            float* __restrict__ partial,
                                                            int* __restrict__ counters) {
#if DS_FP8_MMA
  extern __shared__ __align__(16) uint8_t smem[];
  const int rb = blockIdx.x, split = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int K = a.K, T = a.T, nblocks = K / kBlock;
  const int c0 = static_cast<int>(static_cast<int64_t>(split) * nblocks / splits);
  const int c1 = static_cast<int>(static_cast<int64_t>(split + 1) * nblocks / splits);
  const int nb = c1 - c0, xrow_bytes = XRowBytes(nb);
  const int row0 = rb * kBlock + warp * 32;  // this warp's 32 rows

  const uint8_t* wrow[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) wrow[mt][h] = a.w + static_cast<int64_t>(row0 + 16 * mt + g + 8 * h) * K;
  const float* ws = a.ws + static_cast<int64_t>(rb) * ((K / kBlock + 3) / 4 * 4);

  // The first weight blocks go out before the activations are staged.
  WeightBlock o[kStages];
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i)
    if (c0 + i < c1) LoadWeights(o[i], wrow, c0 + i, t);

  // Stage the range's activations (8 NT token rows, zero past T) and their scales.
  uint8_t* xsm = smem;
  float* xs_sm = reinterpret_cast<float*>(smem + 8 * NT * xrow_bytes);  // [block][8 NT]
  const int chunks_per_row = nb * (kBlock / 16);
  for (int i = threadIdx.x; i < 8 * NT * chunks_per_row; i += kThreads) {
    const int n = i / chunks_per_row, ch = i % chunks_per_row;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (n < T) v = *reinterpret_cast<const uint4*>(a.x + static_cast<int64_t>(n) * K + c0 * kBlock + 16 * ch);
    *reinterpret_cast<uint4*>(xsm + n * xrow_bytes + 16 * ch) = v;
  }
  for (int i = threadIdx.x; i < nb * 8 * NT; i += kThreads) {
    const int b = i / (8 * NT), n = i % (8 * NT);
    xs_sm[i] = n < T ? a.xs[static_cast<int64_t>(c0 + b) * a.ld_xs + n] : 0.f;
  }
  __syncthreads();

  float acc[2][NT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  // kStages register sets: the loads of block c + kStages - 1 are in flight while block c
  // multiplies (the buffer index is a constant after unrolling).
  for (int c = c0; c < c1; c += kStages) {
#pragma unroll
    for (int i = 0; i < kStages; ++i) {
      if (c + i >= c1) break;
      if (c + i + kStages - 1 < c1) LoadWeights(o[(i + kStages - 1) % kStages], wrow, c + i + kStages - 1, t);
      const int b = c + i - c0;
      MultiplyBlock<NT>(o[i], xsm + b * kBlock, xrow_bytes, xs_sm + b * 8 * NT, __ldg(ws + c + i), g,
                        t, acc);
    }
  }

  // The accumulator's element i: row g (+ 8 for i >= 2) of the tile, token 8 nt + 2t + (i & 1).
  auto for_each = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int token = 8 * nt + 2 * t + (i & 1);
          if (token < T) f(row0 + 16 * mt + g + 8 * (i >> 1), token, acc[mt][nt][i]);
        }
  };
  if (splits == 1) {
    for_each([&](int r, int token, float v) {
      float* yp = a.y + static_cast<int64_t>(token) * a.ldy + r;
      *yp = a.accumulate ? *yp + v : v;
    });
    return;
  }
  float* mine = partial + (static_cast<int64_t>(rb) * splits + split) * T * kBlock;
  for_each([&](int r, int token, float v) { mine[token * kBlock + (r - rb * kBlock)] = v; });
  // The last block of this row block to arrive adds the splits' partials in split order.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[rb], 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int r = threadIdx.x;
  const float* mine0 = partial + static_cast<int64_t>(rb) * splits * T * kBlock;
  for (int token = 0; token < T; ++token) {
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += __ldcg(mine0 + (static_cast<int64_t>(s) * T + token) * kBlock + r);
    float* yp = a.y + static_cast<int64_t>(token) * a.ldy + rb * kBlock + r;
    *yp = a.accumulate ? *yp + sum : sum;
  }
  if (threadIdx.x == 0) counters[rb] = 0;  // for the next product (stream order)
#endif
}

// Dynamic shared memory of a block with a range of `range_blocks` K blocks.
size_t SharedBytes(int nt, int range_blocks) {
  return static_cast<size_t>(8 * nt) * XRowBytes(range_blocks) + static_cast<size_t>(range_blocks) * 8 * nt * 4;
}

__global__ void Fp8DecodeProbeKernel(int* out) { *out = DS_FP8_MMA; }

template <typename F>
bool DispatchTiles(int T, F&& f) {
  switch ((T + 7) / 8) {
    case 1: f(std::integral_constant<int, 1>{}); return true;
    case 2: f(std::integral_constant<int, 2>{}); return true;
    case 3: f(std::integral_constant<int, 3>{}); return true;
    case 4: f(std::integral_constant<int, 4>{}); return true;
    default: return false;
  }
}

// Blocks of the kernel for T tokens that the current device runs at once (with a typical range
// of 8 K blocks).
int ResidentBlocks(int T) {
  static std::atomic<int> cached[5][64] = {};  // [n-tiles][device]
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev >= 64) dev = 0;
  const int nt = std::clamp((T + 7) / 8, 1, 4);
  if (const int v = cached[nt][dev].load(std::memory_order_relaxed); v > 0) return v;
  int sms = 1, per_sm = 1;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  DispatchTiles(T, [&](auto tag) {
    constexpr int NT = decltype(tag)::value;
    AllowSharedBytes<Fp8DecodeKernel<NT>>(SharedBytes(NT, kMaxRangeBlocks));
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Fp8DecodeKernel<NT>, kThreads,
                                                  SharedBytes(NT, 8));
  });
  const int v = std::max(1, sms * std::max(1, per_sm));
  cached[nt][dev].store(v, std::memory_order_relaxed);
  return v;
}

int64_t PartialFloats() { return static_cast<int64_t>(kMaxSplitBlocks) * kFp8DecodeMaxTokens * kBlock; }

int MinSplits(int K) { return (K / kBlock + kMaxRangeBlocks - 1) / kMaxRangeBlocks; }

}  // namespace

uint64_t Fp8DecodeScratchBytes(int max_m) {
  return static_cast<uint64_t>(PartialFloats()) * 4 + static_cast<uint64_t>(std::max(1, max_m / kBlock)) * 4;
}

absl::Status Fp8DecodeScratchInit(void* scratch, int max_m, cudaStream_t stream) {
  DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(static_cast<float*>(scratch) + PartialFloats(), 0,
                                          static_cast<size_t>(std::max(1, max_m / kBlock)) * 4, stream));
  return absl::OkStatus();
}

bool Fp8DecodeTakes(int M, int K, int T) {
  if (M <= 0 || M % kBlock != 0 || K <= 0 || K % kBlock != 0 || T < 1 || T > kFp8DecodeMaxTokens)
    return false;
  const int s = MinSplits(K);
  return s == 1 || static_cast<int64_t>(s) * (M / kBlock) <= kMaxSplitBlocks;
}

int Fp8DecodeSplits(int M, int K, int T) {
  const int row_blocks = std::max(1, M / kBlock), nblocks = std::max(1, K / kBlock);
  const int want = (ResidentBlocks(T) + row_blocks - 1) / row_blocks;
  const int cap = std::min({nblocks, kMaxSplits, std::max(1, kMaxSplitBlocks / row_blocks)});
  return std::max(MinSplits(K), std::clamp(want, 1, cap));
}

bool Fp8DecodeAvailable() {
  static const bool available = ProbeWritesOne(Fp8DecodeProbeKernel, 89, 1000);
  return available;
}

absl::Status Fp8DecodeGemm(const Fp8DecodeArgs& a, void* scratch, int max_m, cudaStream_t stream) {
  if (!Fp8DecodeTakes(a.M, a.K, a.T) || a.M > max_m || a.ldy < a.M || a.ld_xs < a.T || a.splits < 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "Fp8DecodeGemm: M ", a.M, " (a multiple of 128, at most ", max_m, "), K ", a.K,
        " (a multiple of 128), T ", a.T, " (1..", kFp8DecodeMaxTokens, "), ldy ", a.ldy, ", ld_xs ",
        a.ld_xs, " (Fp8DecodeTakes)"));
  if (reinterpret_cast<uintptr_t>(a.w) % 16 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0 ||
      a.K % 16 != 0)
    return absl::InvalidArgumentError("Fp8DecodeGemm: weights and activations must be 16-byte aligned");
  if (!Fp8DecodeAvailable())
    return absl::FailedPreconditionError(
        "Fp8DecodeGemm: needs e4m3 MMA (compute capability 8.9+ and code built for it)");
  const int row_blocks = a.M / kBlock, nblocks = a.K / kBlock;
  const int splits = a.splits > 0 ? a.splits : Fp8DecodeSplits(a.M, a.K, a.T);
  if (splits > nblocks || splits < MinSplits(a.K) ||
      (splits > 1 && static_cast<int64_t>(splits) * row_blocks > kMaxSplitBlocks))
    return absl::InvalidArgumentError(absl::StrCat("Fp8DecodeGemm: ", splits, " splits of ",
                                                   nblocks, " K blocks and ", row_blocks,
                                                   " row blocks (at least ", MinSplits(a.K),
                                                   ", at most ", kMaxSplitBlocks, " partial tiles)"));
  float* partial = static_cast<float*>(scratch);
  int* counters = reinterpret_cast<int*>(partial + PartialFloats());
  const int range = (nblocks + splits - 1) / splits;  // the largest split's K blocks
  DispatchTiles(a.T, [&](auto tag) {
    constexpr int NT = decltype(tag)::value;
    AllowSharedBytes<Fp8DecodeKernel<NT>>(SharedBytes(NT, kMaxRangeBlocks));
    Fp8DecodeKernel<NT><<<dim3(row_blocks, splits), kThreads, SharedBytes(NT, range), stream>>>(
        a, splits, partial, counters);
  });
  return LastLaunchStatus("Fp8DecodeGemm");
}

}  // namespace ds::cuda
