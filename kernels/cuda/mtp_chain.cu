// The fused MTP draft chain (see mtp_chain.cuh). Layout of the work: a grid of B blocks of 8
// warps; every matrix product gives one output row (all the pass's rows' columns of it) to one
// warp of the grid in turn, its lanes striding over K 8 weights at a time; vectors that every
// block needs whole (a normed row, the attention output, h') are rebuilt by each block in shared
// memory from what the stage before wrote, instead of another barrier.
//
// Coherence: a value written by another block during this launch is read with ld.global.cg
// (L2, never a stale L1 line: Coh); the cluster barrier orders the writes before it.
// Weights, norms and the hidden rows from earlier kernels take the normal path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/argmax_reduce.cuh"
#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/cluster.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mtp_chain.cuh"
#include "kernels/cuda/mtp_chain_plan.h"

namespace ds::cuda {
namespace {

constexpr int kWarps = kMtpChainThreads / 32;

template <typename T>
__device__ __forceinline__ T Coh(const T* p) {
  return __ldcg(p);
}

// The stage barrier: the cluster's hardware barrier (the grid is one thread-block cluster, sm_90+:
// released at cluster scope, which orders the global writes before it for every block after it).
__device__ __forceinline__ void StageSync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  ClusterSync();
#else
  __trap();  // MtpChainConfigure never picks this kernel below sm_90
#endif
}

// 8 consecutive weights of a row (element 8 * i8 on) as floats. G: the row may be in shared
// memory (the resident form), so a generic load instead of the read-only path.
template <GgmlType WT, bool G = false>
__device__ __forceinline__ void Load8(const void* row, int i8, float (&w)[8]) {
  if constexpr (WT == GgmlType::F32) {
    const float4* p = static_cast<const float4*>(row) + 2 * i8;
    float4 a, b;
    if constexpr (G) {
      a = p[0], b = p[1];
    } else {
      a = __ldg(p), b = __ldg(p + 1);
    }
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else {
    const uint4* p = static_cast<const uint4*>(row) + i8;
    uint4 r;
    if constexpr (G) {
      r = *p;
    } else {
      r = __ldg(p);
    }
    const uint32_t x[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (WT == GgmlType::F16) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&x[i]));
        w[2 * i] = f.x;
        w[2 * i + 1] = f.y;
      } else {  // BF16: the high half of an f32
        w[2 * i] = __uint_as_float(x[i] << 16);
        w[2 * i + 1] = __uint_as_float(x[i] & 0xffff0000u);
      }
    }
  }
}

template <GgmlType WT>
__device__ __forceinline__ float LoadOne(const void* row, int e) {
  if constexpr (WT == GgmlType::F32) return static_cast<const float*>(row)[e];
  else if constexpr (WT == GgmlType::F16) return __half2float(static_cast<const __half*>(row)[e]);
  else return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(row)[e]) << 16);
}

template <GgmlType WT>
__device__ __forceinline__ const void* Row(const MtpChainMatrix& m, int row) {
  constexpr int kBytes = WT == GgmlType::F32 ? 4 : 2;
  return static_cast<const uint8_t*>(m.d) + static_cast<int64_t>(row) * m.cols * kBytes;
}

// Where a row's weights are read from: in the resident form, this block's copy in shared memory
// (`wsm`, the weights region) when the row is one of the block's (row % B == block) and among the
// first m.res of them; otherwise the matrix in global memory.
template <GgmlType WT, bool RES>
__device__ __forceinline__ const void* RowAt(const MtpChainMatrix& m, int row, const uint8_t* wsm) {
  if constexpr (RES) {
    constexpr int kBytes = WT == GgmlType::F32 ? 4 : 2;
    const int li = row / static_cast<int>(gridDim.x);
    if (row - li * static_cast<int>(gridDim.x) == static_cast<int>(blockIdx.x) && li < m.res)
      return wsm + m.res_off + static_cast<uint32_t>(li) * m.cols * kBytes;
  }
  return Row<WT>(m, row);
}

// acc[c] = row · x[c * ldx ..] for c < r (x in shared memory), every lane gets the sums.
template <GgmlType WT, int MAXR, bool G = false>
__device__ __forceinline__ void WarpDots(const void* row, int K, const float* x, int ldx, int r,
                                         float (&acc)[MAXR]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < MAXR; ++c) acc[c] = 0.f;
  for (int i8 = lane; i8 < K / 8; i8 += 32) {
    float w[8];
    Load8<WT, G>(row, i8, w);
#pragma unroll
    for (int c = 0; c < MAXR; ++c) {
      if (c >= r) break;
      const float4* xp = reinterpret_cast<const float4*>(x + c * ldx + 8 * i8);
      const float4 a = xp[0], b = xp[1];
      float s = acc[c];
      s = fmaf(w[0], a.x, s);
      s = fmaf(w[1], a.y, s);
      s = fmaf(w[2], a.z, s);
      s = fmaf(w[3], a.w, s);
      s = fmaf(w[4], b.x, s);
      s = fmaf(w[5], b.y, s);
      s = fmaf(w[6], b.z, s);
      s = fmaf(w[7], b.w, s);
      acc[c] = s;
    }
  }
#pragma unroll
  for (int c = 0; c < MAXR; ++c)
    if (c < r) acc[c] = WarpSum(acc[c]);
}

// Rows gw, gw + GW, ... of m times x (K values in shared memory): f(row, value) on every lane
// (values are whole-warp sums). Eight rows at a time, their loads issued together: a warp's
// rows are a dependent chain of L2 round trips otherwise (the head: 16 rows per warp).
template <GgmlType WT, bool RES, typename F>
__device__ __forceinline__ void RowsTimesVector(const MtpChainMatrix& m, int n_rows, int K,
                                                const float* x, int gw, int GW, const uint8_t* wsm,
                                                F&& f) {
  constexpr int U = 8;
  const int lane = threadIdx.x & 31;
  for (int row0 = gw; row0 < n_rows; row0 += U * GW) {
    float acc[U];
#pragma unroll
    for (int u = 0; u < U; ++u) acc[u] = 0.f;
    for (int i8 = lane; i8 < K / 8; i8 += 32) {
      float w[U][8];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int row = row0 + u * GW;
        if (row < n_rows) {
          Load8<WT, RES>(RowAt<WT, RES>(m, row, wsm), i8, w[u]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) w[u][e] = 0.f;
        }
      }
      const float4* xp = reinterpret_cast<const float4*>(x + 8 * i8);
      const float4 a = xp[0], b = xp[1];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float t = acc[u];
        t = fmaf(w[u][0], a.x, t);
        t = fmaf(w[u][1], a.y, t);
        t = fmaf(w[u][2], a.z, t);
        t = fmaf(w[u][3], a.w, t);
        t = fmaf(w[u][4], b.x, t);
        t = fmaf(w[u][5], b.y, t);
        t = fmaf(w[u][6], b.z, t);
        t = fmaf(w[u][7], b.w, t);
        acc[u] = t;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float v = WarpSum(acc[u]);
      const int row = row0 + u * GW;
      if (row < n_rows) f(row, v);
    }
  }
}

// Brings the first batch (RowsTimesVector's U = 8 rows: gw, gw + GW, ...) of this warp's rows of
// m into the SM's L1 (`prefetch.global.L1`, one per 128-byte line, the lanes taking the (row,
// line) pairs in turn), issued before a stage barrier for the stage after it
// (MtpChainArgs::prefetch_weights): those rows' loads then hit L1 after the barrier instead of
// being a second dependent L2 round trip behind the stage's input vector. The arithmetic is not
// touched. K: the row's width in weights.
template <GgmlType WT>
__device__ __forceinline__ void PrefetchRows(const MtpChainMatrix& m, int n_rows, int K, int gw,
                                             int GW) {
  constexpr int kBytes = WT == GgmlType::F32 ? 4 : 2, kRows = 8;
  const int lines = (K * kBytes + 127) / 128;
  for (int t = threadIdx.x & 31; t < kRows * lines; t += 32) {
    const int u = t / lines, row = gw + u * GW;
    if (row >= n_rows) continue;
    const uint8_t* p = static_cast<const uint8_t*>(Row<WT>(m, row)) + (t - u * lines) * 128;
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
  }
}

// dst[e] = src[e] * rsqrt(mean(src²) + eps) * w[e] over n values, by one warp (src may alias dst).
__device__ __forceinline__ void WarpRmsNorm(float* dst, const float* src, const float* w, int n,
                                            float eps) {
  const int lane = threadIdx.x & 31;
  float ss = 0.f;
  for (int e = lane; e < n; e += 32) ss += src[e] * src[e];
  ss = WarpSum(ss);
  const float inv = rsqrtf(ss / n + eps);
  for (int e = lane; e < n; e += 32) dst[e] = src[e] * inv * w[e];
}

// One (head, split) of the last row's masked attention, by one warp: lane i scores position
// j0 + 32c + i of each 32-position chunk c (its K row, T = hd / 32 uint4 pairs), then every lane
// adds its T output dims over the chunk's positions, Q of them with their V loads in flight at
// once (the loads, not the arithmetic, are the chain). Writes the split's (acc, max, sum).
struct AttnItem {
  const float* q;  // [hd] shared memory, normed and roped
  const uint8_t* valid;
  int slot, kvh, j0, j1;
  float scale;
  float* part;     // [hd + 2]
};
template <int T>
__device__ __forceinline__ void AttendSplit(const KvCacheView& kv, const AttnItem& it) {
  constexpr int HD = 32 * T;
  constexpr int Q = T <= 2 ? 16 : 32 / T;  // positions whose V loads go together (32 values)
  const int lane = threadIdx.x & 31;
  const int64_t rb = kv.row_bytes();
  float m = -INFINITY, l = 0.f, acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.f;
  for (int base = it.j0; base < it.j1; base += 32) {
    const int jj = base + lane;
    float sc = -INFINITY;
    int64_t row = 0;
    if (jj < it.j1 && Coh(it.valid + jj)) {
      row = KvRow(kv, it.slot, jj) + it.kvh;
      const uint4* kr = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(kv.k) + row * rb);
      constexpr int G = HD / 8 < 8 ? HD / 8 : 8;  // uint4 loads in flight (<= 32 registers)
      float d = 0.f;
#pragma unroll
      for (int i0 = 0; i0 < HD / 8; i0 += G) {
        uint4 w[G];
#pragma unroll
        for (int i = 0; i < G; ++i) w[i] = Coh(kr + i0 + i);
#pragma unroll
        for (int i = 0; i < G; ++i) {
          const uint32_t x[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&x[c]));
            d = fmaf(it.q[8 * (i0 + i) + 2 * c], f.x, d);
            d = fmaf(it.q[8 * (i0 + i) + 2 * c + 1], f.y, d);
          }
        }
      }
      sc = d * it.scale;
    }
    const float cm = WarpMax(sc);
    if (cm == -INFINITY) continue;  // no valid row in this chunk (warp-uniform)
    const float mn = fmaxf(m, cm);
    const float corr = __expf(m - mn);  // 0 while m is -inf
    const float p = sc == -INFINITY ? 0.f : __expf(sc - mn);
    l = l * corr + WarpSum(p);
#pragma unroll
    for (int t = 0; t < T; ++t) acc[t] *= corr;
#pragma unroll
    for (int src0 = 0; src0 < 32; src0 += Q) {
      float pu[Q], vv[Q][T];
#pragma unroll
      for (int u = 0; u < Q; ++u) {
        pu[u] = __shfl_sync(0xffffffffu, p, src0 + u);
        const int64_t rl = __shfl_sync(0xffffffffu, row, src0 + u);
        const uint16_t* vr =
            reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(kv.v) + rl * rb);
#pragma unroll
        for (int t = 0; t < T; ++t)
          vv[u][t] = pu[u] != 0.f ? __half2float(__ushort_as_half(Coh(vr + lane + 32 * t))) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < Q; ++u)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[t] = fmaf(pu[u], vv[u][t], acc[t]);
    }
    m = mn;
  }
#pragma unroll
  for (int t = 0; t < T; ++t) it.part[lane + 32 * t] = acc[t];
  if (lane == 0) {
    it.part[HD] = m;
    it.part[HD + 1] = l;
  }
}

// A value other blocks wrote during the launch: this block's copy in shared memory (the resident
// form) or the global scratch, through L2.
template <bool RES>
__device__ __forceinline__ float Rd(const float* p) {
  if constexpr (RES)
    return *p;
  else
    return Coh(p);
}

// Hands a value to the next stage: in the resident form lanes 0..B-1 store it into that rank's
// copy of *p (p: this block's shared memory), otherwise lane 0 stores it to the global scratch.
// Every lane of the warp holds v.
template <bool RES>
__device__ __forceinline__ void Pub(float* p, float v) {
  const int lane = threadIdx.x & 31;
  if constexpr (RES) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (lane < static_cast<int>(gridDim.x))
      StoreCluster(MapSharedRank(p, lane), __float_as_uint(v));
#endif
  } else if (lane == 0) {
    *p = v;
  }
}

// Pub for a value one thread holds: into every rank's copy (resident form) or the global scratch.
template <bool RES>
__device__ __forceinline__ void PubAll(float* p, float v) {
  if constexpr (RES) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for (int b = 0; b < static_cast<int>(gridDim.x); ++b)
      StoreCluster(MapSharedRank(p, b), __float_as_uint(v));
#endif
  } else {
    *p = v;
  }
}

// dst = w ⊙ rmsnorm(u) for the H values of u, which other blocks wrote (warp 0 of the block;
// the caller syncs the block after it).
template <bool RES>
__device__ __forceinline__ void NormToShared(float* dst, const float* u, const float* w, int H,
                                             float eps) {
  if ((threadIdx.x >> 5) != 0) return;
  for (int e = threadIdx.x; e < H; e += 32) dst[e] = Rd<RES>(u + e);
  __syncwarp();
  WarpRmsNorm(dst, dst, w, H, eps);
}

// RoPE's (cos, sin) of pair i at position pos, in double precision as QkvPrep computes them. Not
// inlined: pow and sincos in double take many registers, and inlined at each call site of the
// prep they made ptxas spill in the kernel's other stages.
__device__ __noinline__ float2 RopeCosSin(int pos, int i, int n_rot, float rope_base) {
  const double inv_freq = pow(static_cast<double>(rope_base), -2.0 * i / n_rot);
  double sd, cd;
  sincos(static_cast<double>(pos) * inv_freq, &sd, &cd);
  return make_float2(static_cast<float>(cd), static_cast<float>(sd));
}

// One head's row of q, k or v as QkvPrep computes it, by one warp: src [hd] (a stage output
// other blocks wrote), RMS-normed with nw (q, k; null: v as it is) and roped at position pos
// (q, k), staged in `stage` (this warp's hd floats); out(e, value) takes each element.
template <bool RES, typename Out>
__device__ __forceinline__ void PrepHeadRow(const float* src, const float* nw, int pos,
                                            const AttnShape& s, float* stage, Out out) {
  const int lane = threadIdx.x & 31, hd = s.hd, half = s.n_rot / 2;
  float ss = 0.f;
  for (int e = lane; e < hd; e += 32) {
    const float x = Rd<RES>(src + e);
    stage[e] = x;
    ss += x * x;
  }
  ss = WarpSum(ss);
  const float inv = nw ? rsqrtf(ss / hd + s.eps) : 1.f;
  __syncwarp();
  for (int e = lane; e < hd; e += 32) stage[e] = nw ? stage[e] * inv * nw[e] : stage[e];
  __syncwarp();
  for (int e = lane; e < hd; e += 32) {
    float val = stage[e];
    if (nw && e < s.n_rot) {
      const float2 cs_sn = RopeCosSin(pos, e < half ? e : e - half, s.n_rot, s.rope_base);
      const float cs = cs_sn.x, sn = cs_sn.y;
      if (e < half)
        val = stage[e] * cs - stage[e + half] * sn;
      else
        val = stage[e - half] * sn + stage[e] * cs;
    }
    out(e, val);
  }
  __syncwarp();
}

// PrepHeadRow's output for a K (is_k) or V row: f16 into the plane at (slot, pos), KV head kvh.
struct PlaneRowWriter {
  uint16_t* row;
  __device__ PlaneRowWriter(const KvCacheView& kv, bool is_k, int slot, int pos, int kvh, int hd)
      : row(static_cast<uint16_t*>(is_k ? kv.k : kv.v) + (KvRow(kv, slot, pos) + kvh) * hd) {}
  __device__ void operator()(int e, float val) const {
    row[e] = __half_as_ushort(__float2half_rn(val));
  }
};

// Shared memory (floats): xs [xs_floats] | hs [H] | stage [kWarps][hd] | best | tok; then, in
// the resident form, this block's copies of the stage vectors (ResFloats) and its weights.
struct Smem {
  float* xs;
  float* hs;
  float* stage;
  float* best_v;
  int* best_i;
  int* tok;
  // Resident form: u [kMtpChainMaxRows, H] | qg [n_head * 2 hd] | k, v [kMtpChainMaxRows, kvw] |
  // q [n_head * hd] | ff [2 n_ff] | the blocks' bests (values, then indices as float bits).
  float *u, *qg, *k, *v, *q, *ff, *bests;
  uint8_t* w;  // the weights region (16-byte aligned)
};
__host__ __device__ inline int XsFloats(const MtpChainArgs& a) {
  int x = kMtpChainMaxRows * 2 * a.H;
  x = x > a.n_ff ? x : a.n_ff;
  const int o = a.shape.n_head * a.shape.hd;
  return x > o ? x : o;
}
__host__ __device__ inline int BaseFloats(const MtpChainArgs& a) {
  // rounded to 16 bytes: the resident form's vectors and weights follow
  return (XsFloats(a) + a.H + kWarps * a.shape.hd + 2 * kWarps + 4 + 3) / 4 * 4;
}
__host__ __device__ inline size_t SmemBytes(const MtpChainArgs& a) {
  return sizeof(float) * BaseFloats(a);
}
__host__ __device__ inline int ResFloats(const MtpChainArgs& a) {
  const int kvw = a.shape.n_kv * a.shape.hd;
  const int f = kMtpChainMaxRows * a.H + a.shape.n_head * 2 * a.shape.hd +
                2 * kMtpChainMaxRows * kvw + a.shape.n_head * a.shape.hd + 2 * a.n_ff +
                2 * kMtpChainMaxCluster;
  return (f + 3) / 4 * 4;
}

// JUDGED: pass 0's rows judged on the device (MtpChainCall::sampled), a build of its own: the
// default build keeps its register allocation (reading pass 0's tokens and count from shared
// memory in every build made ptxas spill 44 / 128 bytes in the global form).
//
// FOLD: the global form's S2 done inside S3 (MtpChainArgs::fold_prep), a build of its own: as a
// runtime switch both paths in one build made ptxas spill in the default one (0 -> 44 / 92 bytes).
//
// PF: the global form's weight prefetch before each stage barrier (MtpChainArgs::prefetch_weights),
// a build of its own for the same reason (a runtime switch: 0 -> 60 / 152 bytes spilled).
template <GgmlType WT, bool RES, bool JUDGED = false, bool FOLD = false, bool PF = false>
__global__ void __launch_bounds__(kMtpChainThreads) MtpChainKernel(const MtpChainArgs a) {
  extern __shared__ float4 smem_raw4[];
  float* smem_raw = reinterpret_cast<float*>(smem_raw4);
  Smem sm;
  sm.xs = smem_raw;
  sm.hs = sm.xs + XsFloats(a);
  sm.stage = sm.hs + a.H;
  sm.best_v = sm.stage + kWarps * a.shape.hd;
  sm.best_i = reinterpret_cast<int*>(sm.best_v + kWarps);
  sm.tok = sm.best_i + kWarps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // Grid warp numbers go across the blocks first, so that a stage with few items (the q/k norms,
  // the attention's splits) spreads them over the cluster's SMs instead of filling one; block b's
  // rows of a matrix are then b, b + B, ... (what the resident form keeps).
  const int gw = warp * gridDim.x + blockIdx.x, GW = gridDim.x * kWarps;
  const int H = a.H;
  const AttnShape& s = a.shape;
  const int hd = s.hd, qrows = s.n_head * 2 * hd, kvw = s.n_kv * hd;
  // Where the stage vectors live: every block's own copies (resident) or the global scratch.
  float *U = a.u, *QG = a.qg, *KB = a.k, *VB = a.v, *Q = a.q, *FF = a.ff;
  float* best_v = reinterpret_cast<float*>(a.best);
  float* best_i = reinterpret_cast<float*>(a.best + kMtpChainMaxCluster);  // ints as float bits
  const uint8_t* wsm = nullptr;
  if constexpr (RES) {
    sm.u = smem_raw + BaseFloats(a);
    sm.qg = sm.u + kMtpChainMaxRows * H;
    sm.k = sm.qg + qrows;
    sm.v = sm.k + kMtpChainMaxRows * kvw;
    sm.q = sm.v + kMtpChainMaxRows * kvw;
    sm.ff = sm.q + s.n_head * hd;
    sm.bests = sm.ff + 2 * a.n_ff;
    sm.w = reinterpret_cast<uint8_t*>(smem_raw + BaseFloats(a) + ResFloats(a));
    U = sm.u, QG = sm.qg, KB = sm.k, VB = sm.v, Q = sm.q, FF = sm.ff;
    best_v = sm.bests;
    best_i = sm.bests + kMtpChainMaxCluster;
    wsm = sm.w;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // This block's rows of every matrix into shared memory, asynchronously: the first pass's
    // S0 waits for them before its product (the mask and the normed inputs go first).
    // (Matrix by matrix, each by value: an array of pointers into the kernel's parameters would
    // copy all of them to local memory, 744 bytes of stack read for every argument after.)
    constexpr int kBytes = WT == GgmlType::F32 ? 4 : 2;
    auto load = [&](const MtpChainMatrix m) {
      const int row_chunks = m.cols * kBytes / 16;
      const int owned = (m.rows - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) /
                        static_cast<int>(gridDim.x);
      const int n = min(m.res, owned) * row_chunks;
      for (int c = threadIdx.x; c < n; c += blockDim.x) {
        const int li = c / row_chunks, ch = c - li * row_chunks;
        const uint8_t* src =
            static_cast<const uint8_t*>(Row<WT>(m, blockIdx.x + li * gridDim.x)) + 16 * ch;
        const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(
            sm.w + m.res_off + (static_cast<uint32_t>(li) * row_chunks + ch) * 16));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst),
                     "l"(__cvta_generic_to_global(src))
                     : "memory");
      }
    };
    load(a.eh);
    load(a.wq);
    load(a.wk);
    load(a.wv);
    load(a.wo);
    load(a.gate);
    load(a.up);
    load(a.down);
    load(a.head);
    asm volatile("cp.async.commit_group;" ::: "memory");
    // Every block of the cluster must have started before another stores into its shared
    // memory: the first pass's S0 waits for this arrival before its first store.
    ClusterArriveRelaxed();
#endif
  }

  // JUDGED: pass 0's tokens and row count judged from the verify's tokens into shared memory.
  // Every block judges for itself (the same values, the same answer) before its first cluster
  // barrier; the loads go out together (y crosses from pinned host memory: one round trip).
  __shared__ int pass0_n, pass0_tok[kMtpChainMaxRows], judged_y[kMtpChainMaxRows];
  if constexpr (JUDGED) {
    const int k = a.call.n_offered;
    if (static_cast<int>(threadIdx.x) <= k) {
      judged_y[threadIdx.x] = a.call.sampled[threadIdx.x];
      if (static_cast<int>(threadIdx.x) < k) pass0_tok[threadIdx.x] = a.call.offered[threadIdx.x];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int kept = 0;
      while (kept < k && pass0_tok[kept] == judged_y[kept]) ++kept;
      pass0_tok[kept] = judged_y[kept];
      pass0_n = kept + 1;
    }
    __syncthreads();
  }

  for (int j = 0; j < a.passes; ++j) {
    const int n0 = JUDGED ? pass0_n : a.n;
    const int r = j == 0 ? n0 : 1;
    // The pass's rows (MtpChainCall): the slot's, at positions pass_pos + c.
    const int pass_pos = j == 0 ? a.call.pos0 : a.call.pos0 + n0 - 1 + j;
    // ---- S0: the mask, cat = [enorm(embed[token]) | hnorm(h)] per row, u = eh_proj · cat ----
    {
      const int pos0 = pass_pos, cnt = r;
      // The old length: the call's before pass 0, the pass before's end after it.
      const int end = max(pos0 + cnt, j == 0 ? a.call.len0 : pass_pos);
      uint8_t* vrow = a.valid + a.call.slot * a.valid_ld;
      for (int p = pos0 + blockIdx.x * blockDim.x + threadIdx.x; p < end;
           p += gridDim.x * blockDim.x)
        vrow[p] = p < pos0 + cnt ? 1 : 0;
    }
    for (int item = warp; item < 2 * r; item += kWarps) {
      const int i = item >> 1;
      float* dst = sm.xs + i * 2 * H + (item & 1) * H;
      if ((item & 1) == 0) {
        int tok = j == 0 ? 0 : *sm.tok;
        if (j == 0 && JUDGED) {
          tok = pass0_tok[i];
        } else if (j == 0) {
          // Constant indices only: a dynamic index into the parameters would copy them to
          // local memory.
#pragma unroll
          for (int t = 0; t < kMtpChainMaxRows; ++t)
            if (t == i) tok = a.call.tokens[t];
        }
        const void* er = Row<WT>(a.embed, tok);
        for (int e = lane; e < H; e += 32) dst[e] = LoadOne<WT>(er, e);
        __syncwarp();
        WarpRmsNorm(dst, dst, a.enorm, H, a.eps);
      } else {
        const float* hsrc = j == 0 ? a.hid0 + static_cast<int64_t>(a.call.hid_row0 + i) * H : sm.hs;
        for (int e = lane; e < H; e += 32) dst[e] = hsrc[e];
        __syncwarp();
        WarpRmsNorm(dst, dst, a.hnorm, H, a.eps);
      }
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (RES && j == 0) {
      asm volatile("cp.async.wait_all;" ::: "memory");
      ClusterWait();
    }
#endif
    __syncthreads();
    for (int row = gw; row < H; row += GW) {
      float acc[kMtpChainMaxRows];
      WarpDots<WT, kMtpChainMaxRows, RES>(RowAt<WT, RES>(a.eh, row, wsm), 2 * H, sm.xs, 2 * H, r,
                                          acc);
      for (int c = 0; c < r; ++c) Pub<RES>(U + c * H + row, acc[c]);
    }
    if constexpr (PF) {  // S1's rows (the one-row passes' k / v warps as S1 has them)
      PrefetchRows<WT>(a.wq, qrows, H, gw, GW);
      if (r == 1) {
        PrefetchRows<WT>(a.wk, kvw, H, (gw + GW - qrows % GW) % GW, GW);
        PrefetchRows<WT>(a.wv, kvw, H, ((gw + GW - qrows % GW) % GW + kvw) % GW, GW);
      }
    }
    StageSync();

    // ---- S1: attn_norm(u) per row; k, v of every row, q (with its gate) of the last ----
    for (int i = warp; i < r; i += kWarps) {
      float* dst = sm.xs + i * H;
      for (int e = lane; e < H; e += 32) dst[e] = Rd<RES>(U + i * H + e);
      __syncwarp();
      WarpRmsNorm(dst, dst, a.attn_norm, H, a.eps);
    }
    __syncthreads();
    RowsTimesVector<WT, RES>(a.wq, qrows, H, sm.xs + (r - 1) * H, gw, GW, wsm,
                             [&](int row, float d) { Pub<RES>(QG + row, d); });
    if (r == 1) {  // every pass but the first: k and v of one row, eight rows per warp at once
      // The global form starts k and v on the warps the q rows left idle; the resident form on
      // the warps whose blocks hold their rows.
      const int gk = RES ? gw : (gw + GW - qrows % GW) % GW;
      const int gv = RES ? gw : (gk + kvw) % GW;
      RowsTimesVector<WT, RES>(a.wk, kvw, H, sm.xs, gk, GW, wsm,
                               [&](int row, float d) { Pub<RES>(KB + row, d); });
      RowsTimesVector<WT, RES>(a.wv, kvw, H, sm.xs, gv, GW, wsm,
                               [&](int row, float d) { Pub<RES>(VB + row, d); });
    } else {
      for (int idx = gw; idx < 2 * kvw; idx += GW) {
        const bool is_k = idx < kvw;
        const int rr = idx - (is_k ? 0 : kvw);
        float acc[kMtpChainMaxRows];
        WarpDots<WT, kMtpChainMaxRows, RES>(RowAt<WT, RES>(is_k ? a.wk : a.wv, rr, wsm), H, sm.xs,
                                            H, r, acc);
        float* out = is_k ? KB : VB;
        for (int c = 0; c < r; ++c) Pub<RES>(out + c * kvw + rr, acc[c]);
      }
    }
    StageSync();

    // The global form's folded build (FOLD, MtpChainArgs::fold_prep) does S2 inside S3 (each
    // attention warp preps its head's q and the new K/V rows of its split itself): one stage
    // barrier fewer per pass. The other builds keep the stage, written as before the fold (in
    // PrepHeadRow's shape it made ptxas spill in them).
    constexpr bool fold = !RES && FOLD;
    if constexpr (!fold) {
      // ---- S2: q / k norms and RoPE (QkvPrep's arithmetic), K/V rows into the plane ----
      {
        const int n_items = r * 2 * s.n_kv + s.n_head;
        float* stage = sm.stage + warp * hd;
        const int half = s.n_rot / 2;
        for (int item = gw; item < n_items; item += GW) {
          int c, head;  // head: < n_head query, then n_kv keys, then n_kv values
          if (item < r * 2 * s.n_kv) {
            c = item / (2 * s.n_kv);
            head = s.n_head + item % (2 * s.n_kv);
          } else {
            c = r - 1;
            head = item - r * 2 * s.n_kv;
          }
          const int pos = pass_pos + c, slot = a.call.slot;
          const float* src;
          const float* nw = nullptr;
          if (head < s.n_head) {
            src = QG + head * 2 * hd;
            nw = a.q_norm;
          } else if (head < s.n_head + s.n_kv) {
            src = KB + c * kvw + (head - s.n_head) * hd;
            nw = a.k_norm;
          } else {
            src = VB + c * kvw + (head - s.n_head - s.n_kv) * hd;
          }
          float ss = 0.f;
          for (int e = lane; e < hd; e += 32) {
            const float x = Rd<RES>(src + e);
            stage[e] = x;
            ss += x * x;
          }
          ss = WarpSum(ss);
          const float inv = nw ? rsqrtf(ss / hd + s.eps) : 1.f;
          __syncwarp();
          for (int e = lane; e < hd; e += 32) stage[e] = nw ? stage[e] * inv * nw[e] : stage[e];
          __syncwarp();
          const int64_t kvrow = head >= s.n_head ? KvRow(a.kv, slot, pos) : 0;
          for (int e = lane; e < hd; e += 32) {
            float val = stage[e];
            if (nw && e < s.n_rot) {
              const int i = e < half ? e : e - half;
              const double inv_freq = pow(static_cast<double>(s.rope_base), -2.0 * i / s.n_rot);
              double sd, cd;
              sincos(static_cast<double>(pos) * inv_freq, &sd, &cd);
              const float cs = static_cast<float>(cd), sn = static_cast<float>(sd);
              if (e < half)
                val = stage[e] * cs - stage[e + half] * sn;
              else
                val = stage[e - half] * sn + stage[e] * cs;
            }
            if (head < s.n_head) {
              PubAll<RES>(Q + head * hd + e, val);
            } else {
              const bool is_k = head < s.n_head + s.n_kv;
              const int64_t hrow = kvrow + head - s.n_head - (is_k ? 0 : s.n_kv);
              static_cast<uint16_t*>(is_k ? a.kv.k : a.kv.v)[hrow * hd + e] =
                  __half_as_ushort(__float2half_rn(val));
            }
          }
          __syncwarp();
        }
      }
      StageSync();
    }

    // ---- S3: the last row's masked attention over [0, pos], one warp per (head, split) ----
    const int qslot = a.call.slot, qpos = pass_pos + r - 1;
    const int n_pos = qpos + 1;
    const int chunks = (n_pos + 31) / 32;
    int splits = min(a.max_parts, max(1, GW / s.n_head));
    splits = min(splits, chunks);
    const int per = (chunks + splits - 1) / splits * 32;  // positions per split
    splits = (n_pos + per - 1) / per;
    {
      const float* qv = Q;
      if constexpr (!RES && !fold) {  // S2's q from the global scratch into shared memory
        for (int e = threadIdx.x; e < s.n_head * hd; e += blockDim.x) sm.xs[e] = Coh(a.q + e);
        __syncthreads();
        qv = sm.xs;
      }
      const uint8_t* vmask = a.valid + qslot * a.valid_ld;
      const int group = s.n_head / s.n_kv;
      const float scale = rsqrtf(static_cast<float>(hd));
      for (int item = gw; item < s.n_head * splits; item += GW) {
        const int h = item / splits, sp = item % splits;
        const int j0 = sp * per, j1 = min(n_pos, j0 + per);
        float* part = a.parts + (static_cast<int64_t>(h) * a.max_parts + sp) * (hd + 2);
        const float* qh = qv + h * hd;
        if constexpr (fold) {
          // S2's work for this item: the pass's new K/V rows within [j0, j1) of this head's KV
          // head into the plane (the other heads of its group write the same values), then
          // this head's q into this warp's part of xs. The same arithmetic as S2.
          float* stage = sm.stage + warp * hd;
          const int kvh = h / group;
          for (int c = max(0, j0 - pass_pos); c < r && pass_pos + c < j1; ++c) {
            const int pos = pass_pos + c;
            PrepHeadRow<RES>(KB + c * kvw + kvh * hd, a.k_norm, pos, s, stage,
                             PlaneRowWriter(a.kv, true, qslot, pos, kvh, hd));
            PrepHeadRow<RES>(VB + c * kvw + kvh * hd, nullptr, pos, s, stage,
                             PlaneRowWriter(a.kv, false, qslot, pos, kvh, hd));
          }
          float* qw = sm.xs + warp * hd;  // XsFloats >= kWarps * hd (H >= hd)
          PrepHeadRow<RES>(QG + h * 2 * hd, a.q_norm, qpos, s, stage,
                           [&](int e, float val) { qw[e] = val; });
          qh = qw;
        }
        const AttnItem it{qh, vmask, qslot, h / group, j0, j1, scale, part};
        switch (hd) {  // MtpChainSupported: 32, 64, 128 or 256
          case 32: AttendSplit<1>(a.kv, it); break;
          case 64: AttendSplit<2>(a.kv, it); break;
          case 128: AttendSplit<4>(a.kv, it); break;
          default: AttendSplit<8>(a.kv, it); break;
        }
      }
    }
    if constexpr (PF) PrefetchRows<WT>(a.wo, H, s.n_head * hd, gw, GW);
    StageSync();

    // ---- S4: merge the splits (every block, all heads), gate, u += o_proj · o ----
    float* u_last = U + (r - 1) * H;
    for (int e = threadIdx.x; e < s.n_head * hd; e += blockDim.x) {
      const int h = e / hd, d = e % hd;
      const float* part = a.parts + static_cast<int64_t>(h) * a.max_parts * (hd + 2);
      float M = -INFINITY;
      for (int sp = 0; sp < splits; ++sp) M = fmaxf(M, Coh(part + sp * (hd + 2) + hd));
      float vsum = 0.f, L = 0.f;
      for (int sp = 0; sp < splits; ++sp) {
        const float pm = Coh(part + sp * (hd + 2) + hd);
        if (!(pm > -INFINITY)) continue;
        const float w = __expf(pm - M);
        vsum += Coh(part + sp * (hd + 2) + d) * w;
        L += Coh(part + sp * (hd + 2) + hd + 1) * w;
      }
      const float o = L > 0.f ? vsum / L : 0.f;
      sm.xs[e] = o * Sigmoid(Rd<RES>(QG + h * 2 * hd + hd + d));
    }
    __syncthreads();
    // The residual: u += W x, row by row (only the row's owner reads it in this stage).
    auto add_to_u = [&](int row, float d) {
      if constexpr (RES)
        Pub<true>(u_last + row, u_last[row] + d);  // every block's copy
      else if (lane == 0)
        u_last[row] = Coh(u_last + row) + d;  // one lane reads and writes the scratch
    };
    RowsTimesVector<WT, RES>(a.wo, H, s.n_head * hd, sm.xs, gw, GW, wsm, add_to_u);
    if constexpr (PF) {
      PrefetchRows<WT>(a.gate, a.n_ff, H, gw, GW);
      PrefetchRows<WT>(a.up, a.n_ff, H, gw, GW);
    }
    StageSync();

    // ---- S5: ff = silu(gate · post_norm(u)) * (up · post_norm(u)) ----
    NormToShared<RES>(sm.xs, u_last, a.post_norm, H, a.eps);
    __syncthreads();
    // gate rows into ff[0, n_ff), up rows into ff[n_ff, 2 n_ff); S6 multiplies them.
    RowsTimesVector<WT, RES>(a.gate, a.n_ff, H, sm.xs, gw, GW, wsm,
                             [&](int row, float d) { Pub<RES>(FF + row, d); });
    RowsTimesVector<WT, RES>(a.up, a.n_ff, H, sm.xs, gw, GW, wsm,
                             [&](int row, float d) { Pub<RES>(FF + a.n_ff + row, d); });
    if constexpr (PF) PrefetchRows<WT>(a.down, H, a.n_ff, gw, GW);
    StageSync();

    // ---- S6: u += down · ff ----
    for (int e = threadIdx.x; e < a.n_ff; e += blockDim.x)
      sm.xs[e] = Silu(Rd<RES>(FF + e)) * Rd<RES>(FF + a.n_ff + e);
    __syncthreads();
    RowsTimesVector<WT, RES>(a.down, H, a.n_ff, sm.xs, gw, GW, wsm, add_to_u);
    if constexpr (PF) PrefetchRows<WT>(a.head, a.n_vocab, H, gw, GW);
    StageSync();

    // ---- S7: h' = shared_head_norm(u); logits = head · h'; each block's best ----
    NormToShared<RES>(sm.hs, u_last, a.head_norm, H, a.eps);
    __syncthreads();
    if (blockIdx.x == 0 && j == a.passes - 1)
      for (int e = threadIdx.x; e < H; e += blockDim.x) a.hid_out[e] = sm.hs[e];
    {
      float bv = -INFINITY;
      int bi = INT32_MAX;
      RowsTimesVector<WT, RES>(a.head, a.n_vocab, H, sm.hs, gw, GW, wsm, [&](int row, float d) {
        if (lane == 0) a.logits[row] = d;
        Better(bv, bi, d, row);
      });
      if (lane == 0) {
        sm.best_v[warp] = bv;
        sm.best_i[warp] = bi;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 1; w < kWarps; ++w) Better(bv, bi, sm.best_v[w], sm.best_i[w]);
        PubAll<RES>(best_v + blockIdx.x, bv);
        PubAll<RES>(best_i + blockIdx.x, __int_as_float(bi));
      }
    }
    if constexpr (PF)
      if (j + 1 < a.passes) PrefetchRows<WT>(a.eh, H, 2 * H, gw, GW);
    StageSync();

    // ---- S8: every block takes the argmax of the blocks' bests: the next pass's token ----
    if (warp == 0) {
      float bv = -INFINITY;
      int bi = INT32_MAX;
      for (int b = lane; b < gridDim.x; b += 32)
        Better(bv, bi, Rd<RES>(best_v + b), __float_as_int(Rd<RES>(best_i + b)));
      WarpBest(bv, bi);
      if (lane == 0) {
        *sm.tok = bi;
        if (blockIdx.x == 0) {
          if constexpr (!JUDGED) a.drafts[j] = bi;
          if (a.slot_drafts != nullptr) {
            const int64_t at = static_cast<int64_t>(a.call.slot) * a.slot_drafts_ld + j;
            a.slot_drafts[at] = bi;
            a.slot_drafts_host[at] = bi;
          }
        }
      }
    }
    __syncthreads();
  }
}

template <bool RES, bool JUDGED, bool FOLD = false, bool PF = false>
void (*KernelOf(GgmlType t))(const MtpChainArgs) {
  switch (t) {
    case GgmlType::F32:
      return MtpChainKernel<GgmlType::F32, RES, JUDGED, FOLD, PF>;
    case GgmlType::BF16:
      return MtpChainKernel<GgmlType::BF16, RES, JUDGED, FOLD, PF>;
    default:
      return MtpChainKernel<GgmlType::F16, RES, JUDGED, FOLD, PF>;
  }
}

template <bool JUDGED, bool FOLD>
void (*GlobalKernel(GgmlType t, bool prefetch))(const MtpChainArgs) {
  return prefetch ? KernelOf<false, JUDGED, FOLD, true>(t) : KernelOf<false, JUDGED, FOLD>(t);
}

// The judged, folded and prefetching builds exist for the global form only (MtpChain refuses
// judging with the resident one; fold_prep and prefetch_weights are ignored there).
void (*Kernel(GgmlType t, bool resident, bool judged = false, bool fold = false,
              bool prefetch = false))(const MtpChainArgs) {
  if (resident) return KernelOf<true, false>(t);
  if (fold)
    return judged ? GlobalKernel<true, true>(t, prefetch) : GlobalKernel<false, true>(t, prefetch);
  return judged ? GlobalKernel<true, false>(t, prefetch) : GlobalKernel<false, false>(t, prefetch);
}

}  // namespace

absl::Status MtpChainSupported(const MtpChainArgs& a) {
  if (a.type != GgmlType::F32 && a.type != GgmlType::F16 && a.type != GgmlType::BF16)
    return absl::UnimplementedError(absl::StrCat("fused MTP chain: weight type ",
                                                 std::string(GgmlInfo(a.type).name),
                                                 " (F32, F16, BF16 only)"));
  const AttnShape& s = a.shape;
  if (a.H <= 0 || a.H % 8 != 0 || a.n_ff <= 0 || a.n_ff % 8 != 0 || a.n_vocab <= 0)
    return absl::UnimplementedError("fused MTP chain: widths must be multiples of 8");
  if (s.n_kv <= 0 || s.n_head % s.n_kv != 0 ||
      (s.hd != 32 && s.hd != 64 && s.hd != 128 && s.hd != 256) || s.n_rot > s.hd ||
      (s.n_head * s.hd) % 8 != 0)
    return absl::UnimplementedError("fused MTP chain: attention shape");
  if (a.kv.type != GgmlType::F16) return absl::UnimplementedError("fused MTP chain: K/V not f16");
  const struct {
    const MtpChainMatrix& m;
    int rows, cols;
  } mats[] = {{a.embed, a.n_vocab, a.H}, {a.eh, a.H, 2 * a.H},
              {a.wq, s.n_head * 2 * s.hd, a.H}, {a.wk, s.n_kv * s.hd, a.H},
              {a.wv, s.n_kv * s.hd, a.H}, {a.wo, a.H, s.n_head * s.hd},
              {a.gate, a.n_ff, a.H}, {a.up, a.n_ff, a.H},
              {a.down, a.H, a.n_ff}, {a.head, a.n_vocab, a.H}};
  for (const auto& m : mats)
    if (!m.m.d || m.m.rows != m.rows || m.m.cols != m.cols ||
        reinterpret_cast<uintptr_t>(m.m.d) % 16 != 0)
      return absl::UnimplementedError("fused MTP chain: a matrix of another shape");
  if (a.n < 1 || a.n > kMtpChainMaxRows || a.passes < 1)
    return absl::UnimplementedError(absl::StrCat("fused MTP chain: ", a.n, " rows, ", a.passes,
                                                 " passes"));
  if (SmemBytes(a) > 48 * 1024)
    return absl::UnimplementedError("fused MTP chain: too wide for its shared memory");
  return absl::OkStatus();
}

namespace {
cudaLaunchConfig_t LaunchConfig(const MtpChainArgs& a, cudaStream_t stream,
                                cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(a.blocks);
  cfg.blockDim = dim3(kMtpChainThreads);
  cfg.dynamicSmemBytes = a.smem_bytes > 0 ? a.smem_bytes : SmemBytes(a);
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = a.blocks;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}
}  // namespace

// The resident form's plan for a cluster of b blocks within `smem_max` bytes of shared memory
// per block (mtp_chain_plan.h: the matrices in stage order, the LM head last): sets the
// matrices' res / res_off and a->smem_bytes.
void PlanResident(MtpChainArgs* a, int b, size_t smem_max) {
  const size_t fixed = SmemBytes(*a) + sizeof(float) * ResFloats(*a);
  MtpChainMatrix* mats[kMtpChainResidentMats] = {&a->eh,   &a->wq, &a->wk,   &a->wv,  &a->wo,
                                                 &a->gate, &a->up, &a->down, &a->head};
  std::array<MtpChainMatShape, kMtpChainResidentMats> shapes;
  for (int m = 0; m < kMtpChainResidentMats; ++m) shapes[m] = {mats[m]->rows, mats[m]->cols};
  const MtpChainResidentPlan p = PlanMtpChainResident(
      shapes, a->type == GgmlType::F32 ? 4 : 2, b, smem_max > fixed ? smem_max - fixed : 0);
  for (int m = 0; m < kMtpChainResidentMats; ++m) {
    mats[m]->res = p.rows[m];
    mats[m]->res_off = p.offset[m];
  }
  a->smem_bytes = static_cast<int>(fixed + p.bytes);
}

absl::Status MtpChainConfigure(MtpChainArgs* a, int device, int want, bool resident) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return absl::InternalError("fused MTP chain: no device attributes");
  if (major < 9) return absl::UnimplementedError("fused MTP chain: thread-block clusters need sm_90");
  auto kernel = Kernel(a->type, resident);
  int smem_optin = 0;
  if (resident && cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                         device) != cudaSuccess)
    return absl::InternalError("fused MTP chain: no device attributes");
  // The kernel's barrier exists in code compiled for sm_90+ only (a build for older targets run
  // on an H100 through PTX carries the trap in its place).
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess || fa.ptxVersion < 90) {
    (void)cudaGetLastError();
    return absl::UnimplementedError("fused MTP chain: this build has no sm_90 code for it");
  }
  // The largest cluster up to `want` (default kMtpChainMaxCluster) the device can place (16 needs
  // the non-portable opt-in).
  (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (!resident)  // the judged, folded and prefetching builds launch in the same configuration
    for (const bool judged : {false, true})
      for (const bool fold : {false, true})
        for (const bool prefetch : {false, true})
          (void)cudaFuncSetAttribute(Kernel(a->type, false, judged, fold, prefetch),
                                     cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int b = want > 0 ? std::min(want, kMtpChainMaxCluster) : kMtpChainMaxCluster; b >= 1; b /= 2) {
    MtpChainArgs t = *a;
    t.blocks = b;
    t.resident = resident;
    t.smem_bytes = 0;
    if (resident) {
      PlanResident(&t, b, static_cast<size_t>(smem_optin));
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, t.smem_bytes) !=
          cudaSuccess) {
        (void)cudaGetLastError();
        continue;
      }
    }
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = LaunchConfig(t, nullptr, attr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0) {
      *a = t;
      return absl::OkStatus();
    }
    (void)cudaGetLastError();
  }
  return absl::UnimplementedError("fused MTP chain: no cluster fits");
}

absl::Status MtpChain(const MtpChainArgs& a, cudaStream_t stream) {
  if (a.blocks < 1 || a.blocks > kMtpChainMaxCluster || !a.best || !a.drafts ||
      (a.slot_drafts != nullptr &&
       (a.slot_drafts_host == nullptr || a.slot_drafts_ld < a.passes)) ||
      (a.call.sampled != nullptr &&
       (a.resident || a.call.n_offered < 0 || a.call.n_offered >= kMtpChainMaxRows ||
        a.n != a.call.n_offered + 1 || (a.call.n_offered > 0 && a.call.offered == nullptr))))
    return absl::InvalidArgumentError("fused MTP chain: bad launch arguments");
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = LaunchConfig(a, stream, attr);
  const cudaError_t e = cudaLaunchKernelEx(
      &cfg, Kernel(a.type, a.resident, a.call.sampled != nullptr, a.fold_prep, a.prefetch_weights),
      a);
  if (e != cudaSuccess)
    return absl::InternalError(absl::StrCat("fused MTP chain launch: ", cudaGetErrorString(e)));
  return LastLaunchStatus("fused MTP chain");
}

}  // namespace ds::cuda
