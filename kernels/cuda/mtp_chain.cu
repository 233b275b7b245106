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
#include "kernels/cuda/mtp_chain_stages.cuh"

namespace ds::cuda {
namespace {

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
        PrefetchRows<WT>(a.wk, kvw, H, KRowsWarp(gw, GW, qrows), GW);
        PrefetchRows<WT>(a.wv, kvw, H, VRowsWarp(gw, GW, qrows, kvw), GW);
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
      const int gk = RES ? gw : KRowsWarp(gw, GW, qrows);
      const int gv = RES ? gw : VRowsWarp(gw, GW, qrows, kvw);
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
