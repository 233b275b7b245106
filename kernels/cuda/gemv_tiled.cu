// Tiled Q6_K: repack, dequantization and the int8 tensor-core matmul (see gemv_tiled.cuh).
#include "kernels/cuda/gemv_tiled.cuh"

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/tiled_formats.cuh"
#include "kernels/cuda/tiled_q6k.cuh"

namespace ds::cuda {
namespace {

using namespace tiled;  // NOLINT: the layout helpers (tiled_q6k.cuh)

constexpr int kQ6Bytes = 210;  // GGUF block_q6_K: ql[128] qh[64] scales[16] d
// One column's activations staged in shared memory (TiledKernel's kStageX): xq [K] bytes, then
// xd [K/32] floats, then (with sums) xsum [K/16] int32. The kernel and LaunchTiled both use these.
__host__ __device__ constexpr int StagedXdOffset(int K) { return K; }
__host__ __device__ constexpr int StagedSumOffset(int K) { return K + K / 8; }
constexpr size_t StagedBytes(int K, bool sums) { return StagedSumOffset(K) + (sums ? K / 4 : 0); }
// A block = 4 warps splitting the K units of one 16-row tile (8 measured worse on the H200,
// 2026-11-29: no gain at 1 column, 81.0 vs 81.1 tok/s; x16 743 vs 796 tok/s).
constexpr int kWarps = 4;

// t = (q - 32) & 63 of element e (0..255) of a raw Q6_K block: the centred 6-bit quant.
__device__ __forceinline__ uint32_t Q6Centred(const uint8_t* blk, int e) {
  const int half = e >> 7, l = e & 127, qo = l >> 5, l32 = l & 31;
  const uint8_t lo = blk[64 * half + l32 + 32 * (qo & 1)];
  const uint8_t hi = blk[128 + 32 * half + l32];
  const uint32_t q = ((qo >= 2 ? lo >> 4 : lo) & 0xF) | (((hi >> (2 * qo)) & 3) << 4);
  return (q ^ 0x20u) & 0x3Fu;
}

// One warp per tile-unit; thread T writes its own ql / qh words, threads 0..15 a scale row,
// threads 0..7 a d pair. Rows past `rows` (padding of the last tile) are zero.
__global__ void TileRowsKernel(const uint8_t* __restrict__ raw, int64_t rows, int nu, int64_t rb,
                               uint8_t* __restrict__ dst) {
  const int T = threadIdx.x, g = T >> 2, q = T & 3;
  const int64_t tu = blockIdx.x;  // tile-unit index within the chunk
  const int64_t tile = tu / nu;
  const int u = static_cast<int>(tu % nu);
  const int64_t r0 = tile * kTiledRows + g, r1 = r0 + 8;
  const uint8_t* b0 = r0 < rows ? raw + r0 * rb + static_cast<int64_t>(u) * kQ6Bytes : nullptr;
  const uint8_t* b1 = r1 < rows ? raw + r1 * rb + static_cast<int64_t>(u) * kQ6Bytes : nullptr;
  uint8_t* out = dst + tu * kTileUnitBytes;
  uint32_t qh_words[8] = {};
  for (int s = 0; s < 16; ++s) {
    uint32_t ql = 0;
    for (int j = 0; j < 4; ++j) {
      const int e = 16 * s + 4 * q + j;
      const uint32_t t0 = b0 ? Q6Centred(b0, e) : 0, t1 = b1 ? Q6Centred(b1, e) : 0;
      ql |= ((t0 & 0xF) | ((t1 & 0xF) << 4)) << (8 * j);
      const int p = s & 1;
      qh_words[s >> 1] |= (((t0 >> 4) << (4 * p)) | ((t1 >> 4) << (4 * p + 2))) << (8 * j);
    }
    *reinterpret_cast<uint32_t*>(out + 512 * (s >> 2) + 16 * T + 4 * (s & 3)) = ql;
  }
  for (int w8 = 0; w8 < 8; ++w8)  // steps 2*w8, 2*w8+1: i = w8 / 4, word w = w8 % 4
    *reinterpret_cast<uint32_t*>(out + kOffQh + 512 * (w8 >> 2) + 16 * T + 4 * (w8 & 3)) = qh_words[w8];
  if (T < 16) {
    const int64_t r = tile * kTiledRows + T;
    const uint8_t* b = r < rows ? raw + r * rb + static_cast<int64_t>(u) * kQ6Bytes : nullptr;
    for (int s = 0; s < 16; ++s) out[kOffSc + 16 * T + s] = b ? b[192 + s] : 0;
  }
  if (T < 8) {  // rows T and T + 8 (not this thread's rows g, g + 8)
    const int64_t ra = tile * kTiledRows + T, rc = ra + 8;
    const uint8_t* ba = ra < rows ? raw + ra * rb + static_cast<int64_t>(u) * kQ6Bytes : nullptr;
    const uint8_t* bc = rc < rows ? raw + rc * rb + static_cast<int64_t>(u) * kQ6Bytes : nullptr;
    const uint16_t d0 = ba ? *reinterpret_cast<const uint16_t*>(ba + 208) : 0;
    const uint16_t d1 = bc ? *reinterpret_cast<const uint16_t*>(bc + 208) : 0;
    *reinterpret_cast<uint32_t*>(out + kOffD + 4 * T) = d0 | (static_cast<uint32_t>(d1) << 16);
  }
}

__device__ __forceinline__ float F4At(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

struct TiledLaunch {
  GemvArgs seg[kGemvMaxSegs];
  int blk_end[kGemvMaxSegs];
  int n_segs;
};

// Block = one 16-row tile (of w and w2 in pair mode) x all nc <= 8*NT columns; warp w takes
// units w, w+4, ...; per unit and step one mma per n-tile of 8 columns. Thread (g, q) holds C
// entries rows {g, g+8} x columns {8j + 2q, 8j + 2q + 1}.
// The 1..8-column gate/up pair is held to 96 registers (5 blocks per SM instead of 4):
// 49.9-50.0 vs 52.8-52.9 us per 27B launch (tiled_gemv_bench, H200); single matrices spill at that
// bound and lose 20-40% (kernels/cuda/README.md).
// kOneCol (nc == 1, the single-stream decode step): only C column 2q of a thread can be column 0,
// so the odd C entries (columns 2q + 1) are dead and their epilogue is not computed; the live
// entries see the same float operations as with kOneCol off.
// kSums (a.xsum given; one column, single matrices): the weights go into the mma unsigned
// (q = t ^ 32, no sign extension) and C starts at 1.5 * 2^23 - 32 * (the sum of the step's 16
// activations), so D is the same exact integer as with the centred weights. Held to 4 blocks per
// SM (128 registers; unbounded it takes 140 and qkv+z-sized grids lose 10%). The pair has no
// registers left for the 16 sums at 5 blocks per SM (it spills and loses 14%; kernels/cuda/README.md).
template <int NT, bool kPair, bool kOneCol, bool kSums, bool kStageX>
__global__ void __launch_bounds__(kWarps * 32, NT == 1 && kPair ? 5 : kSums ? 4 : 0) TiledKernel(const __grid_constant__ TiledLaunch L) {
  static_assert(!kOneCol || NT == 1, "kOneCol is the 1-column case of the 8-column tile");
  static_assert(!kSums || (kOneCol && !kPair), "kSums is for one column of a single matrix");
  static_assert(!kStageX || kOneCol, "staged activations: the one-column forms");
  constexpr int P = kPair ? 2 : 1;
  constexpr int NCB = NT * 8;
  __shared__ float red[kWarps][P][kTiledRows][NCB];
  // kStageX (one column; GemvArgs::stage_activations): the block's activations (xq [K], xd
  // [K/32], kSums: xsum [K/16]) are copied into shared memory once, after the wait for the
  // kernel ahead; every unit then reads its operands there instead of from L2. Why: ncu on
  // ffn_down at one column (H200) showed a warp issuing once per ~6 cycles, ~60% of it waiting on
  // L1TEX loads, and the launch took ~25 us with 132 tiles as with 320: the time was each warp's
  // chain of 17 units, each starting with activation loads that missed L1 (docs/perf/h200.md,
  // 2026-12-04). LaunchTiled gives the dynamic bytes.
  extern __shared__ __align__(16) uint8_t xstage[];
  int si = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxSegs; ++i)
    if (i < L.n_segs && static_cast<int>(blockIdx.x) >= L.blk_end[i - 1]) si = i;
  const GemvArgs& a = L.seg[si];
  const int tile = blockIdx.x - (si > 0 ? L.blk_end[si - 1] : 0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int nu = a.K / kUnitElems, kb = a.K / 32, nc = a.nc;

  // B operand: column 8j + g, bytes 16s + 4q .. +3 of each unit; C columns 8j + 2q (+1) scale by
  // their activation block scales. Columns past nc read column nc-1: the mma keeps columns apart,
  // so they only fill C columns that are never stored. The pointers walk this warp's units
  // (u = warp, warp + 4, ...); every load of a unit is at a constant offset from them.
  const uint8_t* wp[P];
  wp[0] = static_cast<const uint8_t*>(a.w) + (static_cast<int64_t>(tile) * nu + warp) * kTileUnitBytes;
  if constexpr (kPair)
    wp[P - 1] = static_cast<const uint8_t*>(a.w2) + (static_cast<int64_t>(tile) * nu + warp) * kTileUnitBytes;
  const int8_t* xb[NT];
  const float* xs[NT][2];
  const int32_t* xsum = a.xsum + warp * 16;  // kSums: the sums of this warp's units
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    xb[j] = a.xq + static_cast<int64_t>(min(8 * j + g, nc - 1)) * a.K + 4 * q + warp * kUnitElems;
#pragma unroll
    for (int e = 0; e < 2; ++e)
      xs[j][e] = a.xd + static_cast<int64_t>(min(8 * j + 2 * q + e, nc - 1)) * kb + warp * 8;
  }

  // Before the wait for the kernel ahead (a no-op unless launched early): only the weights, which
  // no kernel writes; for single matrices the warp's first unit into registers.
  constexpr bool kHoist = NT == 1;
  constexpr bool kPrefetch = NT == 1 && !kPair;
  TileUnit next;  // kPrefetch: the warp's next unit, loading while this one is multiplied
  if constexpr (kPrefetch)
    if (warp < nu) LoadTileUnit(next, wp[0], lane);
  WaitForPrerequisiteGrids();
  const uint8_t* sxq = xstage;
  const float* sxd = reinterpret_cast<const float*>(xstage + StagedXdOffset(a.K));
  const int32_t* ssum = reinterpret_cast<const int32_t*>(xstage + StagedSumOffset(a.K));
  if constexpr (kStageX) {
    // K % 256 == 0; xq, xd and xsum are 16-byte aligned (TiledGemvMulti checks xd and xsum).
    for (int i = threadIdx.x; i < a.K / 16; i += kWarps * 32)
      reinterpret_cast<uint4*>(xstage)[i] = __ldg(reinterpret_cast<const uint4*>(a.xq) + i);
    for (int i = threadIdx.x; i < a.K / 128; i += kWarps * 32)
      reinterpret_cast<float4*>(xstage + StagedXdOffset(a.K))[i] = __ldg(reinterpret_cast<const float4*>(a.xd) + i);
    if constexpr (kSums)
      for (int i = threadIdx.x; i < a.K / 64; i += kWarps * 32)
        reinterpret_cast<uint4*>(xstage + StagedSumOffset(a.K))[i] = __ldg(reinterpret_cast<const uint4*>(a.xsum) + i);
    __syncthreads();
  }

  float acc[P][NT][4];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[p][j][e] = 0.f;

  // Up to 8 columns (the decode and MTP-verify steps), a unit's operands are all loaded before its
  // first mma: the 16 B words, the 8 block scales of both C columns as four 16-byte loads, and,
  // for a single matrix, the weights of the warp's next unit (one unit in flight while this one
  // is multiplied). tiled_gemv_bench, H200: 8.78 -> ~7.7 ms per 27B step of decode matmuls; the
  // next-unit prefetch costs the gate/up pair 9% (kernels/cuda/README.md, "Tiled Q6_K").
  for (int u = warp; u < nu; u += kWarps) {
    TileUnit tu[P];
    if constexpr (kPrefetch) {
      tu[0] = next;
      if (u + kWarps < nu) LoadTileUnit(next, wp[0] + kWarps * kTileUnitBytes, lane);
    } else {
#pragma unroll
      for (int p = 0; p < P; ++p) LoadTileUnit(tu[p], wp[p], lane);
    }
    uint32_t b_unit[16];
    float4 xs_unit[2][2];  // [column 2q / 2q+1][blocks 0-3 / 4-7]
    if constexpr (kStageX) {  // column 0's operands of unit u, from shared memory
#pragma unroll
      for (int s = 0; s < 16; ++s)
        b_unit[s] = *reinterpret_cast<const uint32_t*>(sxq + u * kUnitElems + 4 * q + 16 * s);
#pragma unroll
      for (int h = 0; h < 2; ++h) xs_unit[0][h] = xs_unit[1][h] = *reinterpret_cast<const float4*>(sxd + u * 8 + 4 * h);
    } else if constexpr (kHoist) {
#pragma unroll
      for (int s = 0; s < 16; ++s) b_unit[s] = __ldg(reinterpret_cast<const uint32_t*>(xb[0] + 16 * s));
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int h = 0; h < 2; ++h) xs_unit[e][h] = __ldg(reinterpret_cast<const float4*>(xs[0][e] + 4 * h));
    }
    uint4 sum_unit[4];  // kSums: the 16 steps' activation sums
    if constexpr (kSums) {
#pragma unroll
      for (int h = 0; h < 4; ++h)
        sum_unit[h] = kStageX ? *reinterpret_cast<const uint4*>(ssum + u * 16 + 4 * h)
                              : __ldg(reinterpret_cast<const uint4*>(xsum + 4 * h));
#pragma unroll
      for (int p = 0; p < P; ++p) {  // t ^ 32 = q: flip bit 5 of every 6-bit value (bit 1 of its qh pair)
        tu[p].qh[0] = Xor4(tu[p].qh[0], 0xAAAAAAAAu);
        tu[p].qh[1] = Xor4(tu[p].qh[1], 0xAAAAAAAAu);
      }
    }
    float dg[P], dg8[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      dg[p] = HalfBitsToF32(tu[p].d & 0xFFFF);
      dg8[p] = HalfBitsToF32(tu[p].d >> 16);
    }
    float part[P][NT][4];
#pragma unroll
    for (int s = 0; s < 16; ++s) {
      uint32_t bw[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j)
        bw[j] = kHoist ? b_unit[s] : __ldg(reinterpret_cast<const uint32_t*>(xb[j] + 16 * s));
#pragma unroll
      for (int p = 0; p < P; ++p) {
        uint32_t a0, a1;
        if constexpr (kSums)
          DecodeStepUnsigned(Word(tu[p].ql[s >> 2], s & 3), Word(tu[p].qh[s >> 3], (s & 7) >> 1), s & 1, a0, a1);
        else
          DecodeStep(Word(tu[p].ql[s >> 2], s & 3), Word(tu[p].qh[s >> 3], (s & 7) >> 1), s & 1, a0, a1);
        const float s0 = dg[p] * static_cast<float>(static_cast<int8_t>(Word(tu[p].sc0, s >> 2) >> (8 * (s & 3))));
        const float s1 = dg8[p] * static_cast<float>(static_cast<int8_t>(Word(tu[p].sc1, s >> 2) >> (8 * (s & 3))));
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          float f[4];
          if constexpr (kSums) {
            const int c = kMmaBias - 32 * static_cast<int>(Word(sum_unit[s >> 2], s & 3));
            MmaFrom(a0, a1, bw[j], c, c, f);  // C column 2q + 1 is dead at one column
          } else {
            Mma(a0, a1, bw[j], f);
          }
          if ((s & 1) == 0) {
            part[p][j][0] = s0 * f[0];
            part[p][j][2] = s1 * f[2];
            if constexpr (!kOneCol) {
              part[p][j][1] = s0 * f[1];
              part[p][j][3] = s1 * f[3];
            }
          } else {
            part[p][j][0] = fmaf(s0, f[0], part[p][j][0]);
            part[p][j][2] = fmaf(s1, f[2], part[p][j][2]);
            if constexpr (!kOneCol) {
              part[p][j][1] = fmaf(s0, f[1], part[p][j][1]);
              part[p][j][3] = fmaf(s1, f[3], part[p][j][3]);
            }
          }
        }
      }
      if (s & 1) {  // both sub-blocks of a 32-element activation block done: apply its scale
        const int blk = s >> 1;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          float x0, x1;
          if constexpr (kHoist) {
            x0 = F4At(xs_unit[0][blk >> 2], blk & 3);
            x1 = F4At(xs_unit[1][blk >> 2], blk & 3);
          } else {
            x0 = __ldg(xs[j][0] + blk);
            x1 = __ldg(xs[j][1] + blk);
          }
#pragma unroll
          for (int p = 0; p < P; ++p) {
            acc[p][j][0] = fmaf(x0, part[p][j][0], acc[p][j][0]);
            acc[p][j][2] = fmaf(x0, part[p][j][2], acc[p][j][2]);
            if constexpr (!kOneCol) {
              acc[p][j][1] = fmaf(x1, part[p][j][1], acc[p][j][1]);
              acc[p][j][3] = fmaf(x1, part[p][j][3], acc[p][j][3]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int p = 0; p < P; ++p) wp[p] += kWarps * kTileUnitBytes;
    if constexpr (kSums) xsum += kWarps * 16;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      xb[j] += kWarps * kUnitElems;
      xs[j][0] += kWarps * 8;
      xs[j][1] += kWarps * 8;
    }
  }

  AllowDependentLaunch();  // the next kernel may be scheduled during the reduction below

#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp][p][g + 8 * (e >> 1)][8 * j + 2 * q + (e & 1)] = acc[p][j][e];
  __syncthreads();
  const int row0 = tile * kTiledRows;
  const int64_t ldy = a.ldy ? a.ldy : a.M;
  for (int o = threadIdx.x; o < kTiledRows * NCB; o += kWarps * 32) {
    const int r = o % kTiledRows, c = o / kTiledRows;
    if (c >= nc || row0 + r >= a.M) continue;
    float v[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      v[p] = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v[p] += red[w][p][r][c];
    }
    float* dst = a.y + c * ldy + row0 + r;
    if constexpr (kPair) *dst = Silu(v[0]) * v[P - 1];
    else *dst = a.epilogue == GemvEpilogue::kAccumulate ? *dst + v[0] : v[0];
  }
}

// One thread per (tile-unit, thread slot T, step s): the 8 values of the step's A fragments.
// (Thread order: DequantSlotOf, tiled_q6k.cuh.)
__global__ void DequantTiledKernel(const uint8_t* __restrict__ tiled, int64_t tu0, int64_t n_tu,
                                   int nu, int64_t row0, int64_t rows, int K,
                                   uint16_t* __restrict__ out, bool bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tu * 512) return;
  const auto [q, s, g, T, u, tu, tile] = DequantSlotOf(i, tu0, nu);
  const uint8_t* p = tiled + tu * kTileUnitBytes;
  uint32_t a[2];
  DecodeStep(*reinterpret_cast<const uint32_t*>(p + 512 * (s >> 2) + 16 * T + 4 * (s & 3)),
             *reinterpret_cast<const uint32_t*>(p + kOffQh + 512 * (s >> 3) + 16 * T + 4 * ((s & 7) >> 1)),
             s & 1, a[0], a[1]);
  for (int h = 0; h < 2; ++h) {
    const int rr = g + 8 * h;
    const int64_t r = tile * kTiledRows + rr - row0;
    if (r < 0 || r >= rows) continue;
    const float d = HalfBitsToF32(*reinterpret_cast<const uint16_t*>(p + kOffD + 4 * g + 2 * h));
    const float sc = d * static_cast<float>(static_cast<int8_t>(p[kOffSc + 16 * rr + s]));
    uint16_t v[4];
    for (int j = 0; j < 4; ++j) {
      const float x = sc * static_cast<float>(static_cast<int8_t>(a[h] >> (8 * j)));
      v[j] = bf16 ? F32ToBf16Bits(x) : __half_as_ushort(__float2half_rn(x));
    }
    uint2 o;
    o.x = v[0] | (static_cast<uint32_t>(v[1]) << 16);
    o.y = v[2] | (static_cast<uint32_t>(v[3]) << 16);
    *reinterpret_cast<uint2*>(out + r * K + u * 256 + 16 * s + 4 * q) = o;
  }
}

template <int NT>
void LaunchTiled(TiledLaunch& L, cudaStream_t s) {
  int end = 0;
  for (int i = 0; i < L.n_segs; ++i) {
    end += CeilDiv(L.seg[i].M, kTiledRows);
    L.blk_end[i] = end;
  }
  const bool pair = L.seg[0].epilogue == GemvEpilogue::kSiluMul;
  if constexpr (NT == 1) {
    // tiled_gemv_bench, H200, 64 layers of the 27B at 1 column: 7.56 -> 7.33 ms with kOneCol,
    // 7.11 with the sums of ssm_out and ffn_down (29.6 -> 26.5 us, 13.0 -> 12.5 us). From 2
    // columns the sums cost more than they save (4 columns: 7.64 -> 8.45-8.57 ms).
    // Only these 1..8-column forms (decode and MTP steps, where a launch is a few tens of
    // microseconds and its start a visible share of it) launch early (GemvArgs::early_launch).
    const bool one = L.seg[0].nc == 1;
    // One column stages its activations (kStageX; GemvArgs::stage_activations): K + K/8 (+ K/4
    // with sums) bytes, 23.4 KiB at the 27B's largest K. tiled_gemv_bench, H200, 64 layers of
    // the 27B at 1 column: 7.28 -> 6.78 ms (ffn_down 29.2 -> 27.1 us, gate+up 47.0 -> 44.0).
    // From 2 columns staging measured no better (5 columns: 7.82 -> 7.89 ms with bank-spread
    // columns, 8.06 without; the MTP k=4 cycle 12.08 -> 12.16 ms), so those forms read the
    // activations from L2 as before and pass their one kernel as both (kernels/cuda/README.md).
    const size_t bytes = StagedBytes(L.seg[0].K, L.seg[0].xsum != nullptr);
    const bool stage = one && L.seg[0].stage_activations;
    auto launch = [&](auto staged, auto plain) {
      if (!stage) {
        LaunchMaybeEarly(plain, end, kWarps * 32, 0, s, L.seg[0].early_launch, L);
        return;
      }
      // Past the default 48 KiB of shared memory (K > ~34k with sums) the kernel must be allowed
      // the bytes; a failure surfaces as the launch's error.
      if (bytes + sizeof(float) * kWarps * 2 * kTiledRows * 8 > 48 * 1024)  // + the pair's `red`
        (void)cudaFuncSetAttribute(staged, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(bytes));
      LaunchMaybeEarly(staged, end, kWarps * 32, bytes, s, L.seg[0].early_launch, L);
    };
    if (pair) {
      if (one) launch(TiledKernel<1, true, true, false, true>, TiledKernel<1, true, true, false, false>);
      else launch(TiledKernel<1, true, false, false, false>, TiledKernel<1, true, false, false, false>);
    } else if (one) {
      if (L.seg[0].xsum != nullptr)
        launch(TiledKernel<1, false, true, true, true>, TiledKernel<1, false, true, true, false>);
      else
        launch(TiledKernel<1, false, true, false, true>, TiledKernel<1, false, true, false, false>);
    } else {
      launch(TiledKernel<1, false, false, false, false>, TiledKernel<1, false, false, false, false>);
    }
    return;
  }
  if constexpr (NT <= 4) {  // 64-column pairs are split in two by TiledGemvMulti
    if (pair) {
      TiledKernel<NT, true, false, false, false><<<end, kWarps * 32, 0, s>>>(L);
      return;
    }
  }
  TiledKernel<NT, false, false, false, false><<<end, kWarps * 32, 0, s>>>(L);
}

}  // namespace

bool TiledSupported(GgmlType t) {
  return t == GgmlType::Q6_K || t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q8_0 ||
         t == GgmlType::IQ4_XS || t == GgmlType::IQ4_NL;
}
bool TiledInt8Supported(GgmlType t) { return t == GgmlType::Q6_K; }

int TiledUnitBytes(GgmlType t) {
  switch (t) {
    case GgmlType::Q6_K: return kTileUnitBytes;
    case GgmlType::Q4_K: return tiled_kq::UnitBytes(false);
    case GgmlType::Q5_K: return tiled_kq::UnitBytes(true);
    case GgmlType::Q8_0: return tiled_q8::kUnitBytes;
    case GgmlType::IQ4_XS: return tiled_iq4xs::kUnitBytes;
    case GgmlType::IQ4_NL: return tiled_iq4nl::kUnitBytes;
    default: return 0;
  }
}

bool TiledAvailable(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return false;
  return prop.major >= 8;
}

uint64_t TiledBytes(GgmlType t, int64_t M, int K) {
  if (!TiledSupported(t) || K % kUnitElems != 0) return 0;
  return static_cast<uint64_t>(CeilDiv(M, kTiledRows)) * (K / kUnitElems) * TiledUnitBytes(t);
}

absl::Status TileRows(GgmlType t, const void* raw, int64_t row0, int64_t rows, int K, void* tiled,
                      cudaStream_t stream) {
  if (!TiledSupported(t))
    return absl::UnimplementedError(absl::StrCat("TileRows: no tiled layout for ", std::string(GgmlInfo(t).name)));
  if (K % kUnitElems != 0 || row0 % kTiledRows != 0 || rows < 0)
    return absl::InvalidArgumentError(absl::StrCat("TileRows: bad shape row0=", row0, " rows=", rows, " K=", K));
  if (rows == 0) return absl::OkStatus();
  const int nu = K / kUnitElems;
  const int64_t n_tu = static_cast<int64_t>(CeilDiv(rows, kTiledRows)) * nu;
  uint8_t* dst = static_cast<uint8_t*>(tiled) + row0 / kTiledRows * nu * static_cast<int64_t>(TiledUnitBytes(t));
  if (t != GgmlType::Q6_K)
    return TileRowsF16Format(t, raw, rows, K, static_cast<int64_t>(GgmlRowBytes(t, K)), dst, stream);
  TileRowsKernel<<<static_cast<unsigned>(n_tu), 32, 0, stream>>>(
      static_cast<const uint8_t*>(raw), rows, nu, static_cast<int64_t>(GgmlRowBytes(t, K)), dst);
  return LastLaunchStatus("TileRows");
}

absl::Status DequantizeTiledRows(GgmlType t, const void* tiled, int64_t row0, int64_t rows, int K,
                                 void* out, bool bf16, cudaStream_t stream) {
  if (!TiledSupported(t) || K % kUnitElems != 0 || row0 < 0 || rows < 0)
    return absl::InvalidArgumentError(absl::StrCat("DequantizeTiledRows: bad args row0=", row0, " rows=", rows, " K=", K));
  if (rows == 0 || K == 0) return absl::OkStatus();
  if (t != GgmlType::Q6_K) return DequantizeTiledRowsF16Format(t, tiled, row0, rows, K, out, bf16, stream);
  const int nu = K / kUnitElems;
  const int64_t t0 = row0 / kTiledRows, t1 = (row0 + rows - 1) / kTiledRows + 1;
  const int64_t n_tu = (t1 - t0) * nu;
  DequantTiledKernel<<<CeilDiv(n_tu * 512, 256), 256, 0, stream>>>(
      static_cast<const uint8_t*>(tiled), t0 * nu, n_tu, nu, row0, rows, K,
      static_cast<uint16_t*>(out), bf16);
  return LastLaunchStatus("DequantizeTiledRows");
}

absl::Status TiledGemvMulti(const GemvArgs* segs, int n_segs, cudaStream_t stream) {
  if (n_segs < 1 || n_segs > kGemvMaxSegs)
    return absl::InvalidArgumentError(absl::StrCat("TiledGemvMulti: ", n_segs, " segments outside [1, ", kGemvMaxSegs, "]"));
  const GemvArgs& b = segs[0];
  for (int i = 0; i < n_segs; ++i) {
    const GemvArgs& a = segs[i];
    if (!TiledInt8Supported(a.type))
      return absl::UnimplementedError(absl::StrCat("TiledGemvMulti: no int8 kernel for tiled ", std::string(GgmlInfo(a.type).name)));
    if (a.nc < 1 || a.nc > kTiledMaxCols || a.M <= 0 || a.K <= 0 || a.K % kUnitElems != 0)
      return absl::InvalidArgumentError(absl::StrCat("TiledGemvMulti: bad shape M=", a.M, " K=", a.K, " nc=", a.nc));
    if (a.xq == nullptr || a.xd == nullptr || a.y == nullptr || a.w == nullptr)
      return absl::InvalidArgumentError("TiledGemvMulti: needs w, xq/xd and y");
    if (a.epilogue == GemvEpilogue::kSiluMul && (a.w2 == nullptr || n_segs != 1))
      return absl::InvalidArgumentError("TiledGemvMulti: kSiluMul takes one segment with w2");
    if (i > 0 && (a.type != b.type || a.K != b.K || a.nc != b.nc || a.xq != b.xq || a.xd != b.xd || a.xsum != b.xsum))
      return absl::InvalidArgumentError("TiledGemvMulti: segments must share type, K, nc and activations");
  }
  // Up to 8 columns the kernel reads the block scales with 16-byte loads.
  if (b.nc <= 8 && reinterpret_cast<uintptr_t>(b.xd) % 16 != 0)
    return absl::InvalidArgumentError("TiledGemvMulti: xd not 16-byte aligned");
  if (b.nc == 1 && reinterpret_cast<uintptr_t>(b.xsum) % 16 != 0)
    return absl::InvalidArgumentError("TiledGemvMulti: xsum not 16-byte aligned");
  // One column stages xq into shared memory with 16-byte loads.
  if (b.nc == 1 && reinterpret_cast<uintptr_t>(b.xq) % 16 != 0)
    return absl::InvalidArgumentError("TiledGemvMulti: xq not 16-byte aligned");
  if (b.epilogue == GemvEpilogue::kSiluMul && b.nc > 32) {
    // The 64-column pair kernel needs more than 255 registers: two 32-column passes instead.
    for (int c0 = 0; c0 < b.nc; c0 += 32) {
      GemvArgs h = b;
      const int64_t ldy = b.ldy ? b.ldy : b.M;
      h.nc = std::min(32, b.nc - c0);
      h.xq = b.xq + static_cast<int64_t>(c0) * b.K;
      h.xd = b.xd + static_cast<int64_t>(c0) * (b.K / 32);
      h.y = b.y + c0 * ldy;
      h.ldy = ldy;
      DS_RETURN_IF_ERROR(TiledGemvMulti(&h, 1, stream));
    }
    return absl::OkStatus();
  }
  TiledLaunch L{};
  for (int i = 0; i < n_segs; ++i) L.seg[i] = segs[i];
  L.n_segs = n_segs;
  if (b.nc <= 8) LaunchTiled<1>(L, stream);
  else if (b.nc <= 16) LaunchTiled<2>(L, stream);
  else if (b.nc <= 32) LaunchTiled<4>(L, stream);
  else LaunchTiled<8>(L, stream);
  return LastLaunchStatus("TiledGemvMulti");
}

}  // namespace ds::cuda
