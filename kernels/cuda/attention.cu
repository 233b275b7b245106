// Attention kernels (see attention.cuh).
#include <cuda_fp16.h>

#include <cfloat>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_prefill_mma.cuh"
#include "kernels/cuda/attention_prefill_wgmma.cuh"
#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"

namespace ds::cuda {
namespace {

// ---- KV quantization (rules and their CPU reference: kernels/cpu/kv_quant.h). The scale and
// rounding arithmetic runs in double exactly as the reference does, so the blocks are bitwise
// equal to it; it is ~2 x n_kv x hd elements per token, negligible next to the projections.

__device__ __forceinline__ float SanitizeKv(float x) {
  return isnan(x) ? 0.f : fminf(fmaxf(x, -FLT_MAX), FLT_MAX);
}
// f16 bits of f32(v) with v clamped to the finite f16 range first (CPU: F16Saturate).
__device__ __forceinline__ uint16_t F16SaturateBits(double v) {
  v = fmin(fmax(v, -65504.0), 65504.0);
  return __half_as_ushort(__float2half_rn(__double2float_rn(v)));
}
__device__ __forceinline__ int RoundClampD(double v, int lo, int hi) {
  if (!(v >= lo)) return lo;
  if (v > hi) return hi;
  return static_cast<int>(rint(v));  // half to even, as std::nearbyint
}

// The warp quantizes one 32-element block: lane j holds element j (x), blk points at the block.
template <GgmlType KT>
__device__ __forceinline__ void StoreKvBlock(uint8_t* blk, int lane, float x) {
  x = SanitizeKv(x);
  uint16_t dbits;
  int q;
  if constexpr (KT == GgmlType::Q8_0) {
    const float amax = WarpMax(fabsf(x));
    dbits = F16SaturateBits(static_cast<double>(amax) / 127.0);
    const double d = __half2float(__ushort_as_half(dbits));
    const double id = d > 0 ? 1.0 / d : 0.0;
    q = RoundClampD(x * id, -127, 127);
    blk[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(q));
  } else {  // Q4_0: the element of largest |x| (lowest lane on ties) maps to q = 0
    const float ax = fabsf(x);
    const float amax = WarpMax(ax);
    const int src = __ffs(__ballot_sync(0xffffffffu, ax == amax)) - 1;
    const float m_l = __shfl_sync(0xffffffffu, x, src);
    const float m = amax > 0.f ? m_l : 0.f;
    dbits = F16SaturateBits(static_cast<double>(m) / -8.0);
    const double d = __half2float(__ushort_as_half(dbits));
    const double id = d != 0 ? 1.0 / d : 0.0;
    q = RoundClampD(x * id, -8, 7) + 8;
    const int q_hi = __shfl_down_sync(0xffffffffu, q, 16);
    if (lane < 16) blk[2 + lane] = static_cast<uint8_t>(q | (q_hi << 4));
  }
  if (lane == 0) *reinterpret_cast<uint16_t*>(blk) = dbits;  // blocks are 2-byte aligned
}

// Element j of a quantized head row, exact in f32 (d is f16, q has <= 8 bits).
template <GgmlType KT>
__device__ __forceinline__ float KvElem(const uint8_t* row, int j) {
  constexpr int kBB = GgmlBlockBytes(KT);
  const uint8_t* blk = row + (j >> 5) * kBB;
  const float d = HalfBitsToF32(*reinterpret_cast<const uint16_t*>(blk));
  const int jj = j & 31;
  if constexpr (KT == GgmlType::Q8_0)
    return d * static_cast<float>(static_cast<int8_t>(blk[2 + jj]));
  const int b = blk[2 + (jj & 15)];
  return d * static_cast<float>((jj < 16 ? b & 15 : b >> 4) - 8);
}

// N = 1, 2, 4 or 8 bytes at p (p 2-byte aligned when N >= 2) as little-endian words. For N >= 4:
// N/4 + 1 aligned 32-bit loads (the last only when p is not 4-aligned) and funnel shifts, instead
// of N/2 16-bit loads (block fields are only 2-byte aligned: 34- and 18-byte blocks).
template <int N>
__device__ __forceinline__ void LoadKvBytes(const uint8_t* p, uint32_t (&w)[(N + 3) / 4]) {
  if constexpr (N == 1) {
    w[0] = *p;
  } else if constexpr (N == 2) {
    w[0] = *reinterpret_cast<const uint16_t*>(p);
  } else {
    constexpr int W = N / 4;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t* b = reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
    const uint32_t sh = static_cast<uint32_t>(a & 3) * 8;  // 0 or 16
    uint32_t r[W + 1];
#pragma unroll
    for (int i = 0; i < W; ++i) r[i] = b[i];
    // Misaligned p reads up to 2 bytes past p + N: still inside the row, because rows are
    // 4-aligned with a multiple of 4 bytes (so a range ending at the row end is aligned).
    r[W] = sh ? b[W] : 0u;
#pragma unroll
    for (int i = 0; i < W; ++i) w[i] = __funnelshift_r(r[i], r[i + 1], sh);
  }
}

// Byte i of w as a float, minus `bias`: 0x4B0000bb is the float 2^23 + bb (one PRMT + one FADD
// per element instead of an int->float conversion, which is quarter rate).
__device__ __forceinline__ float ByteToFloat(uint32_t w, int i, float bias) {
  return __int_as_float(static_cast<int>(__byte_perm(w, 0x4B000000u, 0x7440u | i))) - bias;
}

// Lane `lane`'s D = hd/32 consecutive elements [lane*D, lane*D + D) of a quantized head row,
// unscaled (q for Q8_0, q - 8 for Q4_0), and the block scale they share (32 % D == 0, so a lane
// never straddles two blocks).
template <GgmlType KT, int D>
__device__ __forceinline__ void LoadKvLane(const uint8_t* row, int lane, float (&x)[D], float* d) {
  constexpr int kBB = GgmlBlockBytes(KT);
  const int e0 = lane * D, o = e0 & 31;
  const uint8_t* blk = row + (e0 >> 5) * kBB;
  *d = HalfBitsToF32(*reinterpret_cast<const uint16_t*>(blk));
  uint32_t w[(D + 3) / 4];
  if constexpr (KT == GgmlType::Q8_0) {
    LoadKvBytes<D>(blk + 2 + o, w);
#pragma unroll
    for (int i = 0; i < D; ++i) x[i] = ByteToFloat(w[i / 4] ^ 0x80808080u, i % 4, 8388736.f);
  } else {
    LoadKvBytes<D>(blk + 2 + (o & 15), w);
    const int shift = o >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < D; ++i)
      x[i] = ByteToFloat((w[i / 4] >> shift) & 0x0F0F0F0Fu, i % 4, 8388616.f);
  }
}

// Grid = (token, group of kPrepWarps heads), one warp per head (query heads, then key heads,
// then value heads). RoPE angles are computed in double (f32 angles lose ~1e-2 rad at positions
// ~2.6e5) by each block for its token while its warps read their heads and reduce the norm sums.
// (v1 ran one 8-warp block per token, 4 heads per warp one after another: 12 us per decode row
// of the 27B on the H200, ncu 2026-12-03; the per-head arithmetic is unchanged, bit for bit.)
constexpr int kPrepWarps = 4;
__global__ void __launch_bounds__(kPrepWarps * 32) QkvPrepKernel(const QkvPrepArgs a) {
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();
  extern __shared__ float smem[];  // [n_rot/2] cos, [n_rot/2] sin, [kPrepWarps][hd] head staging
  const AttnShape& s = a.shape;
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int half = s.n_rot / 2, hd = s.hd;
  float* cs = smem;
  float* sn = smem + half;
  float* stage = smem + 2 * half + warp * hd;
  const int pos = a.tok_pos[t], slot = a.tok_slot[t];
  const int n_heads_total = s.n_head + 2 * s.n_kv;
  const int head = blockIdx.y * kPrepWarps + warp;
  const bool live = head < n_heads_total;  // a whole warp either way
  const float* src = nullptr;
  const float* nw_w = nullptr;
  if (!live) {
  } else if (head < s.n_head) {
    src = a.qg + static_cast<int64_t>(t) * s.n_head * 2 * hd + head * 2 * hd;
    nw_w = a.q_norm;
  } else if (head < s.n_head + s.n_kv) {
    src = a.k + static_cast<int64_t>(t) * s.n_kv * hd + (head - s.n_head) * hd;
    nw_w = a.k_norm;
  } else {
    src = a.v + static_cast<int64_t>(t) * s.n_kv * hd + (head - s.n_head - s.n_kv) * hd;
  }
  float ss = 0.f;
  if (live)
    for (int e = lane; e < hd; e += 32) ss += src[e] * src[e];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double inv_freq = pow(static_cast<double>(s.rope_base), -2.0 * i / s.n_rot);
    double sd, cd;
    sincos(static_cast<double>(pos) * inv_freq, &sd, &cd);
    cs[i] = static_cast<float>(cd);
    sn[i] = static_cast<float>(sd);
  }
  __syncthreads();
  if (!live) return;
  ss = WarpSum(ss);
  const int64_t kvrow = KvRow(a.kv, slot, pos);
  const float inv = nw_w ? rsqrtf(ss / hd + s.eps) : 1.f;
  for (int e = lane; e < hd; e += 32) stage[e] = nw_w ? src[e] * inv * nw_w[e] : src[e];
  __syncwarp();
  for (int e = lane; e < hd; e += 32) {
    float val = stage[e];
    if (nw_w && e < s.n_rot) {
      if (e < half) val = stage[e] * cs[e] - stage[e + half] * sn[e];
      else val = stage[e - half] * sn[e - half] + stage[e] * cs[e - half];
    }
    if (head < s.n_head) {
      const int64_t qi = static_cast<int64_t>(t) * s.n_head * hd + head * hd + e;
      a.q_out[qi] = val;
      if (a.q16) a.q16[qi] = __half_as_ushort(__float2half_rn(val));
      continue;
    }
    const bool is_k = head < s.n_head + s.n_kv;
    const int64_t hrow = kvrow + head - s.n_head - (is_k ? 0 : s.n_kv);
    void* cache = is_k ? a.kv.k : a.kv.v;
    if (a.kv.type == GgmlType::F16) {
      static_cast<uint16_t*>(cache)[hrow * hd + e] = __half_as_ushort(__float2half_rn(val));
    } else {
      // Iteration e / 32 of this loop holds block e / 32 across the warp (lane = position in
      // the block; hd % 32 == 0 is checked on the host, so every lane takes every iteration).
      uint8_t* blk = static_cast<uint8_t*>(cache) + hrow * a.kv.row_bytes() +
                     (e >> 5) * GgmlBlockBytes(a.kv.type);
      if (a.kv.type == GgmlType::Q8_0) StoreKvBlock<GgmlType::Q8_0>(blk, lane, val);
      else StoreKvBlock<GgmlType::Q4_0>(blk, lane, val);
    }
  }
}

constexpr int kDecWarps = 8;
constexpr int kMaxGroup = 8;
constexpr int kPrefetch = 4;
// Grid (n_kv, n_splits, n_seqs). Warp w of split s walks tokens start+w, start+w+8, ... of the
// split's range keeping an online softmax per query head of the GQA group; the block merges its
// warps and writes one partial (acc, m, l) per head and split.
// KT: KV element type. Quantized rows are read as the lane's D unscaled quants plus their block
// scale: the scale multiplies the lane's partial score once per head (before the shuffle reduce)
// and p once per head for V, not every element.
template <int D, int GM, GgmlType KT>  // dims per lane: hd = 32 * D; GM >= the GQA group
__global__ void __launch_bounds__(kDecWarps * 32) AttnDecodeKernel(const AttnDecodeArgs a) {
  const AttnShape& s = a.shape;
  const int kvh = blockIdx.x, split = blockIdx.y, i = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = s.n_head / s.n_kv, hd = 32 * D;
  const int len = a.pos[i] + 1, slot = a.slots[i], row = a.rows[i];
  int used;
  const int chunk = SplitChunk(len, a.n_splits, &used);
  if (split >= used) return;  // the combine reads only the first `used` splits
  const int start = split * chunk, end = min(len, start + chunk);
  const float scale = rsqrtf(static_cast<float>(hd));

  float q[GM][D], acc[GM][D], m[GM], l[GM];
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int d = 0; d < D; ++d) {
      acc[g][d] = 0.f;
      q[g][d] = g < G ? a.q[static_cast<int64_t>(row) * s.n_head * hd + (kvh * G + g) * hd + lane * D + d] * scale : 0.f;
    }
  }
  // v2: kPrefetch tokens' K/V rows are loaded before the first is used, and their GM x kPrefetch
  // scores are reduced together (independent shuffle chains) before one online-softmax update
  // per head. v1 had one token in flight per warp and a serial shuffle chain per head and token:
  // decode @32k cost 3.5 ms/token over @0 for 2.1 GB of KV (0.5 ms of bandwidth).
  for (int tok0 = start + warp; tok0 < end; tok0 += kDecWarps * kPrefetch) {
    float kf[kPrefetch][D], vf[kPrefetch][D];
    float ks[kPrefetch], vs[kPrefetch];  // block scales (quantized KV only)
#pragma unroll
    for (int t = 0; t < kPrefetch; ++t) {
      const int tok = min(tok0 + t * kDecWarps, end - 1);
      if constexpr (KT == GgmlType::F16) {
        const uint16_t* kc = static_cast<const uint16_t*>(a.kv.k);
        const uint16_t* vc = static_cast<const uint16_t*>(a.kv.v);
        const int64_t base = (KvRow(a.kv, slot, tok) + kvh) * hd + lane * D;
        if constexpr (D >= 2) {
#pragma unroll
          for (int d = 0; d < D; d += 2) {
            const float2 kk = __half22float2(*reinterpret_cast<const __half2*>(kc + base + d));
            const float2 vv = __half22float2(*reinterpret_cast<const __half2*>(vc + base + d));
            kf[t][d] = kk.x; kf[t][d + 1] = kk.y;
            vf[t][d] = vv.x; vf[t][d + 1] = vv.y;
          }
        } else {
          kf[t][0] = __half2float(__ushort_as_half(kc[base]));
          vf[t][0] = __half2float(__ushort_as_half(vc[base]));
        }
      } else {
        constexpr int64_t kRB = static_cast<int64_t>(D) * GgmlBlockBytes(KT);  // hd/32 = D blocks
        const int64_t off = (KvRow(a.kv, slot, tok) + kvh) * kRB;
        LoadKvLane<KT, D>(static_cast<const uint8_t*>(a.kv.k) + off, lane, kf[t], &ks[t]);
        LoadKvLane<KT, D>(static_cast<const uint8_t*>(a.kv.v) + off, lane, vf[t], &vs[t]);
      }
    }
    float sc[kPrefetch][GM];
#pragma unroll
    for (int t = 0; t < kPrefetch; ++t)
#pragma unroll
      for (int g = 0; g < GM; ++g) {
        float v = 0.f;
#pragma unroll
        for (int d = 0; d < D; ++d) v = fmaf(q[g][d], kf[t][d], v);
        if constexpr (KT != GgmlType::F16) v *= ks[t];
        sc[t][g] = v;
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int t = 0; t < kPrefetch; ++t)
#pragma unroll
        for (int g = 0; g < GM; ++g) sc[t][g] += __shfl_xor_sync(0xffffffffu, sc[t][g], o);
    const int nt = min(kPrefetch, (end - tok0 + kDecWarps - 1) / kDecWarps);  // valid tokens
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      float mn = m[g];
#pragma unroll
      for (int t = 0; t < kPrefetch; ++t)
        if (t < nt) mn = fmaxf(mn, sc[t][g]);
      const float c = __expf(m[g] - mn);
      float p[kPrefetch];
      float psum = 0.f;
#pragma unroll
      for (int t = 0; t < kPrefetch; ++t) {
        p[t] = t < nt ? __expf(sc[t][g] - mn) : 0.f;
        psum += p[t];
      }
      l[g] = l[g] * c + psum;
      if constexpr (KT != GgmlType::F16) {
#pragma unroll
        for (int t = 0; t < kPrefetch; ++t) p[t] *= vs[t];  // V's block scale, after the sum
      }
#pragma unroll
      for (int d = 0; d < D; ++d) {
        float v = acc[g][d] * c;
#pragma unroll
        for (int t = 0; t < kPrefetch; ++t) v = fmaf(p[t], vf[t][d], v);
        acc[g][d] = v;
      }
      m[g] = mn;
    }
  }
  // Merge the 8 warps' (m, l, acc) in shared memory, one head at a time, so each split leaves
  // one partial per head: v1 left one per warp (528 per head at 66 splits) and its combine
  // walked them serially, ~200 us per layer at 32k context.
  __shared__ float sh_acc[kDecWarps][32 * D], sh_m[kDecWarps], sh_l[kDecWarps];
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    if (g >= G) break;
#pragma unroll
    for (int d = 0; d < D; ++d) sh_acc[warp][lane * D + d] = acc[g][d];
    if (lane == 0) {
      sh_m[warp] = m[g];
      sh_l[warp] = l[g];
    }
    __syncthreads();
    const int t = threadIdx.x;
    if (t < hd) {
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < kDecWarps; ++w) M = fmaxf(M, sh_m[w]);
      float L = 0.f, o = 0.f;
      if (M != -INFINITY) {
#pragma unroll
        for (int w = 0; w < kDecWarps; ++w) {
          const float c = __expf(sh_m[w] - M);  // 0 for warps that saw no token
          L = fmaf(c, sh_l[w], L);
          o = fmaf(c, sh_acc[w][t], o);
        }
      }
      const int h = kvh * G + g;
      float* dst = a.partials + ((static_cast<int64_t>(i) * s.n_head + h) * a.n_splits + split) * (hd + 2);
      dst[t] = o;
      if (t == 0) {
        dst[hd] = M;
        dst[hd + 1] = L;
      }
    }
    __syncthreads();
  }
}

template <int D, GgmlType KT>
void LaunchAttnDecode(const AttnDecodeArgs& a, dim3 grid, cudaStream_t stream) {
  const int G = a.shape.n_head / a.shape.n_kv;
  if (G <= 1) AttnDecodeKernel<D, 1, KT><<<grid, kDecWarps * 32, 0, stream>>>(a);
  else if (G <= 2) AttnDecodeKernel<D, 2, KT><<<grid, kDecWarps * 32, 0, stream>>>(a);
  else if (G <= 4) AttnDecodeKernel<D, 4, KT><<<grid, kDecWarps * 32, 0, stream>>>(a);
  else if (G <= 6) AttnDecodeKernel<D, 6, KT><<<grid, kDecWarps * 32, 0, stream>>>(a);
  else AttnDecodeKernel<D, 8, KT><<<grid, kDecWarps * 32, 0, stream>>>(a);
}

template <GgmlType KT>
void LaunchAttnDecodeHd(const AttnDecodeArgs& a, dim3 grid, cudaStream_t stream) {
  switch (a.shape.hd) {
    case 32: LaunchAttnDecode<1, KT>(a, grid, stream); break;
    case 64: LaunchAttnDecode<2, KT>(a, grid, stream); break;
    case 128: LaunchAttnDecode<4, KT>(a, grid, stream); break;
    default: LaunchAttnDecode<8, KT>(a, grid, stream); break;  // 256 (checked by the caller)
  }
}

// Grid (n_head, n_seqs), hd threads: merge the partials and apply the sigmoid output gate.
__global__ void AttnCombineKernel(const AttnDecodeArgs a) {
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();
  const AttnShape& s = a.shape;
  const int h = blockIdx.x, i = blockIdx.y, j = threadIdx.x, hd = s.hd;
  const float* p = a.partials + (static_cast<int64_t>(i) * s.n_head + h) * a.n_splits * (hd + 2);
  int used;
  SplitChunk(a.pos[i] + 1, a.n_splits, &used);  // later splits exited without writing
  // One online pass; the loads of different k are independent, so unrolling keeps several in
  // flight.
  float M = -INFINITY, L = 0.f, o = 0.f;
#pragma unroll 8
  for (int k = 0; k < used; ++k) {
    const float* pk = p + k * (hd + 2);
    const float mk = pk[hd], lk = pk[hd + 1], ok = pk[j];
    if (mk == -INFINITY) continue;
    const float nm = fmaxf(M, mk);
    const float c1 = __expf(M - nm), c2 = __expf(mk - nm);
    L = L * c1 + lk * c2;
    o = o * c1 + ok * c2;
    M = nm;
  }
  const int row = a.rows[i];
  const float gate = a.qg[static_cast<int64_t>(row) * s.n_head * 2 * hd + h * 2 * hd + hd + j];
  a.out[static_cast<int64_t>(row) * s.n_head * hd + h * hd + j] = (L > 0.f ? o / L : 0.f) * Sigmoid(gate);
}

// Copies cache rows [0, L) of one slot into contiguous f16 [L, n_kv*hd] buffers for cuBLAS
// (quantized rows dequantized: d*q is exact in f32, then rounded to f16 like the f16 cache).
// v == nullptr: K only (the wgmma path gathers V transposed).
template <GgmlType KT>
__global__ void GatherKvKernel(const KvCacheView kv, int slot, int L, uint16_t* __restrict__ k,
                               uint16_t* __restrict__ v) {
  const int width = kv.n_kv * kv.hd;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(L) * width) return;
  const int pos = static_cast<int>(i / width), e = static_cast<int>(i % width);
  if constexpr (KT == GgmlType::F16) {
    const int64_t src = KvRow(kv, slot, pos) * kv.hd + e;
    k[i] = static_cast<const uint16_t*>(kv.k)[src];
    if (v != nullptr) v[i] = static_cast<const uint16_t*>(kv.v)[src];
  } else {
    const int head = e / kv.hd, j = e % kv.hd;
    const int64_t off = (KvRow(kv, slot, pos) + head) * kv.row_bytes();
    const float kx = KvElem<KT>(static_cast<const uint8_t*>(kv.k) + off, j);
    k[i] = __half_as_ushort(__float2half_rn(kx));
    if (v != nullptr)
      v[i] =
          __half_as_ushort(__float2half_rn(KvElem<KT>(static_cast<const uint8_t*>(kv.v) + off, j)));
  }
}

// Cache rows [0, L) of one slot's V, transposed into f16 [n_kv*hd, Lpad] (zero past L) for the
// wgmma prefill kernel, whose B operands are K-major: a 64-position x 64-element tile per block,
// read along the rows and written along the positions through shared memory. hd % 64 == 0.
template <GgmlType KT>
__global__ void GatherVTransposedKernel(const KvCacheView kv, int slot, int L, int Lpad,
                                        uint16_t* __restrict__ vt) {
  __shared__ uint16_t tile[64][66];  // [element][position]; 2 halves of padding per row
  const int p0 = blockIdx.x * 64, e0 = blockIdx.y * 64;
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
    const int r = i / 64, c = i % 64, pos = p0 + r, e = e0 + c;
    uint16_t x = 0;
    if (pos < L) {
      if constexpr (KT == GgmlType::F16) {
        x = static_cast<const uint16_t*>(kv.v)[KvRow(kv, slot, pos) * kv.hd + e];
      } else {
        const int64_t off = (KvRow(kv, slot, pos) + e / kv.hd) * kv.row_bytes();
        x = __half_as_ushort(
            __float2half_rn(KvElem<KT>(static_cast<const uint8_t*>(kv.v) + off, e % kv.hd)));
      }
    }
    tile[c][r] = x;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
    const int c = i / 64, r = i % 64;
    vt[static_cast<int64_t>(e0 + c) * Lpad + p0 + r] = tile[c][r];
  }
}

// Causal softmax over rows of scores [G, tq, L]: row (g, t) sees columns <= q0 + t; writes f16
// probabilities (0 past the causal bound). One block per row.
__global__ void CausalSoftmaxKernel(const float* __restrict__ S, uint16_t* __restrict__ P, int tq,
                                    int L, int q0) {
  __shared__ float scratch[32];
  const int r = blockIdx.x;  // g * tq + t
  const int t = r % tq;
  const int limit = min(L, q0 + t + 1);
  const float* sr = S + static_cast<int64_t>(r) * L;
  uint16_t* pr = P + static_cast<int64_t>(r) * L;
  float mx = -INFINITY;
  for (int c = threadIdx.x; c < limit; c += blockDim.x) mx = fmaxf(mx, sr[c]);
  mx = BlockMax(mx, scratch);
  float sum = 0.f;
  for (int c = threadIdx.x; c < limit; c += blockDim.x) sum += __expf(sr[c] - mx);
  sum = BlockSum(sum, scratch);
  const float inv = 1.f / sum;
  for (int c = threadIdx.x; c < L; c += blockDim.x)
    pr[c] = __half_as_ushort(__float2half_rn(c < limit ? __expf(sr[c] - mx) * inv : 0.f));
}

}  // namespace

absl::Status KvTypeCheck(const KvCacheView& kv, const char* what) {
  if (kv.type != GgmlType::F16 && kv.type != GgmlType::Q8_0 && kv.type != GgmlType::Q4_0)
    return absl::InvalidArgumentError(absl::StrCat(what, ": KV type ", static_cast<int>(kv.type),
                                                   " is not F16, Q8_0 or Q4_0"));
  if (kv.type != GgmlType::F16 && kv.hd % 32 != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": head_dim ", kv.hd, " is not a multiple of 32 (quantized KV blocks)"));
  return absl::OkStatus();
}

absl::Status QkvPrep(const QkvPrepArgs& a, cudaStream_t stream) {
  DS_RETURN_IF_ERROR(KvTypeCheck(a.kv, "QkvPrep"));
  if (a.T == 0) return absl::OkStatus();
  const int heads = a.shape.n_head + 2 * a.shape.n_kv;
  const size_t smem = sizeof(float) * (a.shape.n_rot + kPrepWarps * a.shape.hd);
  LaunchMaybeEarly(QkvPrepKernel, dim3(a.T, CeilDiv(heads, kPrepWarps)), kPrepWarps * 32, smem,
                   stream, a.early, a);
  return LastLaunchStatus("QkvPrep");
}

int64_t AttnDecodePartialFloats(const AttnShape& s, int n_seqs, int n_splits) {
  return static_cast<int64_t>(n_seqs) * s.n_head * n_splits * (s.hd + 2);
}

absl::Status AttnDecode(const AttnDecodeArgs& a, cudaStream_t stream) {
  const AttnShape& s = a.shape;
  if (a.n_seqs == 0) return absl::OkStatus();
  if (s.n_head % s.n_kv != 0 || s.n_head / s.n_kv > kMaxGroup)
    return absl::UnimplementedError(absl::StrCat("AttnDecode: GQA group ", s.n_head / s.n_kv, " > ", kMaxGroup));
  if (s.hd != 32 && s.hd != 64 && s.hd != 128 && s.hd != 256)
    return absl::UnimplementedError(
        absl::StrCat("AttnDecode: head_dim ", s.hd, " not in {32,64,128,256}"));
  DS_RETURN_IF_ERROR(KvTypeCheck(a.kv, "AttnDecode"));
  const dim3 grid(s.n_kv, a.n_splits, a.n_seqs);
  if (a.tensor_cores) {
    if (!AttnDecodeMmaSupports(s))
      return absl::UnimplementedError(absl::StrCat("AttnDecode on tensor cores: head_dim ", s.hd,
                                                   ", GQA group ", s.n_head / s.n_kv));
    LaunchAttnDecodeMma(a, stream);
  } else {
    switch (a.kv.type) {
      case GgmlType::Q8_0: LaunchAttnDecodeHd<GgmlType::Q8_0>(a, grid, stream); break;
      case GgmlType::Q4_0: LaunchAttnDecodeHd<GgmlType::Q4_0>(a, grid, stream); break;
      default: LaunchAttnDecodeHd<GgmlType::F16>(a, grid, stream); break;
    }
  }
  DS_RETURN_IF_ERROR(LastLaunchStatus("AttnDecode"));
  // hd >= 32: whole warps
  LaunchMaybeEarly(AttnCombineKernel, dim3(s.n_head, a.n_seqs), s.hd, 0, stream, a.early, a);
  return LastLaunchStatus("AttnCombine");
}

int64_t AttnPrefillVtElems(const AttnShape& s, int L) {
  return static_cast<int64_t>(s.n_kv) * s.hd * AttnPrefillVtRows(L);
}

// f(std::integral_constant<GgmlType, KT>{}) for the KV cache types (KvTypeCheck has passed;
// anything else is F16). C++17: no template lambdas in the sm_70 build.
template <typename F>
void DispatchKvType(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::Q8_0: f(std::integral_constant<GgmlType, GgmlType::Q8_0>{}); break;
    case GgmlType::Q4_0: f(std::integral_constant<GgmlType, GgmlType::Q4_0>{}); break;
    default: f(std::integral_constant<GgmlType, GgmlType::F16>{}); break;
  }
}

absl::Status AttnPrefill(const AttnPrefillArgs& a, CublasGemm* gemm, cudaStream_t stream) {
  const AttnShape& s = a.shape;
  if (a.T == 0) return absl::OkStatus();
  const int L = a.pos0 + a.T, G = s.n_head / s.n_kv, hd = s.hd;
  const int64_t width = static_cast<int64_t>(s.n_kv) * hd;
  DS_RETURN_IF_ERROR(KvTypeCheck(a.kv, "AttnPrefill"));
  const int gb = CeilDiv(L * width, 256);
  // The wgmma kernel takes V transposed (GatherVTransposedKernel), the others row by row.
  uint16_t *kt = a.k_tmp, *vt = a.wgmma ? nullptr : a.v_tmp;
  DispatchKvType(a.kv.type, [&](auto tag) {
    GatherKvKernel<decltype(tag)::value><<<gb, 256, 0, stream>>>(a.kv, a.slot, L, kt, vt);
  });
  DS_RETURN_IF_ERROR(LastLaunchStatus("GatherKv"));
  if (a.wgmma) {
    if (!AttnPrefillWgmmaSupports(s))
      return absl::UnimplementedError(
          absl::StrCat("AttnPrefill on warpgroup tensor cores: head_dim ", hd, ", GQA group ", G));
    const int Lpad = AttnPrefillVtRows(L);
    const dim3 tb(Lpad / 64, static_cast<int>(width / 64));
    DispatchKvType(a.kv.type, [&](auto tag) {
      GatherVTransposedKernel<decltype(tag)::value>
          <<<tb, 256, 0, stream>>>(a.kv, a.slot, L, Lpad, a.v_tmp);
    });
    DS_RETURN_IF_ERROR(LastLaunchStatus("GatherVTransposed"));
    return LaunchAttnPrefillWgmma(a, stream);
  }
  if (a.tensor_cores) {
    if (!AttnPrefillMmaSupports(s))
      return absl::UnimplementedError(absl::StrCat("AttnPrefill on tensor cores: head_dim ", hd,
                                                   ", GQA group ", G));
    return LaunchAttnPrefillMma(a, stream);
  }
  const float scale = 1.f / sqrtf(static_cast<float>(hd));
  for (int t0 = 0; t0 < a.T; t0 += a.tq) {
    const int tqc = std::min(a.tq, a.T - t0);
    const int Lc = a.pos0 + t0 + tqc;  // keys visible to the last query of the chunk
    for (int j = 0; j < s.n_kv; ++j) {
      const int64_t qoff = (static_cast<int64_t>(t0) * s.n_head + j * G) * hd;
      DS_RETURN_IF_ERROR(gemm->BatchedF16(a.q16 + qoff, s.n_head * hd, hd, a.k_tmp + j * hd, width, 0,
                                          /*b_is_kn=*/false, a.scores, Lc,
                                          static_cast<int64_t>(tqc) * Lc, /*c_f32=*/true, tqc, Lc,
                                          hd, G, scale, stream));
      CausalSoftmaxKernel<<<G * tqc, 256, 0, stream>>>(a.scores, a.probs, tqc, Lc, a.pos0 + t0);
      DS_RETURN_IF_ERROR(LastLaunchStatus("CausalSoftmax"));
      DS_RETURN_IF_ERROR(gemm->BatchedF16(a.probs, Lc, static_cast<int64_t>(tqc) * Lc,
                                          a.v_tmp + j * hd, width, 0, /*b_is_kn=*/true,
                                          a.out + qoff, s.n_head * hd, hd, /*c_f32=*/true, tqc, hd,
                                          Lc, G, 1.f, stream));
    }
  }
  return SigmoidGateMul(a.out, a.qg, a.T, s.n_head, hd, stream);
}

}  // namespace ds::cuda
