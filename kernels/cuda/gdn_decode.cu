// Gated DeltaNet decode (see gdn.cuh): one token per sequence, or a run of tokens of one
// sequence (an MTP verify, a replay), per launch. Thread j of a block owns value column j of one
// head's state S[h] (dk x dv), so the delta rule needs no cross-thread reduction: only q/k
// l2norm and the gated RMSNorm reduce over the block.
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gdn.cuh"
#include "kernels/cuda/gdn_common.cuh"
#include "kernels/cuda/gdn_state.cuh"
#include "kernels/cuda/quantize_block.cuh"

namespace ds::cuda {
namespace {

// k rows of the state per thread in the decode kernel: a column of DK rows is split over
// DK / KPT threads (v1: one thread per column walked all 128 rows twice, ~16 dependent load
// rounds per pass: 27 us per layer for 192 KiB at depth 0 on the H200, 2026-11-29).
template <int DK>
constexpr int KPerThread() {
  return DK < 32 ? DK : 32;
}

// Block = (DK / KPT) groups of WarpRound(dv) threads; thread (g, j) owns rows
// [g*KPT, (g+1)*KPT) of value column j, holding them in registers between the two passes
// (one HBM read and one write of the state, both with KPT loads in flight per thread).
// kMinBlocks 2 caps the registers at 64 (96 otherwise, a few bytes spilled) so that two blocks
// share an SM: twice the state loads in flight when there are blocks enough to fill the card
// (batched decode: x64 7.3 vs 9.1 ms per step on the 27B, H200), while one block per SM keeps
// the unspilled form for small launches (one stream: 0.48 vs 0.52 ms per token). The same
// arithmetic either way. TS: the state's storage type (gdn_state.cuh).
//
// kBulk (sm_90, GdnDecodeArgs::bulk_state; kMinBlocks 3): the head's state comes into dynamic
// shared memory by one bulk copy (bulk_copy.cuh) that thread 0 issues before the prologue, and
// each thread reads its rows from there instead of holding them in registers. So no register
// waits on the state while the prologue runs, and three blocks share an SM (3 x 64 KiB of f32
// state in flight) where the register form fits two. Thread (g, j) touches only its own
// elements of that copy (column j, rows of group g), in the register form's order: the same
// floats, the same bits.
//
// The register form splits the prologue's convolutions over the groups: q in group 0, k in group
// 1, v in group 2 (as many as the block has; dk = 64: v with q), so group 0 no longer does all
// three while the others wait at the barrier (6-8% per launch on an H100). The same bits:
// BlockSums' butterfly combines an aligned block of warps alike wherever it sits, the other
// warps adding zeros. The bulk form keeps the prologue in group 0: its state copy is in flight
// meanwhile and the split gained nothing there (kernels/cuda/README.md "The prologue over three
// groups" has the figures).
template <int DK, int kMinBlocks, typename TS, bool kBulk = false, bool kStateEarly = false>
__global__ void __launch_bounds__(512, kMinBlocks) GdnDecodeKernel(const GdnDecodeArgs a) {
  constexpr bool kSpread = !kBulk;
  constexpr int KPT = KPerThread<DK>(), NG = DK / KPT;
  __shared__ float qs[DK], ks[DK], vs[128], scratch[32], scratch2[2][32], red[NG][128];
  __shared__ uint64_t state_bar;                                // kBulk: the state copy's barrier
  extern __shared__ __align__(128) unsigned char state_smem[];  // kBulk: [DK][dv] of TS
  // Launched early: nothing before this, or with kStateEarly (GdnDecodeArgs::state_early) only
  // the state's loads (or copy) and the index arrays they need.
  if constexpr (!kStateEarly) {
    WaitForPrerequisiteGrids();
    AllowDependentLaunch();  // ssm_out's column kernel may start loading its weights
  }
  const GdnShape& d = a.shape;
  const int dvr = blockDim.x / NG;  // dv rounded up to a warp
  const int h = blockIdx.x, i = blockIdx.y, tid = threadIdx.x;
  const int grp = tid / dvr, j = tid % dvr;
  const int C = d.channels(), Kw = d.k_heads * DK, dv = d.v_dim, Hv = d.v_heads;
  const int kh = h % d.k_heads;
  const bool jv = j < dv;
  // The block's tokens: one (a wave), or a run's, in order.
  const int e0 = a.run_first ? a.run_first[i] : i;
  const int n_tok = a.run_first ? a.run_len[i] : 1;
  int in = a.in_slots ? a.in_slots[e0] : a.slots[e0];  // speculative: read `in`, write `slot`
  const int p0 = a.pos[e0];
  const TS* S_in =
      static_cast<const TS*>(a.state) + (static_cast<int64_t>(in) * Hv + h) * DK * dv + j;

  // Issue the state loads first: they do not depend on the prologue.
  float st[kBulk ? 1 : KPT];
  TS* const ss = reinterpret_cast<TS*>(state_smem) + j;  // kBulk: element [k][j] at ss[k * dv]
  if constexpr (kBulk) {
    if (tid == 0) {
      MbarrierInitForBulkCopy(&state_bar);
      BulkCopyToShared(state_smem, S_in - j, static_cast<uint32_t>(DK * dv * sizeof(TS)),
                       &state_bar);
    }
  } else if (jv) {
#pragma unroll
    for (int k = 0; k < KPT; ++k) st[k] = LoadState(S_in + (grp * KPT + k) * dv);
  }
  if constexpr (kStateEarly) {
    WaitForPrerequisiteGrids();
    AllowDependentLaunch();
  }
  // The conv history (pre-conv values of positions p-3..p-1) of the channels this thread
  // convolves, from the input ring; later tokens of a run shift their own values in.
  const int cq = kh * DK + j, ck = Kw + kh * DK + j, cv = 2 * Kw + h * dv + j;
  constexpr int kGroupK = kSpread && NG > 1 ? 1 : 0, kGroupV = kSpread && NG > 2 ? 2 : 0;
  const bool q_thread = grp == 0 && j < DK, k_thread = grp == kGroupK && j < DK,
             v_thread = grp == kGroupV && jv;
  float hq[kConvK - 1], hk[kConvK - 1], hv[kConvK - 1];
  {
    const float* ring_in = a.conv_ring + static_cast<int64_t>(in) * kConvK * C;
#pragma unroll
    for (int tap = 0; tap < kConvK - 1; ++tap) {
      const int r = Mod(p0 - (kConvK - 1) + tap, kConvK);
      hq[tap] = q_thread ? ring_in[r * C + cq] : 0.f;
      hk[tap] = k_thread ? ring_in[r * C + ck] : 0.f;
      hv[tap] = v_thread ? ring_in[r * C + cv] : 0.f;
    }
  }

  for (int t = 0; t < n_tok; ++t) {
    const int e = e0 + t;
    const int row = a.rows[e], slot = a.slots[e], p = a.pos[e];
    if (t > 0) {
      in = a.slots[e - 1];  // the previous token's state (in registers already)
      __syncthreads();      // qs / ks / vs / red of the previous token are read by now
    }
    const float* m = a.mixed + static_cast<int64_t>(row) * C;
    float* ring = a.conv_ring + static_cast<int64_t>(slot) * kConvK * C;
    const int cur_row = Mod(p, kConvK);
    TS* S = static_cast<TS*>(a.state) + (static_cast<int64_t>(slot) * Hv + h) * DK * dv + j;

    // Causal conv over the history (rows p-3..p-1) plus the current pre-conv value; the owner
    // block stores the current value into ring row p % K (and, when the output is another state
    // index, the K-1 rows it read, so that the output ring is complete). q_thread / k_thread /
    // v_thread run it (groups 0 / 1 / 2 in the register form, group 0 in the bulk form).
    auto conv = [&](int c, float* hist, bool owner) {
      const float cur = m[c];
      const float* w = a.p.conv_w + static_cast<int64_t>(c) * kConvK;
      float acc = w[kConvK - 1] * cur;
#pragma unroll
      for (int tap = 0; tap < kConvK - 1; ++tap) {
        const float prev = hist[tap];
        acc += w[tap] * prev;
        if (owner && in != slot) ring[Mod(p - (kConvK - 1) + tap, kConvK) * C + c] = prev;
      }
      if (owner) ring[cur_row * C + c] = cur;
#pragma unroll
      for (int tap = 0; tap < kConvK - 2; ++tap) hist[tap] = hist[tap + 1];
      hist[kConvK - 2] = cur;
      return Silu(acc);
    };

    float qv = 0.f, kv = 0.f;
    const bool owner = h < d.k_heads;  // exactly one block per key head writes its q/k channels
    if (q_thread) qv = conv(cq, hq, owner);
    if (k_thread) kv = conv(ck, hk, owner);
    if (v_thread) vs[j] = conv(cv, hv, true);
    float sums[2] = {qv * qv, kv * kv};
    BlockSums<2>(sums, scratch2);
    const float qss = sums[0], kss = sums[1];
    if (q_thread) qs[j] = qv * rsqrtf(qss + a.p.eps) * rsqrtf(static_cast<float>(DK));
    if (k_thread) ks[j] = kv * rsqrtf(kss + a.p.eps);
    const float beta = Sigmoid(a.b[static_cast<int64_t>(row) * Hv + h]);
    const float g =
        a.p.ssm_a[h] * Softplus(a.alpha[static_cast<int64_t>(row) * Hv + h] + a.p.dt_bias[h]);
    const float decay = __expf(g);
    __syncthreads();
    // The barrier's first phase (the bulk copy) is waited for once; later tokens of a run read
    // what this thread stored back.
    if constexpr (kBulk) {
      if (t == 0) MbarrierWait(&state_bar, 0);
    }

    float u = 0.f;
    if (jv) {
      if constexpr (kBulk) {
        // The decayed value is recomputed in the second pass: the same product, the same bits.
#pragma unroll
        for (int k = 0; k < KPT; ++k)
          u = fmaf(LoadState(ss + (grp * KPT + k) * dv) * decay, ks[grp * KPT + k], u);
      } else {
#pragma unroll
        for (int k = 0; k < KPT; ++k) {
          st[k] *= decay;
          u = fmaf(st[k], ks[grp * KPT + k], u);
        }
      }
      red[grp][j] = u;
    }
    __syncthreads();
    float o = 0.f;
    if (jv) {
      u = 0.f;
#pragma unroll
      for (int g2 = 0; g2 < NG; ++g2) u += red[g2][j];
      const float delta = beta * (vs[j] - u);
#pragma unroll
      for (int k = 0; k < KPT; ++k) {
        if constexpr (kBulk) {
          TS* const e = ss + (grp * KPT + k) * dv;
          const float x = fmaf(ks[grp * KPT + k], delta, LoadState(e) * decay);
          o = fmaf(x, qs[grp * KPT + k], o);
          StoreState(S + (grp * KPT + k) * dv, x);
          StoreState(e, x);  // the stored value, which a run's next token reads
        } else {
          st[k] = fmaf(ks[grp * KPT + k], delta, st[k]);
          o = fmaf(st[k], qs[grp * KPT + k], o);
          StoreState(S + (grp * KPT + k) * dv, st[k]);
          st[k] = AsStored<TS>(st[k]);  // a run's next token reads the stored state
        }
      }
    }
    __syncthreads();  // every thread has read red[][j] (u) before it is reused for o
    if (jv) red[grp][j] = o;
    __syncthreads();
    o = 0.f;
    if (grp == 0 && jv) {
#pragma unroll
      for (int g2 = 0; g2 < NG; ++g2) o += red[g2][j];
    }
    const float oss = BlockSum(o * o, scratch);
    const int64_t oi = static_cast<int64_t>(row) * Hv * dv + h * dv + j;
    if (grp == 0 && jv) {
      const float y = o * rsqrtf(oss / dv + a.p.eps) * a.p.norm_w[j] * Silu(a.z[oi]);
      a.out[oi] = y;
      if (a.xq) {  // dv % 32 == 0: warp j / 32 of group 0 holds one whole 32-element block
        const int blk = (row * Hv + h) * (dv >> 5) + (j >> 5);
        QuantizeBlock32(y, j & 31, a.xq + 32 * blk, a.xd + blk,
                        a.xsum ? a.xsum + 2 * blk : nullptr);
      }
    }
  }
}

// GdnDecodeKernel's one-per-SM form, reorganized for runs (a speculative verify, a replay; one
// stream's decode takes it too): a block's tokens go in chunks of CH — a prologue for the chunk's
// tokens together (conv, the q/k l2norm sums in one BlockSums, the gates: nothing there depends
// on the state), then the state update token by token with one barrier each (the u partials
// double-buffered by token), then an epilogue for the chunk together (the o sums, the gated
// norm's sums in one BlockSums, the output). Every value takes the same operations in the same
// order as in GdnDecodeKernel (BlockSums reduces each of its values as BlockSum does; the conv
// and the output are written as there), so the two kernels give the same bits and a decode row
// does not depend on which form its step took (batch_invariance_test, mtp_gpu_test's verify =
// decode checks, on the H200). Why: a run's token cost ~790 instructions per warp and 7 barriers
// when each token ran the whole body alone (ncu, the demo model's 4-token verify run, H200,
// 2026-12-04); the verify's gdn_core went 0.089-0.097 -> 0.080 ms per step. The two-per-SM form
// keeps GdnDecodeKernel: this one with CH = 1 under its 64 registers spilled more (156 vs 84
// bytes) and cost x16 / x64 3-4%. (The conv and output code is the same as GdnDecodeKernel's,
// not shared through helpers: that refactor changed ptxas's register allocation of the other
// kernel and could not be measured on the device in this session.)
//
// kSpreadTokens (GdnDecodeArgs::spread_run_tokens): token c of a chunk has its prologue (conv, q/k
// norms, v) and its epilogue (o sums, gated norm, output) in group c % NG instead of group 0,
// which otherwise ran every token's while the other groups waited at the next barrier (ncu, the
// demo's verify run: ~1,400 instructions a token in group 0's warps against ~300 in group 1's,
// 2026-12-07). Every group keeps the conv history of every token (it shifts each token's input
// in) and computes only its own tokens. The same bits: the q/k and output sums of a token have
// their non-zero warp partials in one aligned group of warps either way, and BlockSums' xor
// butterfly adds the other warps' zeros exactly.
//
// kOneGroup (GdnDecodeArgs::one_group_runs; dk = 64): one thread group, each thread holding its
// whole state column (all NG groups' rows), so the token-by-token update needs no barrier: the
// thread takes each group's partial sum (u, o) in the group's own order and adds them as the
// groups' threads would have through shared memory (0 + p_0 + p_1 ...), and BlockSums over fewer
// warps combines the same non-zero warp partials in the same order. The same bits.
//
// kDv > 0: the value head dim as a constant (a build for dv == dk), so the state rows' addresses
// are immediate offsets from one base instead of a running pointer: in the one-group form every
// token stores DK rows per thread, each with its own 64-bit address arithmetic otherwise.
template <int DK, typename TS, int CH, bool kStateEarly = false, bool kSpreadTokens = false,
          bool kOneGroup = false, int kDv = 0>
__global__ void __launch_bounds__(kOneGroup ? 128 : 512, 1)
    GdnDecodeRunKernel(const GdnDecodeArgs a) {
  // NG: the groups of rows whose partial sums the arithmetic adds (GdnDecodeKernel's thread
  // groups); G: this block's thread groups; PG: the row groups each thread holds.
  constexpr int KPT = KPerThread<DK>(), NG = DK / KPT, G = kOneGroup ? 1 : NG, PG = NG / G;
  static_assert(!(kOneGroup && kSpreadTokens), "one group has nothing to spread over");
  __shared__ float qs[CH][DK], ks[CH][DK], vs[CH][128], scratch2[2 * CH][32],
      red[G > 1 ? 2 : 1][G][128], red_o[G > 1 ? CH : 1][G][128];
  // Launched early: nothing before this, or with kStateEarly (GdnDecodeArgs::state_early) only
  // the state's loads and the index arrays they need.
  if constexpr (!kStateEarly) {
    WaitForPrerequisiteGrids();
    AllowDependentLaunch();  // ssm_out's column kernel may start loading its weights
  }
  const GdnShape& d = a.shape;
  const int dvr = blockDim.x / G;  // dv rounded up to a warp
  const int h = blockIdx.x, i = blockIdx.y, tid = threadIdx.x;
  const int grp = tid / dvr, j = tid % dvr;
  const int C = d.channels(), Kw = d.k_heads * DK, dv = kDv > 0 ? kDv : d.v_dim, Hv = d.v_heads;
  const int kh = h % d.k_heads;
  const bool jv = j < dv;
  // The block's tokens: one (a wave), or a run's, in order.
  const int e0 = a.run_first ? a.run_first[i] : i;
  const int n_tok = a.run_first ? a.run_len[i] : 1;
  int in = a.in_slots ? a.in_slots[e0] : a.slots[e0];  // speculative: read `in`, write `slot`
  const int p0 = a.pos[e0];
  const TS* S_in =
      static_cast<const TS*>(a.state) + (static_cast<int64_t>(in) * Hv + h) * DK * dv + j;
  const int row0 = grp * PG * KPT;  // this thread's first state row

  // Issue the state loads first: they do not depend on the prologue.
  float st[PG * KPT];
  if (jv) {
#pragma unroll
    for (int k = 0; k < PG * KPT; ++k) st[k] = LoadState(S_in + (row0 + k) * dv);
  }
  if constexpr (kStateEarly) {
    WaitForPrerequisiteGrids();
    AllowDependentLaunch();
  }
  // The conv history (pre-conv values of positions p-3..p-1) of the channels this thread
  // convolves, from the input ring; later tokens of a run shift their own values in.
  const int cq = kh * DK + j, ck = Kw + kh * DK + j, cv = 2 * Kw + h * dv + j;
  // The lanes that keep q/k and v channels' histories: group 0's, or every group's (kSpreadTokens).
  const bool qk_thread = (kSpreadTokens || grp == 0) && j < DK,
             v_thread = (kSpreadTokens || grp == 0) && jv;
  // Whether this thread's group runs token c's prologue and epilogue (c: its place in a chunk).
  auto mine = [&](int c) { return kSpreadTokens ? c % G == grp : grp == 0; };
  float hq[kConvK - 1], hk[kConvK - 1], hv[kConvK - 1];
  {
    const float* ring_in = a.conv_ring + static_cast<int64_t>(in) * kConvK * C;
#pragma unroll
    for (int tap = 0; tap < kConvK - 1; ++tap) {
      const int r = Mod(p0 - (kConvK - 1) + tap, kConvK);
      hq[tap] = qk_thread ? ring_in[r * C + cq] : 0.f;
      hk[tap] = qk_thread ? ring_in[r * C + ck] : 0.f;
      hv[tap] = v_thread ? ring_in[r * C + cv] : 0.f;
    }
  }

  // The conv weights of this thread's channels: constants of the launch, loaded once.
  float wq[kConvK], wk[kConvK], wv[kConvK];
#pragma unroll
  for (int tap = 0; tap < kConvK; ++tap) {
    wq[tap] = qk_thread ? a.p.conv_w[static_cast<int64_t>(cq) * kConvK + tap] : 0.f;
    wk[tap] = qk_thread ? a.p.conv_w[static_cast<int64_t>(ck) * kConvK + tap] : 0.f;
    wv[tap] = v_thread ? a.p.conv_w[static_cast<int64_t>(cv) * kConvK + tap] : 0.f;
  }
  const float ssm_a = a.p.ssm_a[h], dt_bias = a.p.dt_bias[h];
  const float norm_w = (kSpreadTokens || grp == 0) && jv ? a.p.norm_w[j] : 0.f;
  int last_slot = 0;  // the slot of the previous chunk's last token

  for (int t0 = 0; t0 < n_tok; t0 += CH) {
    const int nc = min(CH, n_tok - t0);
    // ---- prologue: the chunk's tokens' conv, q/k sums and gates ----
    // Every global load of the chunk (and the epilogue's output gates) is issued before its
    // first global store (the ring's): the compiler cannot move a load of `mixed` past a store
    // to `conv_ring` it cannot prove apart, so loads and stores interleaved token by token gave
    // each token of a run its own dependent round trips. Under ncu a demo verify run of 4
    // tokens cost 17.5 us against 7.8 for one token; in the graph this form measured the same
    // bits, one-stream demo decode +1-6% (4 of 4 same-call pairs), verify steps and the 27B
    // within their spread (H200, 2026-12-04).
    float sums[2 * CH], qv[CH], kv[CH], beta[CH], decay[CH], mq[CH], mk[CH], mv[CH], br[CH], ar[CH],
        zs[CH];
    int rows[CH], slots[CH], poss[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      rows[c] = slots[c] = poss[c] = 0;
      if (c < nc) {
        const int e = e0 + t0 + c;
        rows[c] = a.rows[e];
        slots[c] = a.slots[e];
        poss[c] = a.pos[e];
      }
    }
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      mq[c] = mk[c] = mv[c] = br[c] = ar[c] = zs[c] = 0.f;
      if (c < nc) {
        const float* m = a.mixed + static_cast<int64_t>(rows[c]) * C;
        // The output gate of this thread's column, read now: the epilogue's stores come first.
        if (mine(c) && jv) zs[c] = a.z[static_cast<int64_t>(rows[c]) * Hv * dv + h * dv + j];
        if (qk_thread) {
          mq[c] = m[cq];
          mk[c] = m[ck];
        }
        if (v_thread) mv[c] = m[cv];
        br[c] = a.b[static_cast<int64_t>(rows[c]) * Hv + h];
        ar[c] = a.alpha[static_cast<int64_t>(rows[c]) * Hv + h];
      }
    }
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      qv[c] = kv[c] = beta[c] = decay[c] = 0.f;
      if (c < nc) {
        const int slot = slots[c], p = poss[c];
        if (t0 + c > 0) in = c > 0 ? slots[c - 1] : last_slot;  // the previous token's state
        if (c == nc - 1) last_slot = slot;
        float* ring = a.conv_ring + static_cast<int64_t>(slot) * kConvK * C;
        const int cur_row = Mod(p, kConvK);
        // Causal conv over the history (rows p-3..p-1) plus the current pre-conv value; the
        // owner block stores the current value into ring row p % K (and, when the output is
        // another state index, the K-1 rows it read, so that the output ring is complete).
        // The token's group (mine) convolves; with kSpreadTokens the others only shift it in.
        const bool own = !kSpreadTokens || mine(c);  // the default: group 0 alone gets here
        auto conv = [&](int ch, float cur, const float* w, float* hist, bool owner) {
          float acc = 0.f;
          if (own) {
            acc = w[kConvK - 1] * cur;
#pragma unroll
            for (int tap = 0; tap < kConvK - 1; ++tap) {
              const float prev = hist[tap];
              acc += w[tap] * prev;
              if (owner && in != slot) ring[Mod(p - (kConvK - 1) + tap, kConvK) * C + ch] = prev;
            }
            if (owner) ring[cur_row * C + ch] = cur;
          }
#pragma unroll
          for (int tap = 0; tap < kConvK - 2; ++tap) hist[tap] = hist[tap + 1];
          hist[kConvK - 2] = cur;
          return own ? Silu(acc) : 0.f;
        };
        if (qk_thread) {
          const bool owner = h < d.k_heads;  // one block per key head writes its q/k channels
          qv[c] = conv(cq, mq[c], wq, hq, owner);
          kv[c] = conv(ck, mk[c], wk, hk, owner);
        }
        if (v_thread) {
          const float v = conv(cv, mv[c], wv, hv, true);
          if (own) vs[c][j] = v;
        }
        beta[c] = Sigmoid(br[c]);
        const float g = ssm_a * Softplus(ar[c] + dt_bias);
        decay[c] = __expf(g);
      }
      sums[2 * c] = qv[c] * qv[c];
      sums[2 * c + 1] = kv[c] * kv[c];
    }
    BlockSums<2 * CH>(sums, scratch2);
    if (qk_thread) {
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        if (c >= nc) break;
        if (!mine(c)) continue;
        qs[c][j] = qv[c] * rsqrtf(sums[2 * c] + a.p.eps) * rsqrtf(static_cast<float>(DK));
        ks[c][j] = kv[c] * rsqrtf(sums[2 * c + 1] + a.p.eps);
      }
    }
    __syncthreads();

    // ---- the state update, token by token ----
    float o_own[kOneGroup ? CH : 1][PG];  // kOneGroup: each row group's o partial, by token
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      if (c >= nc) break;
      TS* S = static_cast<TS*>(a.state) + (static_cast<int64_t>(slots[c]) * Hv + h) * DK * dv + j;
      // red[c & 1]: the next token writes the other half, so one barrier per token suffices
      // (the one after it orders this token's reads before the token after next writes here).
      float ug[PG];
      if (jv) {
#pragma unroll
        for (int pg = 0; pg < PG; ++pg) {
          ug[pg] = 0.f;
#pragma unroll
          for (int k = pg * KPT; k < (pg + 1) * KPT; ++k) {
            st[k] *= decay[c];
            ug[pg] = fmaf(st[k], ks[c][row0 + k], ug[pg]);
          }
        }
        if constexpr (G > 1) red[c & 1][grp][j] = ug[0];
      }
      if constexpr (G > 1) __syncthreads();
      if (jv) {
        float u = 0.f;
        if constexpr (G > 1) {
#pragma unroll
          for (int g2 = 0; g2 < NG; ++g2) u += red[c & 1][g2][j];
        } else {
#pragma unroll
          for (int pg = 0; pg < PG; ++pg) u += ug[pg];
        }
        const float delta = beta[c] * (vs[c][j] - u);
#pragma unroll
        for (int pg = 0; pg < PG; ++pg) {
          float o = 0.f;
#pragma unroll
          for (int k = pg * KPT; k < (pg + 1) * KPT; ++k) {
            st[k] = fmaf(ks[c][row0 + k], delta, st[k]);
            o = fmaf(st[k], qs[c][row0 + k], o);
            StoreState(S + (row0 + k) * dv, st[k]);
            st[k] = AsStored<TS>(st[k]);  // a run's next token reads the stored state
          }
          if constexpr (G > 1)
            red_o[c][grp][j] = o;
          else
            o_own[c][pg] = o;
        }
      }
    }
    __syncthreads();

    // ---- epilogue: the chunk's outputs ----
    float o[CH], oss[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      o[c] = 0.f;
      if (c < nc && mine(c) && jv) {
        if constexpr (G > 1) {
#pragma unroll
          for (int g2 = 0; g2 < NG; ++g2) o[c] += red_o[c][g2][j];
        } else {
#pragma unroll
          for (int pg = 0; pg < PG; ++pg) o[c] += o_own[c][pg];
        }
      }
      oss[c] = o[c] * o[c];
    }
    BlockSums<CH>(oss, scratch2);
    if (jv) {
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        if (c >= nc) break;
        if (!mine(c)) continue;
        const int64_t oi = static_cast<int64_t>(rows[c]) * Hv * dv + h * dv + j;
        const float y = o[c] * rsqrtf(oss[c] / dv + a.p.eps) * norm_w * Silu(zs[c]);
        a.out[oi] = y;
        if (a.xq) {  // dv % 32 == 0: warp j / 32 of the group holds one whole 32-element block
          const int blk = (rows[c] * Hv + h) * (dv >> 5) + (j >> 5);
          QuantizeBlock32(y, j & 31, a.xq + 32 * blk, a.xd + blk,
                          a.xsum ? a.xsum + 2 * blk : nullptr);
        }
      }
    }
  }
}

__global__ void BulkCopyProbeKernel(int* out) { *out = DS_BULK_COPY; }

// Lets Kernel take up to `bytes` of dynamic shared memory (above the 48 KiB default), once per
// device (callers pass the kernel's largest need, whatever this launch's shape). Called before
// every launch, so after the first one per device it is a device query and an atomic load.
template <auto Kernel>
void AllowSharedBytes(size_t bytes) {
  static std::atomic<uint64_t> done_on{0};  // bit d: device d done (devices 0..63)
  int dev = 0;
  if (bytes <= 48 * 1024 || cudaGetDevice(&dev) != cudaSuccess) return;
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit & done_on.load(std::memory_order_acquire)) return;
  // Setting it twice from two threads is harmless; a device past 63 sets it at every launch.
  if (cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) == cudaSuccess)
    done_on.fetch_or(bit, std::memory_order_release);
}

// Launches of at least this many decode blocks (heads x sequences) take the batched forms of
// GdnDecodeKernel (two per SM, or three with bulk_state): about two blocks for every SM of a
// large GPU.
constexpr unsigned kGdnTwoPerSmBlocks = 256;

}  // namespace

bool GdnBulkStateAvailable() {
  static const bool available = ProbeWritesOne(BulkCopyProbeKernel, 90, 1000);
  return available;
}

absl::Status GdnDecode(const GdnDecodeArgs& a, cudaStream_t stream) {
  DS_RETURN_IF_ERROR(GdnShapeSupported(a.shape));
  if (a.n_seqs == 0) return absl::OkStatus();
  if (a.bulk_state && !GdnBulkStateAvailable())
    return absl::FailedPreconditionError(
        "GdnDecode: bulk_state needs sm_90 code on an sm_90+ device (GdnBulkStateAvailable)");
  if (a.xq && (a.xd == nullptr || a.shape.v_dim % 32 != 0))
    return absl::InvalidArgumentError(absl::StrCat(
        "GdnDecode: the fused int8 output needs xd and a value head dim that is a multiple of 32 (",
        a.shape.v_dim, ")"));
  if (a.xsum && (a.n_seqs != 1 || a.run_first))
    return absl::InvalidArgumentError("GdnDecode: 16-element sums are for one-row steps");
  DispatchDk(a.shape.k_dim, [&](auto tag) {
    constexpr int DK = decltype(tag)::value;
    constexpr int NG = DK / KPerThread<DK>();
    const dim3 grid(a.shape.v_heads, a.n_seqs);
    const int threads = NG * WarpRound(a.shape.v_dim);
    DispatchState(a.state_bf16, [&](auto st) {
      using TS = decltype(st);
      // The kernels whose state loads may come before the wait (state_early) are builds of
      // their own: the flag as a runtime branch cost the default builds registers (the bulk
      // form 28 -> 40 bytes spilled).
      auto launch = [&](auto early_tag) {
        constexpr bool kEarly = decltype(early_tag)::value;
        if (grid.x * grid.y >= kGdnTwoPerSmBlocks && a.bulk_state) {
          const size_t bytes = static_cast<size_t>(DK) * a.shape.v_dim * sizeof(TS);
          constexpr auto kernel = GdnDecodeKernel<DK, 3, TS, true, kEarly>;
          AllowSharedBytes<kernel>(static_cast<size_t>(DK) * 128 * sizeof(TS));  // dv <= 128
          LaunchMaybeEarly(kernel, grid, threads, bytes, stream, a.early, a);
        } else if (grid.x * grid.y >= kGdnTwoPerSmBlocks)
          LaunchMaybeEarly(GdnDecodeKernel<DK, 2, TS, false, kEarly>, grid, threads, 0, stream,
                           a.early, a);
        else if (DK == 64 && a.one_group_runs && a.shape.v_dim == DK)  // see kDv
          LaunchMaybeEarly(
              GdnDecodeRunKernel<DK, TS, 4, kEarly, false, DK == 64, (DK == 64 ? DK : 0)>, grid,
              WarpRound(a.shape.v_dim), 0, stream, a.early, a);
        else if (DK == 64 && a.one_group_runs)  // dk 128 would hold 128 state rows a thread
          LaunchMaybeEarly(GdnDecodeRunKernel<DK, TS, 4, kEarly, false, DK == 64>, grid,
                           WarpRound(a.shape.v_dim), 0, stream, a.early, a);
        else if (NG > 1 && a.spread_run_tokens && a.run_first)  // one group: nothing to spread
          LaunchMaybeEarly(GdnDecodeRunKernel<DK, TS, 4, kEarly, (NG > 1)>, grid, threads, 0,
                           stream, a.early, a);
        else
          LaunchMaybeEarly(GdnDecodeRunKernel<DK, TS, 4, kEarly>, grid, threads, 0, stream, a.early,
                           a);
      };
      if (a.state_early)
        launch(std::true_type{});
      else
        launch(std::false_type{});
    });
  });
  return LastLaunchStatus("GdnDecode");
}

}  // namespace ds::cuda
