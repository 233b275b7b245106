// The fused MTP draft chain's building blocks (mtp_chain.cu's kernel is made of them): the
// stage barrier, weight row loads and the warp matrix products, the weight prefetch, the norms,
// one attention split, the coherent reads / publishes of stage vectors (global or distributed
// shared memory) and the q / k / v head prep. Internal to mtp_chain.cu (an unnamed namespace).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/argmax_reduce.cuh"
#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/cluster.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mtp_chain.cuh"

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
  if constexpr (WT == GgmlType::F32)
    return static_cast<const float*>(row)[e];
  else if constexpr (WT == GgmlType::F16)
    return __half2float(static_cast<const __half*>(row)[e]);
  else
    return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(row)[e]) << 16);
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

// The global form's S1 in a one-row pass: the grid warp number warp gw passes RowsTimesVector for
// k's rows and for v's (its first row of each), so that k and v start on the warps the qrows q
// rows left idle.
__device__ __forceinline__ int KRowsWarp(int gw, int GW, int qrows) {
  return (gw + GW - qrows % GW) % GW;
}
__device__ __forceinline__ int VRowsWarp(int gw, int GW, int qrows, int kvw) {
  return (KRowsWarp(gw, GW, qrows) + kvw) % GW;
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
  float* part;  // [hd + 2]
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
      const uint4* kr =
          reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(kv.k) + row * rb);
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

}  // namespace
}  // namespace ds::cuda
