// Split-K decode attention on f16 tensor cores (see attention_mma.cuh and kernels/cuda/README.md,
// "Decode attention on tensor cores").
//
// Why: the SIMT decode kernel (attention.cu) spends ~260 instructions per token and KV head and
// holds 212 registers (one 8-warp block per SM); at 32k+ contexts it is issue-bound at 0.3 TB/s of
// KV. Here a warp takes 16 tokens at a time and both products run as mma.m16n8k16 (f16 in, f32
// accumulate):
//   S = Q K^T: A = the GQA group's query heads as rows (the f16 value in rows 0..7 and the f16
//              rounding remainder in rows 8..15, so Q keeps ~22 bits: row g + row g + 8 is the
//              score of head g), B = 16 dims x 8 tokens of K, one per lane group;
//   O^T += V^T P^T: A = 16 dims x 16 tokens of V, B = P^T (16 tokens x 8 heads), which is the
//              S accumulator of the same lanes re-packed to f16 (no shuffle, no shared memory).
// Quantized K is dequantized into the B fragment (f16 d * (q - 8): one rounding); quantized V
// stays the exact integer q - 8 in A and its block scale goes into B (P * d, one rounding).
// The order of the 32 dims of a block inside an mma is free as long as A and B agree, so every
// lane loads whole bytes / words of its token's block (KDim / VDim below give the order).
//
// Accuracy: P, K * d and P * d are rounded to f16 (2^-11 relative), so the output differs from
// the f32 SIMT kernel by ~1e-4..1e-3 relative (kv_quant_cuda_test bounds it).
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/mma_f16.cuh"

namespace ds::cuda {
namespace {

constexpr int kMmaWarps = 4;
constexpr int kMmaTile = 16;  // tokens per warp and iteration

__device__ __forceinline__ uint32_t Ld16(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
// Four bytes at a 2-byte aligned address (quantized blocks are 18 / 34 bytes long).
__device__ __forceinline__ uint32_t Ld32At2(const uint8_t* p) { return Ld16(p) | Ld16(p + 2) << 16; }

// Two 4-bit fields at bits 0..3 and 16..19 of x, as the f16 pair (q - 8): 0x6400 | q is 1024 + q
// exactly, minus 1032.
__device__ __forceinline__ __half2 Nibbles(uint32_t x) {
  return __hsub2(Half2((x & 0x000F000Fu) | 0x64006400u), __float2half2_rn(1032.f));
}
// Bytes 0 and 2 of u (already XORed with 0x80: the unsigned q + 128) as the f16 pair q.
__device__ __forceinline__ __half2 SignedBytes(uint32_t u) {
  return __hsub2(Half2(u), __float2half2_rn(1152.f));
}

// The dim (within its 32-dim block) that k slot j of mma step st holds for lane group member
// tig, j = 0..3 for the k indices 2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9.
template <GgmlType KT>
__device__ __forceinline__ int KDim(int st, int tig, int j) {
  if constexpr (KT == GgmlType::Q4_0) return 16 * st + 4 * tig + (j == 1 ? 2 : j == 2 ? 1 : j);
  else if constexpr (KT == GgmlType::Q8_0) return 8 * tig + 4 * st + (j == 1 ? 2 : j == 2 ? 1 : j);
  else return 8 * tig + 4 * st + j;
}

// B fragments of one token's K for block b (dims 32 b ..): f[0], f[1] for mma step 0, f[2],
// f[3] for step 1, in KDim's order, dequantized.
template <GgmlType KT>
__device__ __forceinline__ void KFrag(const uint8_t* row, int b, int tig, uint32_t (&f)[4]) {
  if constexpr (KT == GgmlType::Q4_0) {
    const uint8_t* blk = row + b * 18;
    const __half2 d = __half2half2(__ushort_as_half(static_cast<uint16_t>(Ld16(blk))));
    const uint32_t w = Ld32At2(blk + 2 + 4 * tig);  // dims 4 tig .. +3 (low), 16 + 4 tig .. (high)
    f[0] = Bits(__hmul2(Nibbles(w), d));
    f[1] = Bits(__hmul2(Nibbles(w >> 8), d));
    f[2] = Bits(__hmul2(Nibbles(w >> 4), d));
    f[3] = Bits(__hmul2(Nibbles(w >> 12), d));
  } else if constexpr (KT == GgmlType::Q8_0) {
    const uint8_t* blk = row + b * 34;
    const __half2 d = __half2half2(__ushort_as_half(static_cast<uint16_t>(Ld16(blk))));
    const uint32_t w0 = Ld32At2(blk + 2 + 8 * tig) ^ 0x80808080u;  // dims 8 tig .. +3
    const uint32_t w1 = Ld32At2(blk + 6 + 8 * tig) ^ 0x80808080u;  // dims 8 tig + 4 .. +7
    f[0] = Bits(__hmul2(SignedBytes(__byte_perm(w0, 0x64646464u, 0x4240)), d));
    f[1] = Bits(__hmul2(SignedBytes(__byte_perm(w0, 0x64646464u, 0x4341)), d));
    f[2] = Bits(__hmul2(SignedBytes(__byte_perm(w1, 0x64646464u, 0x4240)), d));
    f[3] = Bits(__hmul2(SignedBytes(__byte_perm(w1, 0x64646464u, 0x4341)), d));
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(row + b * 64 + 16 * tig);  // dims 8 tig ..
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
  }
}

// The dim (within its 32-dim block) of A row r (0..15) of m-tile t (0, 1) of a block, for lane
// group g = r % 8.
template <GgmlType KT>
__device__ __forceinline__ int VDim(int t, int r) {
  const int g = r & 7;
  if constexpr (KT == GgmlType::Q8_0) return 4 * g + t + (r >= 8 ? 2 : 0);
  else return 2 * g + t + (r >= 8 ? 16 : 0);
}

// A fragments of V^T for block b, m-tiles 0 and 1 (rows in VDim's order), for the tokens of
// rows r[0..3] (k columns 2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9); d01 / d89: the V block scales
// of tokens 0, 1 and 2, 3 (quantized types).
template <GgmlType KT>
__device__ __forceinline__ void VFrag(const uint8_t* const (&r)[4], int b, int g,
                                      uint32_t (&a)[2][4], uint32_t* d01, uint32_t* d89) {
  if constexpr (KT == GgmlType::Q4_0) {
    uint32_t u[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) u[j] = Ld16(r[j] + b * 18 + 2 + 2 * g);  // dims 2g, 2g+1 (+16)
    *d01 = Ld16(r[0] + b * 18) | Ld16(r[1] + b * 18) << 16;
    *d89 = Ld16(r[2] + b * 18) | Ld16(r[3] + b * 18) << 16;
    const uint32_t w01 = u[0] | u[1] << 16, w89 = u[2] | u[3] << 16;
    a[0][0] = Bits(Nibbles(w01));
    a[0][1] = Bits(Nibbles(w01 >> 4));
    a[0][2] = Bits(Nibbles(w89));
    a[0][3] = Bits(Nibbles(w89 >> 4));
    a[1][0] = Bits(Nibbles(w01 >> 8));
    a[1][1] = Bits(Nibbles(w01 >> 12));
    a[1][2] = Bits(Nibbles(w89 >> 8));
    a[1][3] = Bits(Nibbles(w89 >> 12));
  } else if constexpr (KT == GgmlType::Q8_0) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = Ld32At2(r[j] + b * 34 + 2 + 4 * g) ^ 0x80808080u;
    *d01 = Ld16(r[0] + b * 34) | Ld16(r[1] + b * 34) << 16;
    *d89 = Ld16(r[2] + b * 34) | Ld16(r[3] + b * 34) << 16;
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const uint32_t x = __byte_perm(w[2 * p], w[2 * p + 1], 0x5140);  // byte 0, 1 of both
      const uint32_t y = __byte_perm(w[2 * p], w[2 * p + 1], 0x7362);  // byte 2, 3 of both
      a[0][2 * p] = Bits(SignedBytes(__byte_perm(x, 0x64646464u, 0x4140)));
      a[0][2 * p + 1] = Bits(SignedBytes(__byte_perm(y, 0x64646464u, 0x4140)));
      a[1][2 * p] = Bits(SignedBytes(__byte_perm(x, 0x64646464u, 0x4342)));
      a[1][2 * p + 1] = Bits(SignedBytes(__byte_perm(y, 0x64646464u, 0x4342)));
    }
  } else {
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = *reinterpret_cast<const uint32_t*>(r[j] + b * 64 + 4 * g);       // dims 2g, 2g+1
      hi[j] = *reinterpret_cast<const uint32_t*>(r[j] + b * 64 + 32 + 4 * g);  // 16 + 2g, ..
    }
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      a[0][2 * p] = __byte_perm(lo[2 * p], lo[2 * p + 1], 0x5410);
      a[0][2 * p + 1] = __byte_perm(hi[2 * p], hi[2 * p + 1], 0x5410);
      a[1][2 * p] = __byte_perm(lo[2 * p], lo[2 * p + 1], 0x7632);
      a[1][2 * p + 1] = __byte_perm(hi[2 * p], hi[2 * p + 1], 0x7632);
    }
    *d01 = *d89 = 0;
  }
}

// Shared memory of a block. Where a head row is a whole number of 16-byte chunks (q4_0 / q8_0 at
// hd 256, f16 at every hd), each warp stages its tile's 16 K and 16 V rows with cp.async (two
// stages for the quantized types: the next tile's rows are in flight while this one is
// multiplied; one for f16, whose rows are 3.5x longer) and the fragments are read from shared
// memory: 16-byte coalesced copies instead of ~110 scattered 2-byte loads per lane and tile.
// Other rows (quantized, hd < 256: 2-byte aligned) are read from global memory directly. The
// warps' merge reuses the staging memory.
template <int NB, GgmlType KT>
struct MmaSmem {
  static constexpr int kRowBytes = KT == GgmlType::Q4_0 ? NB * 18 : KT == GgmlType::Q8_0 ? NB * 34 : NB * 64;
  static constexpr bool kStaged = kRowBytes % 16 == 0;
  static constexpr int kStages = !kStaged ? 0 : KT == GgmlType::F16 ? 1 : 2;
  static constexpr int kTileBytes = kMmaTile * kRowBytes;  // K or V rows of one tile
  static constexpr int kWarpBytes = kStages * 2 * kTileBytes;
  static constexpr int kMergeFloats = kMmaWarps * 8 * 32 * NB + 2 * kMmaWarps * 8;
  static constexpr int kBytes = kMmaWarps * kWarpBytes > kMergeFloats * 4 ? kMmaWarps * kWarpBytes
                                                                         : kMergeFloats * 4;
};

// Grid (n_kv, n_splits, n_seqs), 4 warps. Warp w of split s takes the 16-token tiles start +
// 16 (w + 4 i); lane (g = lane / 4, tig = lane % 4) holds head g's scores of tokens 2 tig, 2 tig
// + 1 of each 8-token half and the output of heads 2 tig, 2 tig + 1 for its dims. The block then
// merges its warps and writes one partial per head and split, as the SIMT kernel does.
template <int NB, GgmlType KT>  // NB = hd / 32 blocks of 32 dims
__global__ void __launch_bounds__(kMmaWarps * 32, 3) AttnDecodeMmaKernel(const AttnDecodeArgs a) {
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();
  using Smem = MmaSmem<NB, KT>;
  extern __shared__ __align__(16) uint8_t smem[];
  const AttnShape& s = a.shape;
  constexpr int hd = 32 * NB;
  const int kvh = blockIdx.x, split = blockIdx.y, i = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
  const int G = s.n_head / s.n_kv;
  const int len = a.pos[i] + 1, slot = a.slots[i], row = a.rows[i];
  int used;
  const int chunk = SplitChunk(len, a.n_splits, &used);
  if (split >= used) return;  // the combine reads only the first `used` splits
  const int start = split * chunk, end = min(len, start + chunk);
  const int64_t rb = a.kv.row_bytes();
  const uint8_t* kc = static_cast<const uint8_t*>(a.kv.k);
  const uint8_t* vc = static_cast<const uint8_t*>(a.kv.v);

  // Q of head g (scaled by 1/sqrt(hd)) in KDim's order: rows g = f16(q), g + 8 = f16(q - f16(q)).
  uint32_t qa[NB][2][4];
  {
    const float scale = rsqrtf(static_cast<float>(hd));
    const float* q = a.q + static_cast<int64_t>(row) * s.n_head * hd +
                     static_cast<int64_t>(kvh * G + min(g, G - 1)) * hd;
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int st = 0; st < 2; ++st)
#pragma unroll
        for (int p = 0; p < 2; ++p) {  // k slots (0, 1), then (2, 3)
          const float x0 = g < G ? q[32 * b + KDim<KT>(st, tig, 2 * p)] * scale : 0.f;
          const float x1 = g < G ? q[32 * b + KDim<KT>(st, tig, 2 * p + 1)] * scale : 0.f;
          const __half2 h = __floats2half2_rn(x0, x1);
          const float2 hf = __half22float2(h);
          qa[b][st][2 * p] = Bits(h);
          qa[b][st][2 * p + 1] = Bits(__floats2half2_rn(x0 - hf.x, x1 - hf.y));
        }
  }

  float o[NB][2][4];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[b][t][e] = 0.f;
  float m = -INFINITY, l = 0.f;  // head g's running max (same in its 4 lanes) and partial sum

  // Staging (Smem::kStaged): lane r < 16 holds the byte offset of tile row r's head row; the
  // tile's 16 x kRowBytes / 16 chunks of K and of V go round the lanes (rows past `end` repeat
  // the last token: their scores are masked).
  uint8_t* const stage0 = smem + warp * Smem::kWarpBytes;
  auto stage = [&](int t0, int st) {
    if constexpr (Smem::kStaged) {
      constexpr int kChunks = Smem::kRowBytes / 16;
      const int64_t off = (KvRow(a.kv, slot, min(t0 + (lane & 15), end - 1)) + kvh) * rb;
      uint8_t* ks = stage0 + st * 2 * Smem::kTileBytes;
#pragma unroll
      for (int c0 = 0; c0 < kMmaTile * kChunks; c0 += 32) {
        const int c = c0 + lane, r = c / kChunks, col = c % kChunks;
        const int64_t src = __shfl_sync(0xffffffffu, off, r & 15) + col * 16;
        if (c < kMmaTile * kChunks) {
          CpAsync16(ks + r * Smem::kRowBytes + col * 16, kc + src);
          CpAsync16(ks + Smem::kTileBytes + r * Smem::kRowBytes + col * 16, vc + src);
        }
      }
    }
    CpAsyncCommit();
  };
  if (Smem::kStaged && start + warp * kMmaTile < end) stage(start + warp * kMmaTile, 0);
  int it = 0;
  for (int t0 = start + warp * kMmaTile; t0 < end; t0 += kMmaWarps * kMmaTile, ++it) {
    const int next = t0 + kMmaWarps * kMmaTile;
    const uint8_t* kt = nullptr;  // this tile's staged K rows (V: + kTileBytes)
    if constexpr (Smem::kStaged) {
      if constexpr (Smem::kStages == 2) {
        if (next < end) stage(next, (it + 1) & 1);
        else CpAsyncCommit();  // an empty group: the wait below always leaves one in flight
        CpAsyncWait<1>();
      } else {
        CpAsyncWait<0>();
      }
      __syncwarp();
      kt = stage0 + (Smem::kStages == 2 ? (it & 1) : 0) * 2 * Smem::kTileBytes;
    }
    // S for tokens t0 + 8 j + column: lane group g supplies token t0 + 8 j + g.
    float sc[2][4];
    const uint8_t* krow[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if constexpr (Smem::kStaged) krow[j] = kt + (8 * j + g) * Smem::kRowBytes;
      else krow[j] = kc + (KvRow(a.kv, slot, min(t0 + 8 * j + g, end - 1)) + kvh) * rb;
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
    }
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t f[4];
        KFrag<KT>(krow[j], b, tig, f);
        MmaF16(qa[b][0], f[0], f[1], sc[j]);
        MmaF16(qa[b][1], f[2], f[3], sc[j]);
      }
    // Online softmax over head g's 16 scores (4 per lane: tokens 8 j + 2 tig + e).
    float p[2][2], mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = sc[j][e] + sc[j][2 + e];
        p[j][e] = t0 + 8 * j + 2 * tig + e < end ? v : -INFINITY;
        mx = fmaxf(mx, p[j][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m, mx);  // finite: token t0 is always valid
    const float c = __expf(m - mn);
    float ps = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        p[j][e] = __expf(p[j][e] - mn);
        ps += p[j][e];
      }
    l = l * c + ps;
    m = mn;
    // This lane's outputs are heads 2 tig and 2 tig + 1: their rescale factors.
    // Rescale only when some head's max moved (c is exactly 1 otherwise), which past the first
    // tiles is rare.
    if (__any_sync(0xffffffffu, c != 1.f)) {
      const float ca = __shfl_sync(0xffffffffu, c, 8 * tig), cb = __shfl_sync(0xffffffffu, c, 8 * tig + 4);
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          o[b][t][0] *= ca;
          o[b][t][1] *= cb;
          o[b][t][2] *= ca;
          o[b][t][3] *= cb;
        }
    }
    const __half2 p01 = __floats2half2_rn(p[0][0], p[0][1]), p89 = __floats2half2_rn(p[1][0], p[1][1]);
    const uint8_t* vrow[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int x = 2 * tig + (j & 1) + 8 * (j >> 1);  // tile row
      if constexpr (Smem::kStaged) vrow[j] = kt + Smem::kTileBytes + x * Smem::kRowBytes;
      else vrow[j] = vc + (KvRow(a.kv, slot, min(t0 + x, end - 1)) + kvh) * rb;
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      uint32_t av[2][4], d01, d89;
      VFrag<KT>(vrow, b, g, av, &d01, &d89);
      uint32_t b0 = Bits(p01), b1 = Bits(p89);
      if constexpr (KT != GgmlType::F16) {
        b0 = Bits(__hmul2(p01, Half2(d01)));
        b1 = Bits(__hmul2(p89, Half2(d89)));
      }
      MmaF16(av[0], b0, b1, o[b][0]);
      MmaF16(av[1], b0, b1, o[b][1]);
    }
    if constexpr (Smem::kStaged) {
      __syncwarp();  // every lane has read this stage before it is refilled
      if constexpr (Smem::kStages == 1)
        if (next < end) stage(next, 0);
    }
  }

  // Merge the 4 warps per head (as the SIMT kernel merges its 8) and write the split's partial.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  CpAsyncWait<0>();
  __syncthreads();  // the merge reuses the staging memory of every warp
  auto sh_o = reinterpret_cast<float(*)[8][hd]>(smem);
  auto sh_m = reinterpret_cast<float(*)[8]>(smem + sizeof(float) * kMmaWarps * 8 * hd);
  auto sh_l = sh_m + kMmaWarps;
  if (tig == 0) {
    sh_m[warp][g] = m;
    sh_l[warp][g] = l;
  }
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int d0 = 32 * b + VDim<KT>(t, g), d1 = 32 * b + VDim<KT>(t, g + 8);
      sh_o[warp][2 * tig][d0] = o[b][t][0];
      sh_o[warp][2 * tig + 1][d0] = o[b][t][1];
      sh_o[warp][2 * tig][d1] = o[b][t][2];
      sh_o[warp][2 * tig + 1][d1] = o[b][t][3];
    }
  __syncthreads();
  for (int e = threadIdx.x; e < G * hd; e += kMmaWarps * 32) {
    const int h = e / hd, d = e % hd;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) M = fmaxf(M, sh_m[w][h]);
    float L = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) {
      const float cw = __expf(sh_m[w][h] - M);  // 0 for warps that saw no token
      L = fmaf(cw, sh_l[w][h], L);
      acc = fmaf(cw, sh_o[w][h][d], acc);
    }
    float* dst = a.partials +
                 ((static_cast<int64_t>(i) * s.n_head + kvh * G + h) * a.n_splits + split) * (hd + 2);
    dst[d] = acc;
    if (d == 0) {
      dst[hd] = M;
      dst[hd + 1] = L;
    }
  }
}

template <int NB, GgmlType KT>
void Launch(const AttnDecodeArgs& a, dim3 grid, cudaStream_t stream) {
  constexpr int kBytes = MmaSmem<NB, KT>::kBytes;
  if constexpr (kBytes > 48 * 1024) {
    // Above the default limit: opt in once per instantiation (not a stream operation, so also
    // fine while a graph is being captured). The attribute belongs to the current device: once
    // per process is enough because every process drives one GPU (worker, bench --tp spawns a
    // process per rank), as for MmqTiledKernel.
    static const bool opted = cudaFuncSetAttribute(AttnDecodeMmaKernel<NB, KT>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   kBytes) == cudaSuccess;
    (void)opted;
  }
  LaunchMaybeEarly(AttnDecodeMmaKernel<NB, KT>, grid, kMmaWarps * 32, kBytes, stream, a.early, a);
}

template <GgmlType KT>
void LaunchType(const AttnDecodeArgs& a, dim3 grid, cudaStream_t stream) {
  switch (a.shape.hd) {
    case 32: Launch<1, KT>(a, grid, stream); break;
    case 64: Launch<2, KT>(a, grid, stream); break;
    case 128: Launch<4, KT>(a, grid, stream); break;
    default: Launch<8, KT>(a, grid, stream); break;  // 256
  }
}

}  // namespace

bool AttnDecodeMmaSupports(const AttnShape& s) {
  return s.n_kv > 0 && s.n_head % s.n_kv == 0 && s.n_head / s.n_kv <= 8 &&
         (s.hd == 32 || s.hd == 64 || s.hd == 128 || s.hd == 256);
}

void LaunchAttnDecodeMma(const AttnDecodeArgs& a, cudaStream_t stream) {
  const dim3 grid(a.shape.n_kv, a.n_splits, a.n_seqs);
  switch (a.kv.type) {
    case GgmlType::Q8_0: LaunchType<GgmlType::Q8_0>(a, grid, stream); break;
    case GgmlType::Q4_0: LaunchType<GgmlType::Q4_0>(a, grid, stream); break;
    default: LaunchType<GgmlType::F16>(a, grid, stream); break;
  }
}

}  // namespace ds::cuda
