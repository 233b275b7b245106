// Token selection on the device (see sampling.cuh and "Sampling v2" in README.md).
//
// SampleRows: one block of 1024 threads per row; the row is streamed from L2/HBM a few times
// ("passes"), never copied. Every pass walks the row in chunks of 256 tokens (a warp owns a chunk:
// 8 coalesced 32-token loads in flight per lane, ascending token order inside the chunk), so
// per-chunk sums / counts can be scanned in token order afterwards. Penalties are applied on the
// fly: the row's (token, count) pairs are sorted by token and each warp walks them alongside its
// chunk, so the logits stay read-only (rows may share one logits row: ld = 0).
//
// Paths (block-uniform decisions):
//   greedy / all -inf      pass 1 (max + lowest-id argmax)                               1 pass
//   fast: top-k <= 1024,   pass 1 also keeps each thread's top-2 logits (a 2048-key pool); the
//   or top-p without top-k pool's k-th key (top-k) or 1024th key (top-p) is a threshold t with at
//                          least k tokens >= t. Pass 2 collects S = {v >= t} (<= 4096 tokens)
//                          into shared memory (top-p: also the full-vocabulary weight sum and the
//                          largest weight outside S). Then bitonic sorts in shared memory: top-k
//                          cut, weights, top-p cut, min-p, ascending id, scan, draw.     2 passes
//                          Top-p alone is exact only if the nucleus lies inside S with every
//                          outside weight strictly below its last weight; otherwise (flat
//                          distributions) -> general.
//   general                top-k threshold by 3 radix passes over the order-preserving logit
//                          key (count histograms), top-p threshold by 3 radix passes over the
//                          weight bits (mass histograms), an id-cut pass where ties straddle a
//                          threshold, then one pass of per-chunk weight sums, the chunk holding
//                          u * total, and one warp scanning that chunk.          1 to 9 passes
//
// Arithmetic that decides membership (penalties, (v - m) * inv_t, Exp) repeats the CPU sampler's
// operations with explicit round-to-nearest intrinsics (no FMA contraction), so weights are
// bit-identical to common/sampling/kernels.cc; only sums differ (order), by ~1e-16 relative.
#include <algorithm>
#include <cfloat>
#include <climits>

#include "common/sampling/exp_constants.h"
#include "kernels/cuda/argmax_reduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.cuh"

namespace ds::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// SampleRows
// ---------------------------------------------------------------------------------------------

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 8;                // 32-token loads in flight per lane
constexpr int kChunkBase = 32 * kUnroll;  // tokens per chunk (a multiple of this for huge rows)
constexpr int kMaxChunks = 1024;
constexpr int kCap = 4096;           // fast-path candidates in shared memory
constexpr int kPool = 2 * kThreads;  // per-thread top-2 logit keys
constexpr int kFastMaxK = 1024;      // top-k above this takes the general path
constexpr int kPoolPickTopP = 1024;  // top-p alone: S = tokens >= the pool's 1024th key
constexpr int kBins = 2048;          // radix histogram bins (11-bit digits)

// The CPU sampler's exp constants (Cephes expf).
using namespace sampling::exp_constants;  // NOLINT

// internal::Exp of the CPU sampler, operation for operation (explicit roundings: no contraction).
__device__ __forceinline__ float SamplerExp(float s) {
  if (!(s >= kExpLo)) return 0.0f;
  const float x = fminf(s, kExpHi);
  const float n = rintf(__fmul_rn(x, kLog2e));
  float r = __fmaf_rn(-n, kLn2Hi, x);
  r = __fmaf_rn(-n, kLn2Lo, r);
  float p = kP0;
  p = __fmaf_rn(p, r, kP1);
  p = __fmaf_rn(p, r, kP2);
  p = __fmaf_rn(p, r, kP3);
  p = __fmaf_rn(p, r, kP4);
  p = __fmaf_rn(p, r, kP5);
  const float z = __fmul_rn(r, r);
  float y = __fmaf_rn(p, z, r);
  y = __fadd_rn(y, 1.0f);
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return __fmul_rn(y, __uint_as_float(bits));
}

// NaN -> -inf, +inf -> FLT_MAX (the CPU sampler's Load).
__device__ __forceinline__ float Sanitize(float v) {
  return isnan(v) ? -INFINITY : fminf(v, FLT_MAX);
}

// Order-preserving key of a non-NaN float; -0 and +0 share one key (they compare equal).
__device__ __forceinline__ uint32_t OrdKey(float v) {
  const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float KeyToFloat(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct RowCtx {
  const float* x;  // [n]
  int n, ch, n_chunks;
  const PenaltyPair* pen;  // [pen_n] sorted by token
  int pen_n;
  float rp, fp, pp;
};

__device__ __forceinline__ float Penalize(float l, int count, const RowCtx& r) {
  if (r.rp != 1.0f) l = l > 0.0f ? __fdiv_rn(l, r.rp) : __fmul_rn(l, r.rp);
  return __fsub_rn(l, __fadd_rn(__fmul_rn(static_cast<float>(count), r.fp), r.pp));
}

// First pair index with token >= t (warp-uniform).
__device__ __forceinline__ int PenLowerBound(const RowCtx& r, int t) {
  int lo = 0, hi = r.pen_n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (r.pen[mid].token < t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Calls f(i, v, valid) for every token slot of chunk c, ascending, with v the sanitized penalized
// logit. Called by a whole warp; every lane calls f the same number of times (ballots are safe).
template <class F>
__device__ __forceinline__ void WarpChunk(const RowCtx& r, int c, F&& f) {
  const int lane = threadIdx.x & 31;
  const int c0 = c * r.ch;
  const int c1 = min(r.n, c0 + r.ch);
  int p = r.pen_n > 0 ? PenLowerBound(r, c0) : 0;
  for (int base = c0; base < c1; base += kChunkBase) {
    float raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * 32 + lane;
      raw[u] = i < c1 ? __ldg(r.x + i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i0 = base + u * 32;
      const int i = i0 + lane;
      float v = Sanitize(raw[u]);
      while (p < r.pen_n) {
        const PenaltyPair q = r.pen[p];
        if (q.token >= i0 + 32) break;
        if (q.token == i) v = Penalize(v, q.count, r);
        ++p;
      }
      f(i, v, i < c1);
    }
  }
}

// Every warp walks its chunks (c = warp, warp + 32, ...).
template <class F>
__device__ __forceinline__ void BlockPass(const RowCtx& r, F&& f) {
  for (int c = threadIdx.x >> 5; c < r.n_chunks; c += kWarps) WarpChunk(r, c, f);
}

struct Smem {
  union {
    uint64_t cand[kCap];   // fast path: composite sort keys
    uint32_t pool[kPool];  // fast path, before cand is filled
    struct {
      double mass[kBins];
      int cnt[kBins];
    } hist;  // general path
  } u;
  double chunk_sum[kMaxChunks];
  int chunk_cnt[kMaxChunks];
  double red_d[kWarps];
  float red_f[kWarps];
  int red_i[kWarps];
  int count;
  int bcast_i[4];
  double bcast_d[2];
};

// ---- block reductions: common.cuh's BlockSum / BlockMax over the Smem scratch arrays; the
// argmax below (all threads get the result; two __syncthreads) ----
__device__ void BlockArgmax(float& bv, int& bi, Smem& s) {
  WarpBest(bv, bi);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) {
    s.red_f[warp] = bv;
    s.red_i[warp] = bi;
  }
  __syncthreads();
  bv = s.red_f[lane];
  bi = s.red_i[lane];
  WarpBest(bv, bi);
}

// Bitonic sort of a[0, len) in shared memory, len a power of two <= 2 * kThreads * 2.
template <typename T, bool kDescending>
__device__ void BitonicSort(T* a, int len) {
  for (int k = 2; k <= len; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int t = threadIdx.x; t < (len >> 1); t += kThreads) {
        const int i = 2 * t - (t & (j - 1));  // bit j of i is 0
        const int l = i + j;
        const T x = a[i], y = a[l];
        const bool up = ((i & k) == 0) != kDescending;  // this pair sorts ascending
        if ((x > y) == up && x != y) {
          a[i] = y;
          a[l] = x;
        }
      }
      __syncthreads();
    }
  }
}

__device__ __forceinline__ int Pow2AtLeast(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// Weight of a fast-path key (w bits in the high word) and its token id (low word 0xFFFFFFFF - id).
__device__ __forceinline__ float KeyW(uint64_t k) {
  return __uint_as_float(static_cast<uint32_t>(k >> 32));
}
__device__ __forceinline__ int KeyIdDesc(uint64_t k) {
  return static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(k));
}

// Smallest e in [0, cnt) whose inclusive prefix sum of val(e) is >= target (kStrict: > target);
// -1 if none. cnt <= 4 * kThreads. Block-uniform result.
template <bool kStrict, class V>
__device__ int BlockScanFirst(int cnt, V&& val, double target, Smem& s) {
  const int per = (cnt + kThreads - 1) / kThreads;
  const int e0 = min(cnt, static_cast<int>(threadIdx.x) * per), e1 = min(cnt, e0 + per);
  double local = 0.0;
  for (int e = e0; e < e1; ++e) local += val(e);
  // Exclusive block scan of `local`.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double inc = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += y;
  }
  __syncthreads();
  if (lane == 31) s.red_d[warp] = inc;
  if (threadIdx.x == 0) s.count = INT_MAX;
  __syncthreads();
  double wbase = 0.0;
  for (int w = 0; w < warp; ++w) wbase += s.red_d[w];
  double cum = wbase + inc - local;
  for (int e = e0; e < e1; ++e) {
    cum += val(e);
    if (kStrict ? (target < cum) : (cum >= target)) {
      atomicMin(&s.count, e);
      break;
    }
  }
  __syncthreads();
  const int r = s.count;
  __syncthreads();
  return r == INT_MAX ? -1 : r;
}

// Warp 0 only: over bins h[0, nb) (nb a multiple of 32), the highest bin d such that the sum of
// h over bins >= d reaches `need`; returns d and the sum over bins > d in *above. If the total
// falls short (rounding of mass sums), the total is taken as the need.
template <typename T>
__device__ int WarpSelectDigit(const T* h, int nb, T need, T* above) {
  const int lane = threadIdx.x & 31;
  const int per = nb / 32;
  T mine = 0;
  for (int j = 0; j < per; ++j) mine += h[lane * per + j];
  // suffix[l] = sum over lanes >= l
  T suf = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_down_sync(kFull, suf, o);
    if (lane + o < 32) suf += y;
  }
  const T total = __shfl_sync(kFull, suf, 0);
  if (total < need) need = total;
  const unsigned ok = __ballot_sync(kFull, suf >= need);  // lanes 0..l* (suffix is non-increasing)
  const int ls = ok == 0 ? 0 : 31 - __clz(ok);
  const T suf_next = __shfl_sync(kFull, suf, (ls + 1) & 31);
  T acc = ls == 31 ? T(0) : suf_next;
  int d = ls * per;
  for (int j = per - 1; j >= 0; --j) {
    const int b = ls * per + j;
    if (acc + h[b] >= need || j == 0) {
      d = b;
      break;
    }
    acc += h[b];
  }
  *above = acc;
  return d;  // meaningful in every lane (all lanes compute the same)
}

// Warp 0 only: the first chunk c in [0, nc) whose inclusive prefix sum of sums[] reaches target
// (kStrict: target < prefix; else prefix >= target), with its exclusive prefix in *base; -1 if
// none. Lane l owns chunks [l * per, (l + 1) * per) (ascending), so one shuffle scan suffices.
template <typename T, bool kStrict>
__device__ int WarpFindChunk(const T* sums, int nc, T target, T* base) {
  const int lane = threadIdx.x & 31;
  const int per = (nc + 31) / 32;
  const int c0 = min(nc, lane * per), c1 = min(nc, c0 + per);
  T mine = 0;
  for (int c = c0; c < c1; ++c) mine += sums[c];
  T inc = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += y;
  }
  T cum = inc - mine;
  int hit = -1;
  T hit_base = 0;
  for (int c = c0; c < c1; ++c) {
    const T next = cum + sums[c];
    if (kStrict ? (target < next) : (next >= target)) {
      hit = c;
      hit_base = cum;
      break;
    }
    cum = next;
  }
  const unsigned hb = __ballot_sync(kFull, hit >= 0);
  if (hb == 0) return -1;
  const int src = __ffs(hb) - 1;
  *base = __shfl_sync(kFull, hit_base, src);
  return __shfl_sync(kFull, hit, src);
}

// The `need`-th (1-based) lowest token id among tokens with pred(i, v); block-uniform.
template <class P>
__device__ int IdCut(const RowCtx& r, int need, P&& pred, Smem& s) {
  const int lane = threadIdx.x & 31;
  for (int c = threadIdx.x >> 5; c < r.n_chunks; c += kWarps) {
    int cnt = 0;
    WarpChunk(r, c, [&](int i, float v, bool valid) {
      cnt += __popc(__ballot_sync(kFull, valid && pred(i, v)));
    });
    if (lane == 0) s.chunk_cnt[c] = cnt;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    int acc = 0;
    const int c = WarpFindChunk<int, false>(s.chunk_cnt, r.n_chunks, need, &acc);
    int rem = need - acc, found = INT_MAX;
    if (c >= 0) {
      WarpChunk(r, c, [&](int i, float v, bool valid) {
        unsigned b = __ballot_sync(kFull, valid && pred(i, v));
        const int pc = __popc(b);
        if (found == INT_MAX && rem <= pc) {
          for (int j = 1; j < rem; ++j) b &= b - 1;
          found = (i - lane) + (__ffs(b) - 1);
        }
        if (found == INT_MAX) rem -= pc;
      });
    }
    if (lane == 0) s.bcast_i[0] = found;
  }
  __syncthreads();
  const int id = s.bcast_i[0];
  __syncthreads();
  return id;
}

struct Filters {
  bool topk = false, topp = false;
  float m = 0.0f, inv_t = 1.0f;
  uint32_t kge = 0;  // top-k keeps key > kge || (key == kge && i <= kcut)
  int kcut = INT_MAX;
  float wstar = 0.0f;  // top-p keeps w > wstar || (w == wstar && i <= pcut)
  int pcut = INT_MAX;
  float min_p = 0.0f;
};

__device__ __forceinline__ float RawWeight(const Filters& f, int i, float v) {
  if (f.topk) {
    const uint32_t key = OrdKey(v);
    if (!(key > f.kge || (key == f.kge && i <= f.kcut))) return 0.0f;
  }
  return SamplerExp(__fmul_rn(__fsub_rn(v, f.m), f.inv_t));
}
__device__ __forceinline__ float FinalWeight(const Filters& f, int i, float v) {
  float w = RawWeight(f, i, v);
  if (f.topp && !(w > f.wstar || (w == f.wstar && i <= f.pcut))) w = 0.0f;
  return w < f.min_p ? 0.0f : w;
}

// General path: exact for every parameter combination. Returns the token (block-uniform).
__device__ __noinline__ int GeneralPath(const RowCtx& r, const SampleRowParams& P, float m,
                                        Smem& s) {
  Filters f;
  f.m = m;
  f.inv_t = P.inv_temp;
  f.topk = P.top_k > 0 && P.top_k < r.n;
  f.topp = P.top_p < 1.0f;
  f.min_p = P.min_p;
  const int lane = threadIdx.x & 31;

  if (f.topk) {
    // Radix select of the top_k-th key (descending, ties to the lowest id) over 11/11/10 bits.
    uint32_t prefix = 0, mask = 0;
    int need = P.top_k;
    bool done = false;
    for (int lv = 0; lv < 3 && !done; ++lv) {
      const int sh = lv == 0 ? 21 : (lv == 1 ? 10 : 0), nb = lv < 2 ? 2048 : 1024;
      for (int b = threadIdx.x; b < kBins; b += kThreads) s.u.hist.cnt[b] = 0;
      __syncthreads();
      BlockPass(r, [&](int i, float v, bool valid) {
        const uint32_t key = OrdKey(v);
        if (valid && (key & mask) == prefix) atomicAdd(&s.u.hist.cnt[(key >> sh) & (nb - 1)], 1);
      });
      __syncthreads();
      if (threadIdx.x < 32) {
        int above = 0;
        const int d = WarpSelectDigit<int>(s.u.hist.cnt, nb, need, &above);
        if (lane == 0) {
          s.bcast_i[0] = d;
          s.bcast_i[1] = above;
          s.bcast_i[2] = s.u.hist.cnt[d];
        }
      }
      __syncthreads();
      const int d = s.bcast_i[0], above = s.bcast_i[1], eq = s.bcast_i[2];
      __syncthreads();
      need -= above;
      prefix |= static_cast<uint32_t>(d) << sh;
      mask |= static_cast<uint32_t>(nb - 1) << sh;
      // Every token of the selected bin is kept: keep key >= prefix, no tie cut.
      if (need == eq) done = true;
    }
    f.kge = prefix;
    if (!done) {
      const uint32_t kk = prefix;
      f.kcut = IdCut(
          r, need, [&](int, float v) { return OrdKey(v) == kk; }, s);
    }
  }

  if (f.topp) {
    // Radix select of the nucleus boundary weight over the weight bits (bit 31 is 0):
    // 11/11/9 bits, mass histograms in double.
    uint32_t prefix = 0, mask = 0;
    double above_all = 0.0, target = 0.0;
    int eq = 0;
    for (int lv = 0; lv < 3; ++lv) {
      const int sh = lv == 0 ? 20 : (lv == 1 ? 9 : 0), nb = lv < 2 ? 2048 : 512;
      for (int b = threadIdx.x; b < kBins; b += kThreads) {
        s.u.hist.cnt[b] = 0;
        s.u.hist.mass[b] = 0.0;
      }
      __syncthreads();
      BlockPass(r, [&](int i, float v, bool valid) {
        if (!valid) return;
        const float w = RawWeight(f, i, v);
        const uint32_t wb = __float_as_uint(w);
        if (w > 0.0f && (wb & mask) == prefix) {
          const int b = (wb >> sh) & (nb - 1);
          atomicAdd(&s.u.hist.mass[b], static_cast<double>(w));
          atomicAdd(&s.u.hist.cnt[b], 1);
        }
      });
      __syncthreads();
      if (threadIdx.x < 32) {
        if (lv == 0) {
          double t = 0.0;
          for (int b = lane; b < nb; b += 32) t += s.u.hist.mass[b];
          t = WarpSum(t);
          target = static_cast<double>(P.top_p) * t;
        }
        double above = 0.0;
        const int d = WarpSelectDigit<double>(s.u.hist.mass, nb, target - above_all, &above);
        if (lane == 0) {
          s.bcast_i[0] = d;
          s.bcast_i[1] = s.u.hist.cnt[d];
          s.bcast_d[0] = above;
          s.bcast_d[1] = target;
        }
      }
      __syncthreads();
      const int d = s.bcast_i[0];
      eq = s.bcast_i[1];
      above_all += s.bcast_d[0];
      target = s.bcast_d[1];
      __syncthreads();
      prefix |= static_cast<uint32_t>(d) << sh;
      mask |= static_cast<uint32_t>(nb - 1) << sh;
    }
    f.wstar = __uint_as_float(prefix);
    // Tokens of weight wstar needed (in id order) for the cumulative mass to reach the target.
    const double rem = target - above_all;
    double cd = ceil(rem / static_cast<double>(f.wstar));
    int c = cd < 1.0 ? 1 : (cd > eq ? eq : static_cast<int>(cd));
    if (c < eq) {
      const float ws = f.wstar;
      f.pcut = IdCut(
          r, c, [&](int i, float v) { return RawWeight(f, i, v) == ws; }, s);
    }
  }

  // Draw: per-chunk sums of the final weights in double, then the chunk and the token.
  for (int c = threadIdx.x >> 5; c < r.n_chunks; c += kWarps) {
    double acc = 0.0;
    WarpChunk(r, c, [&](int i, float v, bool valid) {
      if (valid) acc += static_cast<double>(FinalWeight(f, i, v));
    });
    acc = WarpSum(acc);
    if (lane == 0) s.chunk_sum[c] = acc;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    double total = 0.0;
    for (int c = lane; c < r.n_chunks; c += 32) total += s.chunk_sum[c];
    total = WarpSum(total);
    const double target = P.uniform * total;
    double base = 0.0;
    int chunk = WarpFindChunk<double, true>(s.chunk_sum, r.n_chunks, target, &base);
    const bool forced_last = chunk < 0;
    if (forced_last) {
      // u * total rounded up to the total: the last positive weight (the CPU sampler's rule).
      int lp = -1;
      for (int c = lane; c < r.n_chunks; c += 32)
        if (s.chunk_sum[c] > 0.0) lp = c;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) lp = max(lp, __shfl_xor_sync(kFull, lp, o));
      chunk = max(lp, 0);
    }
    double run = base;
    int tok = -1, last_tok = -1;
    WarpChunk(r, chunk, [&](int i, float v, bool valid) {
      const float w = valid ? FinalWeight(f, i, v) : 0.0f;
      double x = static_cast<double>(w);
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(kFull, x, o);
        if (lane >= o) x += y;
      }
      const unsigned pos = __ballot_sync(kFull, w > 0.0f);
      if (pos != 0) last_tok = (i - lane) + 31 - __clz(pos);
      if (tok < 0 && !forced_last) {
        const unsigned crossed = __ballot_sync(kFull, target < run + x);
        if (crossed != 0) tok = (i - lane) + __ffs(crossed) - 1;
      }
      run += __shfl_sync(kFull, x, 31);
    });
    if (tok < 0) tok = last_tok >= 0 ? last_tok : 0;
    if (lane == 0) s.bcast_i[0] = tok;
  }
  __syncthreads();
  const int tok = s.bcast_i[0];
  __syncthreads();
  return tok;
}

// Fast path (see the top of the file); returns -1 when its assumptions fail (-> general path).
// t1/t2: this thread's two largest logit keys from pass 1.
__device__ __noinline__ int FastPath(const RowCtx& r, const SampleRowParams& P, float m,
                                     uint32_t t1, uint32_t t2, Smem& s) {
  const bool topk = P.top_k > 0 && P.top_k < r.n;
  const bool topp = P.top_p < 1.0f;
  const int lane = threadIdx.x & 31;
  s.u.pool[2 * threadIdx.x] = t1;
  s.u.pool[2 * threadIdx.x + 1] = t2;
  __syncthreads();
  BitonicSort<uint32_t, true>(s.u.pool, kPool);
  const uint32_t tkey = s.u.pool[(topk ? P.top_k : kPoolPickTopP) - 1];
  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();  // pool is dead from here (cand overlays it)

  // Pass 2: collect S = {key >= tkey}; top-p alone also needs the weight sum of the whole
  // vocabulary and the largest weight outside S.
  double tot = 0.0;
  float wout = -1.0f;
  BlockPass(r, [&](int i, float v, bool valid) {
    const uint32_t key = OrdKey(v);
    const bool take = valid && key >= tkey;
    const unsigned b = __ballot_sync(kFull, take);
    if (b != 0) {
      int base = 0;
      if (lane == 0) base = atomicAdd(&s.count, __popc(b));
      base = __shfl_sync(kFull, base, 0);
      const int slot = base + __popc(b & ((1u << lane) - 1u));
      if (take && slot < kCap)
        s.u.cand[slot] =
            (static_cast<uint64_t>(key) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
    }
    if (!topk && valid) {
      const float w = SamplerExp(__fmul_rn(__fsub_rn(v, m), P.inv_temp));
      tot += static_cast<double>(w);
      if (!take) wout = fmaxf(wout, w);
    }
  });
  __syncthreads();
  const int cnt = s.count;
  if (!topk) {
    tot = BlockSum(tot, s.red_d);
    wout = BlockMax(wout, s.red_f);
  }
  __syncthreads();
  // Overflow; top-k: fewer than k collected cannot happen (the pool's k-th key has >= k tokens at
  // or above it) but would be unrecoverable here.
  if (cnt > kCap || (topk && cnt < P.top_k)) return -1;

  int L = cnt;
  if (topk) {
    const int len = Pow2AtLeast(cnt);
    for (int e = cnt + threadIdx.x; e < len; e += kThreads) s.u.cand[e] = 0;
    __syncthreads();
    BitonicSort<uint64_t, true>(s.u.cand, len);  // logit desc, id asc
    L = P.top_k;
  }
  // Weights: the key becomes (w bits, 0xFFFFFFFF - id).
  double part = 0.0;
  for (int e = threadIdx.x; e < L; e += kThreads) {
    const uint64_t k = s.u.cand[e];
    const float v = KeyToFloat(static_cast<uint32_t>(k >> 32));
    const float w = SamplerExp(__fmul_rn(__fsub_rn(v, m), P.inv_temp));
    part += static_cast<double>(w);
    s.u.cand[e] = (static_cast<uint64_t>(__float_as_uint(w)) << 32) | (k & 0xFFFFFFFFull);
  }
  __syncthreads();
  const double total = topk ? BlockSum(part, s.red_d) : tot;

  int Lp = L;
  if (topp) {
    const int len = Pow2AtLeast(L);
    for (int e = L + threadIdx.x; e < len; e += kThreads) s.u.cand[e] = 0;
    __syncthreads();
    BitonicSort<uint64_t, true>(s.u.cand, len);  // weight desc, id asc
    const double target = static_cast<double>(P.top_p) * total;
    const uint64_t* cand = s.u.cand;
    const int e = BlockScanFirst<false>(
        L, [&](int j) { return static_cast<double>(KeyW(cand[j])); }, target, s);
    if (e < 0) {
      if (!topk) return -1;  // S holds less mass than the nucleus
    } else {
      Lp = e + 1;
    }
    // Every token outside S must rank after the nucleus' last token.
    if (!topk && !(KeyW(s.u.cand[Lp - 1]) > wout)) return -1;
  }

  // min-p and zero weights, then ascending id: key (id, w bits); dropped -> all ones.
  const int len = Pow2AtLeast(Lp);
  int keep = 0;
  for (int e = threadIdx.x; e < len; e += kThreads) {
    uint64_t out = ~0ull;
    if (e < Lp) {
      const uint64_t k = s.u.cand[e];
      const float w = KeyW(k);
      if (w > 0.0f && !(w < P.min_p)) {
        out =
            (static_cast<uint64_t>(KeyIdDesc(k)) << 32) | static_cast<uint64_t>(__float_as_uint(w));
        ++keep;
      }
    }
    s.u.cand[e] = out;
  }
  __syncthreads();
  keep = BlockSum(keep, s.red_i);
  BitonicSort<uint64_t, false>(s.u.cand, len);
  const uint64_t* cand = s.u.cand;
  auto wv = [&](int j) {
    return static_cast<double>(__uint_as_float(static_cast<uint32_t>(cand[j])));
  };
  double fpart = 0.0;
  for (int e = threadIdx.x; e < keep; e += kThreads) fpart += wv(e);
  const double ftotal = BlockSum(fpart, s.red_d);
  int e = BlockScanFirst<true>(keep, wv, P.uniform * ftotal, s);
  if (e < 0) e = keep - 1;  // u * total rounded up to total: the last candidate
  return e < 0 ? 0 : static_cast<int>(s.u.cand[e] >> 32);
}

__global__ void __launch_bounds__(kThreads, 1)
    SampleKernel(const float* __restrict__ logits, int64_t ld, int n, int ch, int n_chunks,
                 const SampleRowParams* __restrict__ params, const PenaltyPair* __restrict__ pairs,
                 int32_t* __restrict__ out, int flags) {
  __shared__ Smem s;
  const SampleRowParams P = params[blockIdx.x];
  if (P.mode == kSampleSkip) {
    if (threadIdx.x == 0) out[blockIdx.x] = -1;
    return;
  }
  RowCtx r;
  r.x = logits + static_cast<int64_t>(blockIdx.x) * ld;
  r.n = n;
  r.ch = ch;
  r.n_chunks = n_chunks;
  r.pen = pairs + P.pen_begin;
  r.pen_n = P.pen_count;
  r.rp = P.repetition_penalty;
  r.fp = P.frequency_penalty;
  r.pp = P.presence_penalty;

  const bool greedy = P.mode == kSampleGreedy;
  const bool topk = P.top_k > 0 && P.top_k < n;
  const bool fast = !greedy && (flags & kSampleForceGeneral) == 0 &&
                    (topk ? P.top_k <= kFastMaxK : P.top_p < 1.0f);
  // Pass 1: max with the lowest index, and (fast path) this thread's two largest keys.
  float bv = -INFINITY;
  int bi = INT_MAX;
  uint32_t t1 = 0, t2 = 0;  // 0 is below every key (OrdKey(-inf) = 0x007FFFFF)
  BlockPass(r, [&](int i, float v, bool valid) {
    if (!valid) return;
    Better(bv, bi, v, i);
    if (fast) {
      const uint32_t k = OrdKey(v);
      if (k > t2) {
        if (k > t1) {
          t2 = t1;
          t1 = k;
        } else {
          t2 = k;
        }
      }
    }
  });
  BlockArgmax(bv, bi, s);
  int tok;
  if (greedy || !(bv > -INFINITY)) {
    tok = bi == INT_MAX ? 0 : bi;  // all -inf: the CPU sampler's token 0 (first -inf)
  } else {
    tok = fast ? FastPath(r, P, bv, t1, t2, s) : -1;
    if (tok < 0) tok = GeneralPath(r, P, bv, s);
  }
  if (threadIdx.x == 0) out[blockIdx.x] = tok;
}

}  // namespace

#if __cplusplus >= 202002L  // std::span (host code; the C++17 sm_70 check leaves it out)
void PackSampleRow(const sampling::SamplingParams& p, std::span<const int32_t> history, int n_vocab,
                   double uniform, bool skip, std::vector<SampleRowParams>* rows,
                   std::vector<PenaltyPair>* pairs) {
  SampleRowParams r;
  r.pen_begin = static_cast<int32_t>(pairs->size());
  if (skip) {
    rows->push_back(r);
    return;
  }
  // The CPU sampler's decisions (sampler.cc Filter / FinishExplicit / ApplyPenalties).
  const bool draw = p.temperature > 0.0f;
  r.mode = draw ? kSampleDraw : kSampleGreedy;
  r.inv_temp = draw ? std::min(1.0f / p.temperature, FLT_MAX) : 1.0f;
  r.top_k = p.top_k > 0 && p.top_k < n_vocab ? p.top_k : 0;
  r.top_p = p.top_p < 1.0f ? std::max(p.top_p, 0.0f) : 1.0f;
  r.min_p = std::clamp(p.min_p, 0.0f, 1.0f);
  const bool rep = p.repetition_penalty != 1.0f && p.repetition_penalty > 0.0f;
  const bool add = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  r.repetition_penalty = rep ? p.repetition_penalty : 1.0f;
  r.presence_penalty = p.presence_penalty;
  r.frequency_penalty = p.frequency_penalty;
  r.uniform = draw ? uniform : 0.0;
  if ((rep || add) && p.penalty_last_n != 0 && !history.empty()) {
    const size_t window = p.penalty_last_n < 0
                              ? history.size()
                              : std::min(history.size(), static_cast<size_t>(p.penalty_last_n));
    thread_local std::vector<int32_t> ids;
    ids.clear();
    for (int32_t t : history.last(window))
      if (t >= 0 && t < n_vocab) ids.push_back(t);
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
      size_t j = i;
      while (j < ids.size() && ids[j] == ids[i]) ++j;
      pairs->push_back({ids[i], static_cast<int32_t>(j - i)});
      i = j;
    }
  }
  r.pen_count = static_cast<int32_t>(pairs->size()) - r.pen_begin;
  rows->push_back(r);
}
#endif  // __cplusplus >= 202002L

absl::Status SampleRows(const float* logits, int64_t ld, int rows, int n,
                        const SampleRowParams* params, const PenaltyPair* pairs, int32_t* out,
                        cudaStream_t stream, int flags) {
  if (rows == 0) return absl::OkStatus();
  if (n < 1 || n >= (1 << 28))
    return absl::InvalidArgumentError(absl::StrCat("SampleRows: n = ", n, " outside [1, 2^28)"));
  // Chunks of 256 tokens, larger for huge rows so that at most kMaxChunks exist.
  const int64_t span = static_cast<int64_t>(kChunkBase) * kMaxChunks;
  const int ch = kChunkBase * static_cast<int>((n + span - 1) / span);
  const int n_chunks = CeilDiv(n, ch);
  SampleKernel<<<rows, kThreads, 0, stream>>>(logits, ld, n, ch, n_chunks, params, pairs, out,
                                              flags);
  return LastLaunchStatus("SampleRows");
}

}  // namespace ds::cuda
