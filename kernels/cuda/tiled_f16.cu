// Tiled Q6_K, Q4_K, Q5_K, Q8_0, IQ4_XS and IQ4_NL times f16 activations on f16 tensor cores
// (see tiled_f16.cuh).
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/cuda/cluster.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/half_rows.cuh"
#include "kernels/cuda/mma_f16.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/tiled_f16.cuh"
#include "kernels/cuda/tiled_f16_codecs.cuh"
#include "kernels/cuda/tiled_f16_split.cuh"
#include "kernels/cuda/tiled_q6k.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ds::cuda {
namespace {

using namespace tiled;       // NOLINT: the layout helpers (tiled_q6k.cuh)
using namespace f16_codecs;  // NOLINT: the formats' codecs (tiled_f16_codecs.cuh)

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockRows = kWarps * kTiledRows;  // rows of a single matrix per block
// The K split (kMaxSplit ranges at most, kSplitBlocks blocks at most): tiled_f16_split.cuh.
constexpr int kMaxTickets = kSplitBlocks;
// One column's unit of f16 activations (512 bytes) padded by 32: the 8-byte B loads of lanes
// g = 0..3 (one half-warp) then start 8 banks apart and never conflict.
constexpr int kXCol = 2 * kUnitElems + 32;
// The same in the warpgroup order (the 8-column form, which keeps mma.sync): a lane's k = 4q..4q+3
// are two 4-byte words 16 bytes apart, so the warp's 32-bit loads start 4 banks apart per column
// g and 1 per q: 32 banks.
constexpr int kXColWg = 2 * kUnitElems + 16;

struct F16Launch {
  GemvArgs seg[kGemvMaxSegs];
  int blk_end[kGemvMaxSegs];       // inclusive prefix sums of row blocks x split
  int64_t part_off[kGemvMaxSegs];  // the segment's [split][mats][nc][M] partial sums
  int ticket_off[kGemvMaxSegs];    // its row blocks' tickets
  int n_segs;
  int split;
  float* partial;
  int* tickets;
};

// The warpgroup form's product of one 16-element step: D (64 rows x 8 NT columns) += A (the
// warpgroup's four 16-row fragments) B (by descriptor).
template <int NT>
__device__ __forceinline__ void WgmmaColumns(float (&d)[NT * 4], const uint32_t (&a)[4],
                                             uint64_t desc, int accumulate) {
  if constexpr (NT == 2) WgmmaM64N16K16RS(d, a, desc, accumulate);
  if constexpr (NT == 4) WgmmaM64N32K16RS(d, a, desc, accumulate);
  if constexpr (NT == 8) WgmmaM64N64K16RS(d, a, desc, accumulate);
}

// Steps per commit group of the wgmma form: a group's A fragments stay in registers until the
// group after it was issued (double-buffered), so 2 x kWgGroup x 4 registers hold them.
constexpr int kWgGroup = 2;

// Block = 8 warps, one 16-row tile each (the pair: 4 tiles of the gate and of the up matrix,
// warp w on matrix w & 1), all walking the units of the block's K range together: unit u's
// activations of all columns are staged once per block (cp.async, double-buffered) and every
// warp reads its B fragments from there (mma.sync), or (kWgmma: the activations in the warpgroup
// order; from 9 columns) each warpgroup's four warps give their A fragments to one wgmma per step
// that reads B from the staged tile itself. Up to 8 columns the warpgroup order keeps mma.sync,
// which measured faster there (the same bits either way).
template <class Codec, int NT, bool kPair, bool kCluster, bool kWgmma>
__global__ void __launch_bounds__(kThreads, 2) TiledF16Kernel(const __grid_constant__ F16Launch L) {
  constexpr bool kTc = kWgmma && NT >= 2;  // the wgmma instruction (else mma.sync)
  constexpr int kXc = kWgmma ? kXColWg : kXCol;
#if !DS_WGMMA
  if constexpr (kTc) {
    __trap();  // never launched: TiledF16WgmmaAvailable() is false without sm_90a code
    return;
  }
#endif
  constexpr int NCB = NT * 8;
  constexpr int TPB = kPair ? kWarps / 2 : kWarps;
  // mma.sync: a column's unit padded (kXCol); wgmma: 4 swizzled K-major tiles of NCB rows x 128
  // bytes (64 k each), 1024-aligned.
  constexpr int kStage = kTc ? NCB * 2 * kUnitElems : NCB * kXc;
  constexpr int kSumsStage = NCB * 16;  // kMins: a column's 8 sub-block sums of the unit
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int last_block;
  // The stages (and the sums after them) start at the first 1024-aligned shared address; the
  // epilogues below reuse smem from its start (StageBytes counts the slack).
  uint8_t* const stages =
      kTc ? smem + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) & 1023u)) &
                       1023u)
             : smem;
  int si = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxSegs; ++i)
    if (i < L.n_segs && static_cast<int>(blockIdx.x) >= L.blk_end[i - 1]) si = i;
  const GemvArgs& a = L.seg[si];
  const int local = blockIdx.x - (si > 0 ? L.blk_end[si - 1] : 0);
  const int split = L.split, rb = local / split, ks = local % split;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
  const int mat = kPair ? (warp & 1) : 0;
  const int n_tiles = (a.M + kTiledRows - 1) / kTiledRows;
  const int tile = rb * TPB + (kPair ? warp >> 1 : warp);
  const bool active = tile < n_tiles;
  const int nu = a.K / kUnitElems, nc = a.nc;
  const int u0 = ks * nu / split, u1 = (ks + 1) * nu / split;
  const uint8_t* wt = static_cast<const uint8_t*>(kPair && mat ? a.w2 : a.w) +
                      static_cast<int64_t>(active ? tile : 0) * nu * Codec::kUnitBytes;

  // Unit u's activations of every column into buffer b (columns past nc copy column nc - 1;
  // their results are never stored).
  auto stage = [&](int u, int b) {
    uint8_t* xs = stages + b * kStage;
    for (int i = tid; i < NCB * 32; i += kThreads) {
      const int c = i >> 5, k8 = i & 31;
      // wgmma: 16-byte chunk k8 of the column's 512 bytes is chunk k8 % 8 of row c of tile k8 / 8
      // (the activations come in the kernel's order, so the chunk is a plain copy). (Offsets
      // computed once per thread with zero-filled columns past nc instead measured 3-6% slower
      // on an H100 at every column count.)
      uint8_t* dst = kTc ? xs + (k8 >> 3) * (NCB * 128) + SwizzledOffset(c, k8 & 7)
                         : xs + c * kXc + 16 * k8;
      CpAsync16(dst, a.xh + static_cast<int64_t>(min(c, nc - 1)) * a.K + u * kUnitElems + 8 * k8);
    }
    if constexpr (Codec::kMins) {
      uint8_t* ms = stages + 2 * kStage + b * kSumsStage;
      for (int c = tid; c < NCB; c += kThreads)
        CpAsync16(ms + 16 * c, a.xhs + static_cast<int64_t>(min(c, nc - 1)) * (a.K / 32) + 8 * u);
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  // wgmma: the unit's sums (D: d[4j + e] is mma.sync's c[e] of n-tile j), reused every unit.
  float wd[NT * 4];
#pragma unroll
  for (int i = 0; i < NT * 4; ++i) wd[i] = 0.f;
  // A wgmma is issued by all four warps of a warpgroup: a warp past the last tile runs it on
  // tile 0's weights (its rows are never stored).
  const bool loads = active || kTc;

  // Up to 32 columns the next unit's weights are loaded into registers a whole unit ahead, so
  // their latency hides behind this unit's mma instead of after the barrier (H200, 27B: gate+up
  // at 16 columns 76 -> 70 us, at 32 97.5 -> 93; x16 decode 1,022 -> 1,080 tok/s, x24 1,168 ->
  // 1,200). At 64 columns the 33 registers more spill (104 bytes at the 128 of two blocks per
  // SM): x64 1,765 -> 1,709, so that form loads at the top of its unit as before.
  constexpr bool kPrefetch = NT <= Codec::kPrefetchMaxNt;
  typename Codec::Unit next;
  if (kPrefetch && loads && u0 < u1)
    Codec::Load(next, wt + static_cast<int64_t>(u0) * Codec::kUnitBytes, lane);
  // Launched early (GemvArgs::early_launch): only the weights above before the kernel ahead is
  // done; the activations, their scales and the outputs after.
  WaitForPrerequisiteGrids();
  if (u0 < u1) stage(u0, 0);
  CpAsyncCommit();
  for (int u = u0; u < u1; ++u) {
    const int b = (u - u0) & 1;
    typename Codec::Unit tu;
    if constexpr (kPrefetch) {
      tu = next;
      if (loads && u + 1 < u1)
        Codec::Load(next, wt + static_cast<int64_t>(u + 1) * Codec::kUnitBytes, lane);
    } else if (loads) {
      Codec::Load(tu, wt + static_cast<int64_t>(u) * Codec::kUnitBytes, lane);
    }
    if (u + 1 < u1) stage(u + 1, b ^ 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    if constexpr (kTc) FenceProxyAsyncShared();  // this thread's copies, before wgmma reads them
    __syncthreads();
#if DS_WGMMA
    if constexpr (kTc) {
      Codec::Prepare(tu);
      // 16 steps of one wgmma each, in commit groups of kWgGroup: group i's fragments are decoded
      // while group i - 1 runs, and their registers are reused only after its wait.
      const uint32_t xb = static_cast<uint32_t>(__cvta_generic_to_shared(stages + b * kStage));
      uint32_t A[2][kWgGroup][4];
      WgmmaFenceOperands(wd);
#pragma unroll
      for (int grp = 0; grp < 16 / kWgGroup; ++grp) {
#pragma unroll
        for (int i = 0; i < kWgGroup; ++i) Codec::Operands(tu, grp * kWgGroup + i, A[grp & 1][i]);
        WgmmaFence();
#pragma unroll
        for (int i = 0; i < kWgGroup; ++i) {
          const int s = grp * kWgGroup + i;
          WgmmaColumns<NT>(wd, A[grp & 1][i],
                           WgmmaDesc(xb + (s >> 2) * (NCB * 128) + (s & 3) * 32), s > 0);
        }
        WgmmaCommit();
        if (grp > 0) WgmmaWait<1>();
      }
      WgmmaWait<0>();
      WgmmaFenceOperands(wd);
      const float2 dd = Codec::D(tu);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        acc[j][0] = fmaf(dd.x, wd[4 * j + 0], acc[j][0]);
        acc[j][1] = fmaf(dd.x, wd[4 * j + 1], acc[j][1]);
        acc[j][2] = fmaf(dd.y, wd[4 * j + 2], acc[j][2]);
        acc[j][3] = fmaf(dd.y, wd[4 * j + 3], acc[j][3]);
      }
    }
#endif
    if (!kTc && active) {
      Codec::Prepare(tu);
      // Thread (g, q) reads column 8j + g at k = 16s + 4q .. +3: f16 positions 2q, 2q + 1 (b0)
      // and 2q + 8, 2q + 9 (b1) of the mma hold k = 4q, 4q + 1 and 4q + 2, 4q + 3; the A
      // fragment below uses the same order, so the product is the dot product over k.
      // In the warpgroup order the same k are the words at 4q and 16 + 4q of the 32 bytes.
      const uint8_t* xs = smem + b * kStage + g * kXc + (kWgmma ? 4 : 8) * q;
      float cu[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) cu[j][e] = 0.f;
#pragma unroll
      for (int s = 0; s < 16; ++s) {
        uint32_t A[4];
        Codec::Operands(tu, s, A);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          uint2 bv;
          if constexpr (kWgmma) {
            bv.x = *reinterpret_cast<const uint32_t*>(xs + 8 * j * kXc + 32 * s);
            bv.y = *reinterpret_cast<const uint32_t*>(xs + 8 * j * kXc + 32 * s + 16);
          } else {
            bv = *reinterpret_cast<const uint2*>(xs + 8 * j * kXc + 32 * s);
          }
          MmaF16(A, bv.x, bv.y, cu[j]);
        }
      }
      const float2 dd = Codec::D(tu);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        acc[j][0] = fmaf(dd.x, cu[j][0], acc[j][0]);
        acc[j][1] = fmaf(dd.x, cu[j][1], acc[j][1]);
        acc[j][2] = fmaf(dd.y, cu[j][2], acc[j][2]);
        acc[j][3] = fmaf(dd.y, cu[j][3], acc[j][3]);
      }
    }
    if (active) {
      if constexpr (Codec::kMins) {
        // The minimum term: one m16n8k8 per n-tile of the mins (rows g, g + 8; sub-blocks 2q,
        // 2q + 1) and the staged sub-block sums (column 8j + g, the same sub-blocks), exact
        // products summed in f32; then -64 dmin. The 32-bit loads of lanes (g, q) cover 8
        // columns x 16 bytes: 32 banks.
        uint32_t am[2];
        Codec::MinOperands(tu, q, am);
        const uint8_t* ms = stages + 2 * kStage + b * kSumsStage + g * 16 + 4 * q;
        const float2 dm = Codec::Dmin(tu);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          float cm[4] = {0.f, 0.f, 0.f, 0.f};
          MmaF16K8(am[0], am[1], *reinterpret_cast<const uint32_t*>(ms + 8 * j * 16), cm);
          acc[j][0] = fmaf(dm.x, cm[0], acc[j][0]);
          acc[j][1] = fmaf(dm.x, cm[1], acc[j][1]);
          acc[j][2] = fmaf(dm.y, cm[2], acc[j][2]);
          acc[j][3] = fmaf(dm.y, cm[3], acc[j][3]);
        }
      }
    }
    __syncthreads();  // buffer b is restaged by the next round's copy
  }
  AllowDependentLaunch();  // the next kernel may be scheduled during the epilogue

  const int64_t ldy = a.ldy ? a.ldy : a.M;
  const int row_base = tile * kTiledRows + g;
  // f(acc value, column, row) for the thread's accumulators that are real outputs (C fragment:
  // rows g and g + 8, columns 2q and 2q + 1 of each 8-column tile).
  auto for_outputs = [&](auto&& f) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 8 * j + 2 * q + (e & 1), row = row_base + 8 * (e >> 1);
        if (c < nc && row < a.M) f(acc[j][e], c, row);
      }
  };
  if (split == 1) {
    // The pair: the up warp hands its sums to the gate warp of the same tile (the loop ended on
    // a barrier), indexed by (tile row, column).
    float* red = reinterpret_cast<float*>(smem) + (warp >> 1) * kTiledRows * NCB;
    if constexpr (kPair) {
      if (mat == 1)
        for_outputs([&](float v, int c, int row) { red[(row - tile * kTiledRows) * NCB + c] = v; });
      __syncthreads();
      if (mat == 1) return;
    }
    if (!active) return;
    for_outputs([&](float v, int c, int row) {
      const float xs = a.xs[c];
      float* dst = a.y + c * ldy + row;
      if constexpr (kPair) {
        *dst = Silu(v * xs) * (red[(row - tile * kTiledRows) * NCB + c] * xs);
      } else {
        *dst = a.epilogue == GemvEpilogue::kAccumulate ? *dst + v * xs : v * xs;
      }
    });
    return;
  }

  constexpr int kMats = kPair ? 2 : 1;
  constexpr int kRows = TPB * kTiledRows;  // rows of each matrix per block
  // The K split's last step: output (row, column c) from its partial sums, added in split order
  // (whichever path brought them), then the epilogue.
  auto add_and_store = [&](const float (&p)[kMats][kMaxSplit], int c, int row) {
    float v[kMats];
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
      v[m] = 0.f;
#pragma unroll
      for (int k = 0; k < kMaxSplit; ++k)
        if (k < split) v[m] += p[m][k];
    }
    const float xs = a.xs[c];
    float* dst = a.y + c * ldy + row;
    if constexpr (kPair) {
      *dst = Silu(v[0] * xs) * (v[1] * xs);
    } else {
      *dst = a.epilogue == GemvEpilogue::kAccumulate ? *dst + v[0] * xs : v[0] * xs;
    }
  };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kCluster) {
    // K split on sm_90: the row block's `split` blocks are one thread-block cluster. Each leaves
    // its sums in its own shared memory ([mats][column][row]; the loop ended on a barrier, so the
    // stage buffers are free), and after the cluster barrier every block reduces a slice of the
    // outputs, reading the others' shared memory in split order: the sums of the ticket path
    // below, in the same order, with no global scratch, fence, ticket or tail block.
    float* red = reinterpret_cast<float*>(smem);
    if (active)
      for_outputs(
          [&](float v, int c, int row) { red[(mat * NCB + c) * kRows + row - rb * kRows] = v; });
    ClusterSync();
    uint32_t part[kMaxSplit];  // block k's sums (block k of the cluster: range k of K)
#pragma unroll
    for (int k = 0; k < kMaxSplit; ++k) part[k] = MapSharedRank(red, k < split ? k : 0);
    const int n_out = kRows * nc;
    for (int o = ks * kThreads + tid; o < n_out; o += split * kThreads) {
      const int r = o % kRows, c = o / kRows, row = rb * kRows + r;
      if (row >= a.M) continue;
      float p[kMats][kMaxSplit];
#pragma unroll
      for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int k = 0; k < kMaxSplit; ++k)
          p[m][k] = k < split ? LoadCluster(part[k] + 4 * ((m * NCB + c) * kRows + r)) : 0.f;
      add_and_store(p, c, row);
    }
    ClusterSync();  // no block leaves while another may still read its shared memory
    return;
  }
#endif

  // K split through the scratch (below sm_90, and where clusters do not pay): partial sums to
  // [split][mats][nc][M]; the row block's last block to finish adds them in split order, so the
  // result does not depend on which block came last. Offsets in 32 bits: the scratch holds at
  // most kSplitBlocks x kBlockRows x 64 floats.
  float* part = L.partial + L.part_off[si];
  const int m_stride = nc * a.M, k_stride = kMats * m_stride;
  if (active) {
    float* mine = part + ks * k_stride + mat * m_stride;
    for_outputs([&](float v, int c, int row) { mine[c * a.M + row] = v; });
  }
  __threadfence();
  __syncthreads();
  int* ticket = L.tickets + L.ticket_off[si] + rb;
  if (tid == 0) last_block = atomicAdd(ticket, 1) == split - 1;
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  // This runs on one block per row block after the others are done: the launch's tail. So every
  // load of kOut outputs x the split is issued before the first add.
  constexpr int kOut = kPair ? 2 : 4;
  const int n_out = kRows * nc;
  const float* range[kMaxSplit];  // range k's partial sums
#pragma unroll
  for (int k = 0; k < kMaxSplit; ++k) range[k] = part + (k < split ? k : 0) * k_stride;
  for (int o0 = tid; o0 < n_out; o0 += kThreads * kOut) {
    float p[kOut][kMats][kMaxSplit];
    int off[kOut];
    bool ok[kOut];
#pragma unroll
    for (int i = 0; i < kOut; ++i) {
      const int o = o0 + i * kThreads, row = rb * kRows + o % kRows, c = o / kRows;
      ok[i] = o < n_out && row < a.M;
      off[i] = c * a.M + row;
#pragma unroll
      for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int k = 0; k < kMaxSplit; ++k)
          p[i][m][k] = ok[i] && k < split ? __ldcg(range[k] + m * m_stride + off[i]) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kOut; ++i) {
      if (!ok[i]) continue;
      const int o = o0 + i * kThreads, row = rb * kRows + o % kRows, c = o / kRows;
      add_and_store(p[i], c, row);
    }
  }
  if (tid == 0) *ticket = 0;  // ready for the next launch (graph replays included)
}

// Whether this device runs thread-block clusters (sm_90+), queried once.
bool ClustersAvailable() {
  static const bool yes = [] {
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           major >= 9;
  }();
  return yes;
}

// Dynamic shared memory of the NT form: two stages of every column's unit of activations (also
// the pair's hand-over and the cluster's sums after the loop); the wgmma form's stages unpadded
// behind up to 1024 bytes of alignment slack.
template <class Codec, int NT, bool kWgmma>
constexpr int StageBytes() {
  constexpr int mins = Codec::kMins ? 2 * NT * 8 * 16 : 0;
  constexpr int bytes = kWgmma && NT >= 2 ? 1024 + 2 * NT * 8 * 2 * kUnitElems + mins
                        : kWgmma          ? 2 * NT * 8 * kXColWg + mins
                                          : 2 * NT * 8 * kXCol + mins;
  static_assert(bytes >= kWarps / 2 * kTiledRows * NT * 8 * 4,
                "the pair's hand-over must fit the stages");
  static_assert(bytes >= kBlockRows * NT * 8 * 4, "the cluster's sums must fit the stages");
  return bytes;
}

// Raises the form's dynamic shared-memory limit, once; the result of that call.
template <class Codec, int NT, bool kPair, bool kCluster, bool kWgmma>
cudaError_t RaiseSmemLimit() {
  static const cudaError_t e =
      cudaFuncSetAttribute(TiledF16Kernel<Codec, NT, kPair, kCluster, kWgmma>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           StageBytes<Codec, NT, kWgmma>());
  return e;
}

// A launch in clusters of `split` consecutive blocks (one row block each); `at` holds the
// attributes cfg points at.
template <class Codec, int NT, bool kWgmma>
cudaLaunchConfig_t ClusterLaunch(int blocks, int split, bool early, cudaStream_t stream,
                                 cudaLaunchAttribute (&at)[2]) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = StageBytes<Codec, NT, kWgmma>();
  cfg.stream = stream;
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = split;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = early ? 2 : 1;
  return cfg;
}

template <class Codec, int NT, bool kPair, bool kCluster, bool kWgmma>
absl::Status LaunchOne(const F16Launch& L, int blocks, cudaStream_t stream) {
  auto* kernel = TiledF16Kernel<Codec, NT, kPair, kCluster, kWgmma>;
  const cudaError_t attr = RaiseSmemLimit<Codec, NT, kPair, kCluster, kWgmma>();
  if (attr != cudaSuccess)
    return absl::InternalError(absl::StrCat("TiledF16Multi: shared memory ",
                                            StageBytes<Codec, NT, kWgmma>(), ": ",
                                            cudaGetErrorString(attr)));
  if constexpr (kCluster) {
    cudaLaunchAttribute at[2];
    const cudaLaunchConfig_t cfg =
        ClusterLaunch<Codec, NT, kWgmma>(blocks, L.split, L.seg[0].early_launch, stream, at);
    (void)cudaLaunchKernelEx(&cfg, kernel, L);
  } else {
    LaunchMaybeEarly(kernel, blocks, kThreads, StageBytes<Codec, NT, kWgmma>(), stream,
                     L.seg[0].early_launch, L);
  }
  return LastLaunchStatus("TiledF16Kernel");
}

// Clusters of `split` blocks of this kernel the device holds at once (0: none fit), once per
// (form, split).
template <class Codec, int NT, bool kPair, bool kWgmma>
int ActiveClusters(int split) {
  static std::atomic<int> cache[kMaxSplit + 1] = {};  // the count + 1; 0: not queried yet
  if (cache[split].load(std::memory_order_relaxed) == 0) {
    cudaLaunchAttribute at[2];
    const cudaLaunchConfig_t cfg =
        ClusterLaunch<Codec, NT, kWgmma>(split, split, false, nullptr, at);
    int n = 0;
    if (RaiseSmemLimit<Codec, NT, kPair, true, kWgmma>() != cudaSuccess ||
        cudaOccupancyMaxActiveClusters(&n, TiledF16Kernel<Codec, NT, kPair, true, kWgmma>,
                                       &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    cache[split].store(n + 1, std::memory_order_relaxed);
  }
  return cache[split].load(std::memory_order_relaxed) - 1;
}

// The K split's reduction: through clusters where they fit in as few waves as the blocks do
// alone, and for grids of several waves only from 17 columns; otherwise through the scratch.
// Either gives the same bits. Measured on the H200 (27B shapes, `TiledF16Timing.Table27B`, us
// per launch, clusters / scratch): a grid of about one wave in clusters of 3 or 6 (gdn qkv,
// ffn_down) would take two: 5-20% slower; q+gate and ssm_out (one wave either way) 31.5 / 34.5
// and 21.9 / 27.1 at 16 columns, 56.8 / 71.7 and 37.4 / 57.3 at 64; the ffn pair (816 blocks,
// four waves) 88.6 / 90.5 at 24-32 columns and 136.0 / 142.1 at 64, but 72.3 / 69.2 at 16 and
// 61.3 / 57.6 at 8: with several waves a cluster's blocks leave together, so the slots of the
// next ones free in groups, which only the larger reductions outweigh.
template <class Codec, int NT, bool kWgmma>
absl::Status LaunchNt(const F16Launch& L, int blocks, bool cluster, cudaStream_t stream) {
  const bool pair = L.seg[0].epilogue == GemvEpilogue::kSiluMul;
  if (cluster) {
    const int fit = pair ? ActiveClusters<Codec, NT, true, kWgmma>(L.split)
                         : ActiveClusters<Codec, NT, false, kWgmma>(L.split);
    const int waves = CeilDiv(blocks, TiledF16Slots());
    cluster = fit > 0 && CeilDiv(blocks / L.split, fit) <= waves && (waves == 1 || NT >= 4);
  }
  if (cluster)
    return pair ? LaunchOne<Codec, NT, true, true, kWgmma>(L, blocks, stream)
                : LaunchOne<Codec, NT, false, true, kWgmma>(L, blocks, stream);
  return pair ? LaunchOne<Codec, NT, true, false, kWgmma>(L, blocks, stream)
              : LaunchOne<Codec, NT, false, false, kWgmma>(L, blocks, stream);
}

// The codec of a column form: Q6_K's up to 32 columns takes its scales interleaved by row pairs
// (Q6kCodecT<true>: fewer decode instructions per step, the same bits); at 64 columns that form
// spilled more, so the per-row one stays there.
template <class Codec, int NT>
struct FormCodec {
  using type = Codec;
};
template <int NT>
struct FormCodec<Q6kCodec, NT> {
  using type = Q6kCodecT<(NT <= 4)>;
};
template <class Codec, int NT, bool kWgmma>
absl::Status LaunchForm(const F16Launch& L, int blocks, bool cluster, cudaStream_t stream) {
  return LaunchNt<typename FormCodec<Codec, NT>::type, NT, kWgmma>(L, blocks, cluster, stream);
}

// The launch for nc columns: 8-column n-tiles, NT of them.
template <class Codec, bool kWgmma>
absl::Status LaunchCodecForm(const F16Launch& L, int nc, int blocks, bool cluster,
                             cudaStream_t stream) {
  if (nc <= 8) return LaunchForm<Codec, 1, kWgmma>(L, blocks, cluster, stream);
  if (nc <= 16) return LaunchForm<Codec, 2, kWgmma>(L, blocks, cluster, stream);
  if (nc <= 32) return LaunchForm<Codec, 4, kWgmma>(L, blocks, cluster, stream);
  return LaunchForm<Codec, 8, kWgmma>(L, blocks, cluster, stream);
}
template <class Codec>
absl::Status LaunchCodec(const F16Launch& L, int nc, int blocks, bool cluster, bool wgmma,
                         cudaStream_t stream) {
  return wgmma ? LaunchCodecForm<Codec, true>(L, nc, blocks, cluster, stream)
               : LaunchCodecForm<Codec, false>(L, nc, blocks, cluster, stream);
}

// One block per row. kPer > 0: the row's float4s stay in registers between the max and the
// conversion (at most kPer per thread, blockDim.x threads: HalfActivationsThreads); 0: the row is
// read twice, for rows longer than that. Either way the same scale and the same f16 values: the
// row's max does not depend on the order it is taken in.
template <int kPer>
__global__ void __launch_bounds__(1024) HalfActivationsKernel(const float* __restrict__ x, int K,
                                                              uint16_t* __restrict__ xh,
                                                              float* __restrict__ xs,
                                                              uint16_t* __restrict__ sums,
                                                              bool warpgroup_order) {
  __shared__ float scratch[32];
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();
  const float4* xr = reinterpret_cast<const float4*>(x + static_cast<int64_t>(blockIdx.x) * K);
  uint16_t* hr = xh + static_cast<int64_t>(blockIdx.x) * K;
  const int n4 = K / 4, nt = blockDim.x;
  float m = 0.f;
  float4 held[kPer > 0 ? kPer : 1];
  if constexpr (kPer > 0) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = j * nt + threadIdx.x;
      held[j] = i < n4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      m = fmaxf(m, fmaxf(fmaxf(fabsf(held[j].x), fabsf(held[j].y)), fmaxf(fabsf(held[j].z), fabsf(held[j].w))));
  } else {
    for (int i = threadIdx.x; i < n4; i += nt) {
      const float4 v = xr[i];
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
  }
  m = BlockMax(m, scratch);
  const int ex = HalfRowExponent(m);
  const float scale = ldexpf(1.f, 14 - ex);
  if (threadIdx.x == 0) xs[blockIdx.x] = ldexpf(1.f, ex - 14);
  // Uniform trip count: with sums, every lane takes part in the shuffles (a 32-element sub-block
  // is 8 neighbouring lanes).
  auto convert = [&](int i, float4 v) {
    const bool ok = i < n4;
    uint2 h = make_uint2(0u, 0u);
    if (ok) {
      h = HalfScaled4(v, scale);
      StoreHalf4(hr, i, h, warpgroup_order);
    }
    if (sums != nullptr) {
      const double sum = LaneGroupSum<8>(HalfSum4(h));
      if (ok && (i & 7) == 0) sums[static_cast<int64_t>(blockIdx.x) * (K / 32) + i / 8] = SubBlockSumBits(sum);
    }
  };
  if constexpr (kPer > 0) {
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (j * nt < n4) convert(j * nt + threadIdx.x, held[j]);
  } else {
    for (int base = 0; base < n4; base += nt) {
      const int i = base + threadIdx.x;
      convert(i, i < n4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f));
    }
  }
}

// HalfActivationsKernel<kHalfPer>'s threads for a row of K: about two float4 per thread (enough
// loads in flight for a row read once), at most 1024; 0 where the row does not fit kHalfPer
// float4 per thread (the two-read form with 256 threads).
constexpr int kHalfPer = 5;
int HalfActivationsThreads(int K) {
  const int n4 = K / 4;
  const int t = std::min(1024, std::max(128, (n4 / 2 + 31) / 32 * 32));
  return n4 <= kHalfPer * t ? t : 0;
}

// Rows of one matrix per block: 16-row tiles, one per warp (one per warp pair for the pair).
int RowsPerBlock(const GemvArgs& a) {
  return (a.epilogue == GemvEpilogue::kSiluMul ? kWarps / 2 : kWarps) * kTiledRows;
}
int RowBlocks(const GemvArgs& a) { return CeilDiv(a.M, RowsPerBlock(a)); }

// One launch of `segs` (otherwise validated by TiledF16Multi) at K split `split`.
absl::Status LaunchSplit(const GemvArgs* segs, int n_segs, int split,
                         const TiledF16Scratch& scratch, cudaStream_t stream) {
  const GemvArgs& b = segs[0];
  const bool pair = b.epilogue == GemvEpilogue::kSiluMul;
  F16Launch L{};
  L.n_segs = n_segs;
  for (int i = 0; i < n_segs; ++i) L.seg[i] = segs[i];
  L.split = split;
  int end = 0, tickets = 0;
  int64_t floats = 0;
  for (int i = 0; i < n_segs; ++i) {
    const int rb = RowBlocks(segs[i]);
    end += rb * split;
    L.blk_end[i] = end;
    L.part_off[i] = floats;
    L.ticket_off[i] = tickets;
    if (split > 1) {
      const int mats = pair ? 2 : 1;
      floats += static_cast<int64_t>(split) * mats * b.nc * segs[i].M;
      tickets += rb;
    }
  }
  // end = row blocks x split: the blocks of the launch.
  if (split > 1 && (split > kMaxSplit || 2 * split > b.K / kUnitElems || end > kSplitBlocks))
    return absl::InvalidArgumentError(absl::StrCat("TiledF16Multi: split ", split, " of ",
                                                   end / split, " row blocks over K=", b.K));
  if (split > 1) {
    if (scratch.partial == nullptr || scratch.tickets == nullptr ||
        floats > scratch.partial_floats || tickets > scratch.n_tickets)
      return absl::FailedPreconditionError(absl::StrCat(
          "TiledF16Multi: split ", split, " needs ", floats, " partial floats and ", tickets,
          " tickets; the scratch has ", scratch.partial_floats, " and ", scratch.n_tickets));
    L.partial = scratch.partial;
    L.tickets = scratch.tickets;
  }
  const bool cluster = split > 1 && scratch.cluster_split && ClustersAvailable();
  const bool wg = scratch.warpgroup_order;
  if (wg && !TiledF16WgmmaAvailable())
    return absl::FailedPreconditionError(
        "TiledF16Multi: the warpgroup order needs the wgmma kernel (sm_90a code on an sm_90 GPU)");
  switch (b.type) {
    case GgmlType::Q4_K: return LaunchCodec<KquantCodec<false>>(L, b.nc, end, cluster, wg, stream);
    case GgmlType::Q5_K: return LaunchCodec<KquantCodec<true>>(L, b.nc, end, cluster, wg, stream);
    case GgmlType::Q8_0: return LaunchCodec<Q8Codec>(L, b.nc, end, cluster, wg, stream);
    case GgmlType::IQ4_XS: return LaunchCodec<Iq4XsCodec>(L, b.nc, end, cluster, wg, stream);
    case GgmlType::IQ4_NL: return LaunchCodec<Iq4NlCodec>(L, b.nc, end, cluster, wg, stream);
    default: return LaunchCodec<Q6kCodec>(L, b.nc, end, cluster, wg, stream);
  }
}

}  // namespace

bool TiledF16WgmmaAvailable() { return WgmmaAvailable(); }

int64_t TiledF16PartialFloats(int max_cols) {
  // split x row blocks <= kSplitBlocks; a block holds 128 rows of one matrix or 64 of two.
  return static_cast<int64_t>(kSplitBlocks) * kBlockRows * max_cols;
}
int TiledF16Tickets() { return kMaxTickets; }

absl::Status HalfActivations(const float* x, int R, int K, uint16_t* xh, float* xs,
                             cudaStream_t stream, bool early, uint16_t* sums,
                             bool warpgroup_order, bool rows_in_registers) {
  if (R <= 0 || K <= 0 || K % (sums ? 32 : warpgroup_order ? 16 : 4) != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("HalfActivations: R=", R, " K=", K, sums ? " (sums need K % 32 == 0)" : "",
                     warpgroup_order ? " (the warpgroup order needs K % 16 == 0)" : ""));
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(xh) % 8 != 0)
    return absl::InvalidArgumentError("HalfActivations: x / xh misaligned");
  if (const int t = rows_in_registers ? HalfActivationsThreads(K) : 0; t > 0)
    LaunchMaybeEarly(HalfActivationsKernel<kHalfPer>, R, t, 0, stream, early, x, K, xh, xs, sums,
                     warpgroup_order);
  else
    LaunchMaybeEarly(HalfActivationsKernel<0>, R, 256, 0, stream, early, x, K, xh, xs, sums,
                     warpgroup_order);
  return LastLaunchStatus("HalfActivationsKernel");
}

absl::Status TiledF16Multi(const GemvArgs* segs, int n_segs, const TiledF16Scratch& scratch,
                           cudaStream_t stream) {
  if (n_segs < 1 || n_segs > kGemvMaxSegs)
    return absl::InvalidArgumentError(
        absl::StrCat("TiledF16Multi: ", n_segs, " segments outside [1, ", kGemvMaxSegs, "]"));
  const GemvArgs& b = segs[0];
  const bool pair = b.epilogue == GemvEpilogue::kSiluMul;
  for (int i = 0; i < n_segs; ++i) {
    const GemvArgs& a = segs[i];
    if (!TiledSupported(a.type))
      return absl::UnimplementedError(
          absl::StrCat("TiledF16Multi: no tiled layout for ", std::string(GgmlInfo(a.type).name)));
    if (a.nc < 1 || a.nc > kTiledF16MaxCols || a.M <= 0 || a.K <= 0 || a.K % kUnitElems != 0)
      return absl::InvalidArgumentError(
          absl::StrCat("TiledF16Multi: bad shape M=", a.M, " K=", a.K, " nc=", a.nc));
    if (a.xh == nullptr || a.xs == nullptr || a.y == nullptr || a.w == nullptr)
      return absl::InvalidArgumentError("TiledF16Multi: needs w, xh/xs and y");
    if (a.epilogue == GemvEpilogue::kSiluMul && (a.w2 == nullptr || n_segs != 1))
      return absl::InvalidArgumentError("TiledF16Multi: kSiluMul takes one segment with w2");
    if (i > 0 && (a.type != b.type || a.K != b.K || a.nc != b.nc || a.xh != b.xh ||
                  a.xs != b.xs || a.xhs != b.xhs))
      return absl::InvalidArgumentError(
          "TiledF16Multi: segments must share type, K, nc and activations");
  }
  if (reinterpret_cast<uintptr_t>(b.xh) % 16 != 0)
    return absl::InvalidArgumentError("TiledF16Multi: xh not 16-byte aligned");
  const bool mins = b.type == GgmlType::Q4_K || b.type == GgmlType::Q5_K;
  if (mins && (b.xhs == nullptr || reinterpret_cast<uintptr_t>(b.xhs) % 16 != 0))
    return absl::InvalidArgumentError(absl::StrCat(
        "TiledF16Multi: tiled ", std::string(GgmlInfo(b.type).name),
        " needs the activations' sub-block sums (xhs, 16-byte aligned; HalfActivations)"));
  int rb_total = 0;
  for (int i = 0; i < n_segs; ++i) rb_total += RowBlocks(segs[i]);
  // The split depends on the launch's matrices only (never on nc): a row's numbers are the same
  // at every column count, as long as its matrix is launched with the same others every time
  // (CudaDevice::LinearMulti groups them so in every step).
  if (scratch.split_override > 0)
    return LaunchSplit(segs, n_segs, scratch.split_override, scratch, stream);
  if (n_segs == 1 && scratch.tail_split) {
    const TiledF16TailSplit t = TiledF16SplitTail(rb_total, b.K, scratch.split_cost);
    if (t.row_blocks > 0) {
      // Two launches, each at its own rows' split: the head's whole rounds, then the last row
      // blocks, launched early where the caller launches early (the worker's decode steps on
      // sm_90+), so that their weights load while the head ends (their activations and outputs
      // wait for it: WaitForPrerequisiteGrids). Disjoint rows: each row's sums are those of a
      // launch of its part alone.
      const int head_rb = rb_total - t.row_blocks;
      const int head_rows = head_rb * RowsPerBlock(b);
      GemvArgs head = b, tail = b;
      head.M = head_rows;
      head.ldy = tail.ldy = b.ldy != 0 ? b.ldy : b.M;
      const uint64_t skip = TiledBytes(b.type, head_rows, b.K);
      tail.w = static_cast<const uint8_t*>(b.w) + skip;
      if (pair) tail.w2 = static_cast<const uint8_t*>(b.w2) + skip;
      tail.y = b.y + head_rows;
      tail.M = b.M - head_rows;
      DS_RETURN_IF_ERROR(
          LaunchSplit(&head, 1, TiledF16SplitFor(head_rb, b.K, scratch.split_cost), scratch,
                      stream));
      return LaunchSplit(&tail, 1, t.split, scratch, stream);
    }
  }
  return LaunchSplit(segs, n_segs, TiledF16SplitFor(rb_total, b.K, scratch.split_cost), scratch,
                     stream);
}

}  // namespace ds::cuda
