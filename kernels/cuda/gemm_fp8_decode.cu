// The FP8 product at decode widths (gemm_fp8_decode.cuh): e4m3 MMA straight from global memory.
#include "kernels/cuda/gemm_fp8_decode.cuh"

#include <algorithm>
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ds::cuda {
namespace {

constexpr int kBlock = 128;           // the scheme's block (rows and K)
constexpr int kThreads = 128;         // 4 warps x 32 rows = one row block
constexpr int kMaxSplitBlocks = 1024; // row blocks x K splits that the scratch holds partials for
constexpr int kMaxSplits = 32;
constexpr int kMaxRangeBlocks = 16;   // K blocks per block at most: its activations fit shared memory
// Weight blocks in flight per thread (register sets) unless Fp8DecodeArgs::stages says.
constexpr int kDefaultStages = 2;

// Weights are read once: past L1.
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

// One K block's weight operands of a thread: its 16 + 16 bytes of rows g and g + 8 of warp w's
// 16 rows of each of the block's two 64-row tiles.
struct WeightBlock {
  uint4 a[2][2][2];  // [row tile][g, g + 8][bytes 16q.., 64 + 16q..]
};

__device__ __forceinline__ void LoadWeights(WeightBlock& o, const uint8_t* const (&wrow)[2][2],
                                            int c, int q) {
  const int off = c * kBlock + 16 * q;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int p = 0; p < 2; ++p) o.a[mt][h][p] = LoadStreamed(wrow[mt][h] + off + 64 * p);
}

// An L2 prefetch of what LoadWeights(c) will read (no registers held: more of the weight stream
// in flight than the register sets alone).
__device__ __forceinline__ void PrefetchWeights(const uint8_t* const (&wrow)[2][2], int c, int q) {
  const int off = c * kBlock + 16 * q;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int p = 0; p < 2; ++p) asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow[mt][h] + off + 64 * p));
}

// The k order. Thread q of a quad loads bytes [16q, 16q + 16) and [64 + 16q, 80 + 16q) of each
// of its rows' 128-byte K block (whole 64-byte runs per row and warp instruction); its A
// fragment of k32 step s is words 2(s & 1) and 2(s & 1) + 1 of the load s / 2, which wgmma reads
// as k 32s + 4q.. (a0 / a1) and 32s + 16 + 4q.. (a2 / a3). So the activations come in that order
// (Fp8DecodeWord: word w = 4(q + 4p) + w' of a block is logical word 8s + 4h + q with
// s = 2p + w' / 2, h = w' % 2), quantized so (Fp8Order::kDecode), and are staged as they are.
static_assert(Fp8DecodeWord(0) == 0 && Fp8DecodeWord(1) == 4 && Fp8DecodeWord(2) == 8 &&
              Fp8DecodeWord(4) == 1 && Fp8DecodeWord(16) == 16 && Fp8DecodeWord(31) == 31);

// Shared memory of a block: per K block of its range a 1024-byte aligned tile of 8 NT token rows
// x 128 bytes, swizzled (wgmma.cuh), then the range's token scales [block][8 NT].
__host__ __device__ constexpr int TileBytes(int nt) { return 8 * nt * kBlock; }

// Grid (M / 128, splits); block 128 (one warpgroup); dynamic shared memory SharedBytes(NT, the
// largest range). partial: [row block][split][T][128] f32; counters: one per row block, zero
// between products.
template <int NT, int kStages>
__global__ void __launch_bounds__(kThreads, kStages == 3 && NT == 4 ? 2 : 3) Fp8DecodeKernel(const Fp8DecodeArgs a, int splits,
                                                               float* __restrict__ partial,
                                                               int* __restrict__ counters) {
#if DS_WGMMA
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* const smem = smem_raw + (((raw + 1023) & ~1023u) - raw);
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int rb = blockIdx.x, split = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int K = a.K, T = a.T, nblocks = K / kBlock;
  const int c0 = static_cast<int>(static_cast<int64_t>(split) * nblocks / splits);
  const int c1 = static_cast<int>(static_cast<int64_t>(split + 1) * nblocks / splits);
  const int nb = c1 - c0;

  // Row of (tile mt, half h): 64 mt + 16 warp + g + 8 h of the row block.
  const uint8_t* wrow[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      wrow[mt][h] = a.w + static_cast<int64_t>(rb * kBlock + 64 * mt + 16 * warp + g + 8 * h) * K;
  const float* ws = a.ws + static_cast<int64_t>(rb) * ((K / kBlock + 3) / 4 * 4);

  // The first weight blocks go out before the activations are staged.
  WeightBlock o[kStages];
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i)
    if (c0 + i < c1) LoadWeights(o[i], wrow, c0 + i, q);
  const int pf = a.l2_prefetch;  // blocks past the register sets' (0: none)
  for (int i = kStages - 1; i < kStages - 1 + pf && c0 + i < c1; ++i) PrefetchWeights(wrow, c0 + i, q);

  // Stage the range's activations (8 NT token rows, zero past T; already in wgmma's k order) and
  // their scales, every copy in flight at once.
  float* xs_sm = reinterpret_cast<float*>(smem + nb * TileBytes(NT));
  const int n16 = 8 * NT * nb * 8;  // 16-byte pieces: [token][block][piece]
  for (int i = threadIdx.x; i < n16; i += kThreads) {
    const int n = i / (nb * 8), b = (i / 8) % nb, piece = i % 8;
    CpAsync16Zfill(smem + b * TileBytes(NT) + SwizzledOffset(n, piece),
                   a.x + static_cast<int64_t>(n < T ? n : 0) * K + (c0 + b) * kBlock + 16 * piece,
                   n < T);
  }
  for (int i = threadIdx.x; i < nb * 8 * NT; i += kThreads) {
    const int b = i / (8 * NT), n = i % (8 * NT);
    if (n < T)
      CpAsync4(xs_sm + i, a.xs + static_cast<int64_t>(c0 + b) * a.ld_xs + n);
    else
      xs_sm[i] = 0.f;
  }
  CpAsyncCommit();
  CpAsyncWait<0>();
  FenceProxyAsyncShared();  // the tiles are read by wgmma (the async proxy)
  __syncthreads();

  float acc[2][4 * NT];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < 4 * NT; ++i) acc[mt][i] = 0.f;

  // One K block: 4 k32 steps per row tile into a fresh accumulator, then scaled by the weight
  // block's and the token block's scales into the total (the scheme's per-block promotion).
  auto multiply = [&](const WeightBlock& w, int b, float wscale) {
    float part[2][4 * NT];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < 4 * NT; ++i) part[mt][i] = 0.f;
    const uint32_t tile = smem_addr + b * TileBytes(NT);
    WgmmaFence();
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      WgmmaFenceOperands(part[mt]);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int p = s >> 1, w0 = 2 * (s & 1);
        const uint32_t frag[4] = {Word(w.a[mt][0][p], w0), Word(w.a[mt][1][p], w0),
                                  Word(w.a[mt][0][p], w0 + 1), Word(w.a[mt][1][p], w0 + 1)};
        WgmmaM64K32E4M3RS<NT>(part[mt], frag, WgmmaDesc(tile + 32 * s), s > 0);
      }
    }
    WgmmaCommit();
    WgmmaWait<0>();
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      WgmmaFenceOperands(part[mt]);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float s0 = wscale * xs_sm[b * 8 * NT + 8 * nt + 2 * q];
        const float s1 = wscale * xs_sm[b * 8 * NT + 8 * nt + 2 * q + 1];
        acc[mt][4 * nt + 0] = fmaf(part[mt][4 * nt + 0], s0, acc[mt][4 * nt + 0]);
        acc[mt][4 * nt + 1] = fmaf(part[mt][4 * nt + 1], s1, acc[mt][4 * nt + 1]);
        acc[mt][4 * nt + 2] = fmaf(part[mt][4 * nt + 2], s0, acc[mt][4 * nt + 2]);
        acc[mt][4 * nt + 3] = fmaf(part[mt][4 * nt + 3], s1, acc[mt][4 * nt + 3]);
      }
    }
  };

  // kStages register sets: the loads of block c + kStages - 1 are in flight while block c
  // multiplies (the buffer index is a constant after unrolling).
  for (int c = c0; c < c1; c += kStages) {
#pragma unroll
    for (int i = 0; i < kStages; ++i) {
      if (c + i >= c1) break;
      if (pf > 0 && c + i + kStages - 1 + pf < c1) PrefetchWeights(wrow, c + i + kStages - 1 + pf, q);
      if (c + i + kStages - 1 < c1) LoadWeights(o[(i + kStages - 1) % kStages], wrow, c + i + kStages - 1, q);
      multiply(o[i], c + i - c0, __ldg(ws + c + i));
    }
  }

  // The accumulator's element 4 nt + e: row 16 warp + g + 8 (e / 2) of the tile, token
  // 8 nt + 2q + (e & 1).
  auto for_each = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int token = 8 * nt + 2 * q + (e & 1);
          if (token < T) f(64 * mt + 16 * warp + g + 8 * (e >> 1), token, acc[mt][4 * nt + e]);
        }
  };
  if (splits == 1) {
    for_each([&](int r, int token, float v) {
      float* yp = a.y + static_cast<int64_t>(token) * a.ldy + rb * kBlock + r;
      *yp = a.accumulate ? *yp + v : v;
    });
    return;
  }
  float* mine = partial + (static_cast<int64_t>(rb) * splits + split) * T * kBlock;
  for_each([&](int r, int token, float v) { mine[token * kBlock + r] = v; });
  // The last block of this row block to arrive adds the splits' partials in split order.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[rb], 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // 4 tokens x 8 splits of loads in flight per round; each sum in split order.
  constexpr int kTok = 4, kSpl = 8;
  const int r = threadIdx.x;
  const float* mine0 = partial + static_cast<int64_t>(rb) * splits * T * kBlock + r;
  for (int t0 = 0; t0 < T; t0 += kTok) {
    float sum[kTok] = {0.f, 0.f, 0.f, 0.f};
    for (int s0 = 0; s0 < splits; s0 += kSpl) {
      float v[kTok][kSpl];
#pragma unroll
      for (int i = 0; i < kTok; ++i)
#pragma unroll
        for (int j = 0; j < kSpl; ++j)
          v[i][j] = t0 + i < T && s0 + j < splits
                        ? __ldcg(mine0 + (static_cast<int64_t>(s0 + j) * T + t0 + i) * kBlock)
                        : 0.f;
#pragma unroll
      for (int i = 0; i < kTok; ++i)
#pragma unroll
        for (int j = 0; j < kSpl; ++j)
          if (s0 + j < splits) sum[i] += v[i][j];
    }
#pragma unroll
    for (int i = 0; i < kTok; ++i) {
      if (t0 + i >= T) break;
      float* yp = a.y + static_cast<int64_t>(t0 + i) * a.ldy + rb * kBlock + r;
      *yp = a.accumulate ? *yp + sum[i] : sum[i];
    }
  }
  if (threadIdx.x == 0) counters[rb] = 0;  // for the next product (stream order)
#endif
}

// Dynamic shared memory of a block with a range of `range_blocks` K blocks (+ the base's
// alignment to 1024 bytes).
size_t SharedBytes(int nt, int range_blocks) {
  return static_cast<size_t>(range_blocks) * TileBytes(nt) + static_cast<size_t>(range_blocks) * 8 * nt * 4 + 1024;
}


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
    AllowSharedBytes<Fp8DecodeKernel<NT, kDefaultStages>>(SharedBytes(NT, kMaxRangeBlocks));
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Fp8DecodeKernel<NT, kDefaultStages>, kThreads,
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

bool Fp8DecodeAvailable() { return WgmmaAvailable(); }

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
    AllowSharedBytes<Fp8DecodeKernel<NT, kDefaultStages>>(SharedBytes(NT, kMaxRangeBlocks));
    if (a.stages == 3) {
      AllowSharedBytes<Fp8DecodeKernel<NT, 3>>(SharedBytes(NT, kMaxRangeBlocks));
      Fp8DecodeKernel<NT, 3><<<dim3(row_blocks, splits), kThreads, SharedBytes(NT, range), stream>>>(
          a, splits, partial, counters);
    } else {
      Fp8DecodeKernel<NT, kDefaultStages>
          <<<dim3(row_blocks, splits), kThreads, SharedBytes(NT, range), stream>>>(a, splits, partial,
                                                                                   counters);
    }
  });
  return LastLaunchStatus("Fp8DecodeGemm");
}

}  // namespace ds::cuda
