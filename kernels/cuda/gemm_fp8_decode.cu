// The FP8 product at decode widths (gemm_fp8_decode.cuh): a persistent stream of the weights
// through shared memory into wgmma.
#include "kernels/cuda/gemm_fp8_decode.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <tuple>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ds::cuda {
namespace {

constexpr int kBlock = 128;             // the scheme's block (rows and K)
constexpr int kConsumers = 256;         // two warpgroups, one 64-row wgmma tile of the row block each
constexpr int kThreads = kConsumers + 32;  // + the producer warp (its lane 0 issues the copies)
constexpr int kStages = 8;              // the ring: up to 8 tiles (128 KiB of weights) in flight per SM
constexpr int kGroup = 4;               // tiles asked for at once (kStages / kGroup groups in the ring)
static_assert(kStages % kGroup == 0);
constexpr int kWeightTileBytes = kBlock * kBlock;
constexpr int kSlotFloats = kFp8DecodeMaxTokens * kBlock;  // one partial tile [token][row]

// A stage: the weight tile (128 rows x 128 bytes, swizzled by the copy engine; rows 64.. are the
// second wgmma tile, 8 KiB on), the tokens' activation rows (8 NT x 128 bytes, swizzled, zeros
// past T), the tokens' scales of this K block (a multiple of 4 floats) and the aligned group of 4
// weight block scales holding this block's; 1024-byte aligned.
__host__ __device__ constexpr int XsOffset(int nt) { return kWeightTileBytes + 8 * nt * kBlock; }
__host__ __device__ constexpr int WsOffset(int nt) { return XsOffset(nt) + kFp8DecodeMaxTokens * 4; }
__host__ __device__ constexpr int StageBytes(int nt) { return (WsOffset(nt) + 16 + 1023) / 1024 * 1024; }
__host__ __device__ constexpr size_t SharedBytes(int nt) {
  return static_cast<size_t>(kStages) * StageBytes(nt) + 1024;  // + the base's alignment
}

// The run of block b: flattened weight blocks [RunStart(b), RunStart(b + 1)) of L, index f =
// row block * (K / 128) + K block.
__host__ __device__ __forceinline__ int64_t RunStart(int b, int64_t L, int G) {
  return static_cast<int64_t>(b) * L / G;
}
// The block whose run holds flattened index f.
__device__ __forceinline__ int BlockOf(int64_t f, int64_t L, int G) {
  int b = static_cast<int>(f * G / L);
  while (b + 1 < G && RunStart(b + 1, L, G) <= f) ++b;
  while (b > 0 && RunStart(b, L, G) > f) --b;
  return b;
}

// The runs that hold a part of row block rb (nkb K blocks each), and the partial slot of run b
// for it (its first row block: 2b, its last: 2b + 1).
__device__ __forceinline__ int RunsOf(int rb, int nkb, int64_t L, int G) {
  const int64_t row0 = static_cast<int64_t>(rb) * nkb;
  return BlockOf(row0 + nkb - 1, L, G) - BlockOf(row0, L, G) + 1;
}
__device__ __forceinline__ int SlotOf(int b, int rb, int nkb, int64_t L, int G) {
  return 2 * b + (RunStart(b, L, G) >= static_cast<int64_t>(rb) * nkb ? 0 : 1);
}

// The copy engine's side (sm_90): a stage's copies complete on its `full` barrier, which the
// producer first tells how many bytes to expect; consumers release a stage on its `empty` one.
__device__ __forceinline__ void MbarInit(uint64_t* bar, int count) {
#if DS_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SharedAddress(bar)), "r"(count));
#endif
}
__device__ __forceinline__ void MbarExpectBytes(uint64_t* bar, uint32_t bytes) {
#if DS_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(bar)),
               "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
#if DS_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SharedAddress(bar)) : "memory");
#endif
}
// A 2-D box of a tensor map (coordinates innermost first) into shared memory.
__device__ __forceinline__ void TmaLoad2D(void* dst, const CUtensorMap* map, int c0, int c1,
                                          uint64_t* bar) {
#if DS_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];" ::"r"(SharedAddress(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(SharedAddress(bar))
      : "memory");
#endif
}
// `bytes` contiguous bytes (16-byte aligned, a multiple of 16) into shared memory.
__device__ __forceinline__ void BulkLoad(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if DS_WGMMA
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          SharedAddress(dst)),
      "l"(src), "r"(bytes), "r"(SharedAddress(bar))
      : "memory");
#endif
}

// Grid G (<= kFp8DecodeMaxBlocks); block kThreads; dynamic shared memory SharedBytes(NT).
// wmap: the weights [M][K] in boxes of 128 x 128; xmap: the activations [T][K] in boxes of
// 8 NT x 128 (rows past T read as zeros). partial: [2 G][T][128] f32 (slot 2b: block b's first
// row block, 2b + 1: its last); counters: one per row block, zero between products.
template <int NT>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8StreamKernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                    const Fp8DecodeArgs a, float* __restrict__ partial, int* __restrict__ counters) {
#if DS_WGMMA
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ uint64_t full[kStages], empty[kStages];
  __shared__ int last[2];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* const smem = smem_raw + (((raw + 1023) & ~1023u) - raw);
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  constexpr int N = 8 * NT;
  const int tid = threadIdx.x;
  const int K = a.K, T = a.T, nkb = K / kBlock, G = gridDim.x;
  const int64_t L = static_cast<int64_t>(a.M / kBlock) * nkb;
  const int64_t f0 = RunStart(blockIdx.x, L, G), f1 = RunStart(blockIdx.x + 1, L, G);
  const int ldws = (nkb + 3) / 4 * 4;
  const int t4 = (T + 3) & ~3;

  // Token scales past t4 are never copied: zeros, so that the (zero) products there stay zero.
  for (int i = tid; i < kStages * N; i += kThreads)
    if (i % N >= t4) reinterpret_cast<float*>(smem + (i / N) * StageBytes(NT) + XsOffset(NT))[i % N] = 0.f;
  if (tid == 0) {
    last[0] = last[1] = -1;
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (tid >= kConsumers) {  // the producer warp
    if (tid == kConsumers) {
      const uint32_t bytes = kWeightTileBytes + N * kBlock + 4 * t4 + 16;
      // Groups of kGroup consecutive K blocks are asked for back to back, so that each row's
      // 128-byte pieces reach the memory controllers together (kGroup x 128 contiguous bytes).
      const int n = static_cast<int>(f1 - f0), group = a.group > 0 ? a.group : kGroup;
      int rb = static_cast<int>(f0 / nkb), kb = static_cast<int>(f0 - static_cast<int64_t>(rb) * nkb);
      for (int j0 = 0; j0 < n; j0 += group) {
        const int cnt = min(group, n - j0);
        for (int j = j0; j < j0 + cnt; ++j)
          if (j >= kStages) MbarrierWait(&empty[j % kStages], ((j / kStages) - 1) & 1);
        for (int j = j0; j < j0 + cnt; ++j) {
          const int s = j % kStages;
          uint8_t* st = smem + s * StageBytes(NT);
          MbarExpectBytes(&full[s], bytes);
          if (a.w_tiled)
            BulkLoad(st, a.w + (static_cast<int64_t>(rb) * nkb + kb) * kWeightTileBytes, kWeightTileBytes, &full[s]);
          else
            TmaLoad2D(st, &wmap, kb * kBlock, rb * kBlock, &full[s]);
          if (a.x_tiled)
            BulkLoad(st + kWeightTileBytes, a.x + static_cast<int64_t>(kb) * N * kBlock, N * kBlock, &full[s]);
          else
            TmaLoad2D(st + kWeightTileBytes, &xmap, kb * kBlock, 0, &full[s]);
          BulkLoad(st + XsOffset(NT), a.xs + static_cast<int64_t>(kb) * a.ld_xs, 4 * t4, &full[s]);
          BulkLoad(st + WsOffset(NT), a.ws + static_cast<int64_t>(rb) * ldws + (kb & ~3), 16, &full[s]);
          if (++kb == nkb) kb = 0, ++rb;
        }
      }
    }
  } else {  // the consumer warpgroups: warpgroup wg multiplies rows 64 wg.. of every stage
    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;
    float acc[4 * NT];
#pragma unroll
    for (int i = 0; i < 4 * NT; ++i) acc[i] = 0.f;
    const int n = static_cast<int>(f1 - f0);
    int rb = static_cast<int>(f0 / nkb), kb = static_cast<int>(f0 - static_cast<int64_t>(rb) * nkb);
    int seg_kb = kb;          // the K block this run's part of row block rb started at
    bool first_seg = true;    // rb is this run's first row block
    // Descriptors of stage 0's tiles; a stage's are StageBytes / 16 on, a k32 step's 2 on (the
    // start address field, bits 0..13, never carries: shared addresses are < 256 KiB).
    const uint64_t desc_a = WgmmaDesc(smem_addr + wg * (kWeightTileBytes / 2));
    const uint64_t desc_b = WgmmaDesc(smem_addr + kWeightTileBytes);
    int s = 0;
    uint32_t phase = 0;
    for (int j = 0; j < n; ++j) {
      MbarrierWait(&full[s], phase);
      const uint8_t* st = smem + s * StageBytes(NT);
      const uint64_t stage_desc = static_cast<uint64_t>(s * (StageBytes(NT) >> 4));
      float part[4 * NT];
      WgmmaFence();
      WgmmaFenceOperands(part);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        WgmmaM64K32E4M3SS<NT>(part, desc_a + stage_desc + 2 * k, desc_b + stage_desc + 2 * k, k > 0);
      WgmmaCommit();
      WgmmaWait<0>();
      // The scheme's per-block promotion: the weight block's scale times the token block's (zero
      // past t4: products of zero rows stay zero).
      const float* xs_sm = reinterpret_cast<const float*>(st + XsOffset(NT));
      const float wscale = reinterpret_cast<const float*>(st + WsOffset(NT))[kb & 3];
      WgmmaFenceOperands(part);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float2 xs2 = *reinterpret_cast<const float2*>(xs_sm + 8 * nt + 2 * q);
        const float s0 = wscale * xs2.x, s1 = wscale * xs2.y;
        acc[4 * nt + 0] = fmaf(part[4 * nt + 0], s0, acc[4 * nt + 0]);
        acc[4 * nt + 1] = fmaf(part[4 * nt + 1], s1, acc[4 * nt + 1]);
        acc[4 * nt + 2] = fmaf(part[4 * nt + 2], s0, acc[4 * nt + 2]);
        acc[4 * nt + 3] = fmaf(part[4 * nt + 3], s1, acc[4 * nt + 3]);
      }
      MbarArrive(&empty[s]);  // this stage's buffer may be refilled
      if (++s == kStages) s = 0, phase ^= 1;

      // The row block ends here (its last K block, or the run's end): write it out, whole to y,
      // split between runs as a partial tile (added up after the runs, below).
      const bool row_end = kb == nkb - 1;
      if (!row_end && j + 1 < n) {
        ++kb;
        continue;
      }
      const bool whole = seg_kb == 0 && row_end;
      float* const slot = partial + static_cast<int64_t>(2 * blockIdx.x + (first_seg ? 0 : 1)) * kSlotFloats;
      // Accumulator element 4 nt + e: row 64 wg + 16 warp + g + 8 (e / 2) of the row block,
      // token 8 nt + 2q + (e & 1).
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int token = 8 * nt + 2 * q + (e & 1), r = 64 * wg + 16 * warp + g + 8 * (e >> 1);
          const float v = acc[4 * nt + e];
          acc[4 * nt + e] = 0.f;
          if (token >= T) continue;
          if (whole) {
            float* yp = a.y + static_cast<int64_t>(token) * a.ldy + rb * kBlock + r;
            *yp = a.accumulate ? *yp + v : v;
          } else {
            slot[token * kBlock + r] = v;
          }
        }
      if (first_seg && !whole && j + 1 < n) {
        // The run's first row block, split with the runs before it: counted in now, while the
        // ring keeps streaming (their last row block ends their runs, so this is rarely the last).
        __threadfence();
        asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
        if (tid == 0 && atomicAdd(&counters[rb], 1) == RunsOf(rb, nkb, L, G) - 1) last[0] = rb;
      }
      first_seg = false;
      kb = seg_kb = 0;
      ++rb;
    }
  }

  // The split row blocks: the run's first (counted in above if the run went on past it) and its
  // last. The last run to count a row block in adds every run's tile in run order.
  const int rb_first = static_cast<int>(f0 / nkb), rb_last = static_cast<int>((f1 - 1) / nkb);
  const bool single_split = rb_first == rb_last && (f0 % nkb != 0 || f1 % nkb != 0);
  const bool tail_split = rb_last != rb_first && f1 % nkb != 0;
  if (single_split || tail_split) __threadfence();
  __syncthreads();
  if (tid == 0 && (single_split || tail_split) &&
      atomicAdd(&counters[rb_last], 1) == RunsOf(rb_last, nkb, L, G) - 1)
    last[1] = rb_last;
  __syncthreads();
  for (int w = 0; w < 2; ++w) {
    const int rb = last[w];
    if (rb < 0) continue;
    __threadfence();
    const int64_t row0 = static_cast<int64_t>(rb) * nkb;
    const int b_first = BlockOf(row0, L, G), b_last = BlockOf(row0 + nkb - 1, L, G);
    // T x 128 sums, 4 rows per float4: every thread (the producer warp's too) 2 float4 of up to
    // 8 runs' tiles in flight at once, added in run order.
    constexpr int kU = 2, kC = 8;
    for (int v0 = 0; v0 < T * 32; v0 += kU * kThreads) {
      float4 sum[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) sum[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int b0 = b_first; b0 <= b_last; b0 += kC) {
        float4 p[kC][kU];
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          const float4* src = reinterpret_cast<const float4*>(
              partial + static_cast<int64_t>(SlotOf(b0 + c, rb, nkb, L, G)) * kSlotFloats);
#pragma unroll
          for (int u = 0; u < kU; ++u) {
            const int v = v0 + tid + kThreads * u;
            p[c][u] = b0 + c <= b_last && v < T * 32 ? __ldcg(src + v) : make_float4(0.f, 0.f, 0.f, 0.f);
          }
        }
#pragma unroll
        for (int c = 0; c < kC; ++c)
#pragma unroll
          for (int u = 0; u < kU; ++u)
            if (b0 + c <= b_last) {
              sum[u].x += p[c][u].x;
              sum[u].y += p[c][u].y;
              sum[u].z += p[c][u].z;
              sum[u].w += p[c][u].w;
            }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int v = v0 + tid + kThreads * u;
        if (v >= T * 32) continue;
        const int t = v >> 5, r = 4 * (v & 31);
        float* yp = a.y + static_cast<int64_t>(t) * a.ldy + rb * kBlock + r;
        const float o[4] = {sum[u].x, sum[u].y, sum[u].z, sum[u].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) yp[i] = a.accumulate ? yp[i] + o[i] : o[i];
      }
    }
    if (tid == 0) counters[rb] = 0;  // for the next product (stream order)
  }
#endif
}

// One thread per 16-byte chunk of the tiled image.
__global__ void TileWeightsKernel(const uint8_t* __restrict__ w, int M, int K, uint8_t* __restrict__ tiled) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // chunk of w
  if (i >= static_cast<int64_t>(M) * K / 16) return;
  const int64_t r = i / (K / 16);
  const int k16 = static_cast<int>(i - r * (K / 16));
  const int rb = static_cast<int>(r / kBlock), rr = static_cast<int>(r % kBlock);
  const int kb = k16 / 8, c = k16 % 8;
  uint8_t* dst = tiled + (static_cast<int64_t>(rb) * (K / kBlock) + kb) * kWeightTileBytes + SwizzledOffset(rr, c);
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(w + r * K + 16 * k16);
}

__global__ void TileActivationsKernel(const uint8_t* __restrict__ x, int T, int K, int W,
                                      uint8_t* __restrict__ tiled) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // chunk of the image
  if (i >= static_cast<int64_t>(W) * K / 16) return;
  const int kb = static_cast<int>(i / (W * 8)), rem = static_cast<int>(i % (W * 8));
  const int t = rem / 8, c = rem % 8;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (t < T) v = *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * K + kb * kBlock + 16 * c);
  *reinterpret_cast<uint4*>(tiled + static_cast<int64_t>(kb) * W * kBlock + SwizzledOffset(t, c)) = v;
}

template <typename F>
bool DispatchTiles(int T, F&& f) {
  switch ((T + 15) / 16) {
    case 1: f(std::integral_constant<int, 2>{}); return true;
    case 2: f(std::integral_constant<int, 4>{}); return true;
    case 3: f(std::integral_constant<int, 6>{}); return true;
    case 4: f(std::integral_constant<int, 8>{}); return true;
    default: return false;
  }
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link to libcuda), or null
// where the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// The map of `rows` rows of K bytes at p (K % 16 == 0), read in boxes of box_rows x 128 bytes,
// 128-byte swizzled (wgmma.cuh's tile layout); rows past the end read as zeros.
absl::Status EncodeRows(CUtensorMap* map, const uint8_t* p, int rows, int K, int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(K)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBlock), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = EncodeTiled()(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(p),
                                   dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return absl::InternalError(absl::StrCat("Fp8DecodeGemm: cuTensorMapEncodeTiled failed (", static_cast<int>(r),
                                            ") for ", rows, " x ", K, " bytes, boxes of ", box_rows));
  return absl::OkStatus();
}

// EncodeRows through a per-thread cache: a decode step multiplies the same weights and
// activation buffers every time, and encoding is a driver call per map.
absl::Status CachedRows(CUtensorMap* map, const uint8_t* p, int rows, int K, int box_rows) {
  using Key = std::tuple<const uint8_t*, int, int, int>;
  thread_local std::map<Key, CUtensorMap> cache;
  const Key key{p, rows, K, box_rows};
  if (auto it = cache.find(key); it != cache.end()) {
    *map = it->second;
    return absl::OkStatus();
  }
  DS_RETURN_IF_ERROR(EncodeRows(map, p, rows, K, box_rows));
  if (cache.size() >= 4096) cache.clear();  // freed and reused addresses: bounded, re-encoded
  cache.emplace(key, *map);
  return absl::OkStatus();
}

int64_t PartialFloats() { return 2LL * kFp8DecodeMaxBlocks * kSlotFloats; }

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
  return M > 0 && M % kBlock == 0 && K > 0 && K % kBlock == 0 && T >= 1 && T <= kFp8DecodeMaxTokens;
}

int Fp8DecodeBlocks(int M, int K) {
  static std::atomic<int> sms_of[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev >= 64) dev = 0;
  int sms = sms_of[dev].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1)
      sms = 1;
    sms_of[dev].store(sms, std::memory_order_relaxed);
  }
  const int64_t blocks = static_cast<int64_t>(std::max(1, M / kBlock)) * std::max(1, K / kBlock);
  return static_cast<int>(std::min<int64_t>({sms, kFp8DecodeMaxBlocks, blocks}));
}

absl::Status Fp8TileWeights(const uint8_t* w, int M, int K, uint8_t* tiled, cudaStream_t stream) {
  if (M <= 0 || M % kBlock != 0 || K <= 0 || K % kBlock != 0)
    return absl::InvalidArgumentError(absl::StrCat("Fp8TileWeights: ", M, " x ", K));
  const int64_t n = static_cast<int64_t>(M) * K / 16;
  TileWeightsKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(w, M, K, tiled);
  return LastLaunchStatus("Fp8TileWeights");
}

absl::Status Fp8TileActivations(const uint8_t* x, int T, int K, uint8_t* tiled, cudaStream_t stream) {
  if (T < 1 || T > kFp8DecodeMaxTokens || K <= 0 || K % kBlock != 0)
    return absl::InvalidArgumentError(absl::StrCat("Fp8TileActivations: ", T, " x ", K));
  const int W = Fp8DecodeWidth(T);
  const int64_t n = static_cast<int64_t>(W) * K / 16;
  TileActivationsKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, T, K, W, tiled);
  return LastLaunchStatus("Fp8TileActivations");
}

bool Fp8DecodeAvailable() { return WgmmaAvailable() && EncodeTiled() != nullptr; }

absl::Status Fp8DecodeGemm(const Fp8DecodeArgs& a, void* scratch, int max_m, cudaStream_t stream) {
  if (!Fp8DecodeTakes(a.M, a.K, a.T) || a.M > max_m || a.ldy < a.M || a.ld_xs < a.T ||
      a.ld_xs % 4 != 0 || a.blocks < 0 || a.group < 0 || (a.group > 0 && kStages % a.group != 0))
    return absl::InvalidArgumentError(absl::StrCat(
        "Fp8DecodeGemm: M ", a.M, " (a multiple of 128, at most ", max_m, "), K ", a.K,
        " (a multiple of 128), T ", a.T, " (1..", kFp8DecodeMaxTokens, "), ldy ", a.ldy, ", ld_xs ",
        a.ld_xs, " (>= T, a multiple of 4), blocks ", a.blocks));
  const int64_t L = static_cast<int64_t>(a.M / kBlock) * (a.K / kBlock);
  if (a.blocks > kFp8DecodeMaxBlocks || a.blocks > L)
    return absl::InvalidArgumentError(absl::StrCat("Fp8DecodeGemm: ", a.blocks, " blocks for ", L,
                                                   " weight blocks (at most ", kFp8DecodeMaxBlocks, ")"));
  for (const void* p : {static_cast<const void*>(a.w), static_cast<const void*>(a.x),
                        static_cast<const void*>(a.xs), static_cast<const void*>(a.ws)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      return absl::InvalidArgumentError("Fp8DecodeGemm: weights, activations and scales must be 16-byte aligned");
  if (!Fp8DecodeAvailable())
    return absl::FailedPreconditionError(
        "Fp8DecodeGemm: needs Hopper's wgmma and tensor copies (compute capability 9.0, sm_90a code)");
  const int G = a.blocks > 0 ? a.blocks : Fp8DecodeBlocks(a.M, a.K);
  float* partial = static_cast<float*>(scratch);
  int* counters = reinterpret_cast<int*>(partial + PartialFloats());
  CUtensorMap wmap, xmap;
  DS_RETURN_IF_ERROR(CachedRows(&wmap, a.w, a.M, a.K, kBlock));
  DS_RETURN_IF_ERROR(CachedRows(&xmap, a.x, a.T, a.K, Fp8DecodeWidth(a.T)));
  DispatchTiles(a.T, [&](auto tag) {
    constexpr int NT = decltype(tag)::value;
    AllowSharedBytes<Fp8StreamKernel<NT>>(SharedBytes(NT));
    Fp8StreamKernel<NT><<<G, kThreads, SharedBytes(NT), stream>>>(wmap, xmap, a, partial, counters);
  });
  return LastLaunchStatus("Fp8DecodeGemm");
}

}  // namespace ds::cuda
