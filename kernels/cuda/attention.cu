// Attention kernels (see attention.cuh).
#include <cuda_fp16.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"

namespace ds::cuda {
namespace {

__device__ __forceinline__ int64_t KvRow(const KvCacheView& kv, int slot, int pos) {
  const int page = kv.block_table[slot * kv.max_pages + pos / kv.page_size];
  return (static_cast<int64_t>(page) * kv.page_size + pos % kv.page_size) * kv.n_kv;
}

// One block per token; warp w handles heads w, w+nw, ... (query heads, then key heads, then
// value heads). RoPE angles are computed once per token in double (f32 angles lose ~1e-2 rad at
// positions ~2.6e5), then shared by all heads.
__global__ void __launch_bounds__(256) QkvPrepKernel(const QkvPrepArgs a) {
  extern __shared__ float smem[];  // [n_rot/2] cos, [n_rot/2] sin, [nw][hd] head staging
  const AttnShape& s = a.shape;
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int half = s.n_rot / 2, hd = s.hd;
  float* cs = smem;
  float* sn = smem + half;
  float* stage = smem + 2 * half + warp * hd;
  const int pos = a.tok_pos[t], slot = a.tok_slot[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double inv_freq = pow(static_cast<double>(s.rope_base), -2.0 * i / s.n_rot);
    double sd, cd;
    sincos(static_cast<double>(pos) * inv_freq, &sd, &cd);
    cs[i] = static_cast<float>(cd);
    sn[i] = static_cast<float>(sd);
  }
  __syncthreads();
  const int64_t kvrow = KvRow(a.kv, slot, pos);
  const int n_heads_total = s.n_head + 2 * s.n_kv;
  for (int head = warp; head < n_heads_total; head += nw) {
    const float* src;
    const float* nw_w = nullptr;
    if (head < s.n_head) {
      src = a.qg + static_cast<int64_t>(t) * s.n_head * 2 * hd + head * 2 * hd;
      nw_w = a.q_norm;
    } else if (head < s.n_head + s.n_kv) {
      src = a.k + static_cast<int64_t>(t) * s.n_kv * hd + (head - s.n_head) * hd;
      nw_w = a.k_norm;
    } else {
      src = a.v + static_cast<int64_t>(t) * s.n_kv * hd + (head - s.n_head - s.n_kv) * hd;
    }
    float ss = 0.f;
    for (int e = lane; e < hd; e += 32) ss += src[e] * src[e];
    ss = WarpSum(ss);
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
      } else if (head < s.n_head + s.n_kv) {
        a.kv.k[(kvrow + head - s.n_head) * hd + e] = __half_as_ushort(__float2half_rn(val));
      } else {
        a.kv.v[(kvrow + head - s.n_head - s.n_kv) * hd + e] = __half_as_ushort(__float2half_rn(val));
      }
    }
    __syncwarp();
  }
}

constexpr int kDecWarps = 8;
constexpr int kMaxGroup = 8;
constexpr int kPrefetch = 4;
// Tokens per split: the fixed split count spread over the sequence, but never under kMinChunk
// tokens, so a short sequence uses few splits (`used`) and the combine reads only those.
constexpr int kMinChunk = 64;

__device__ __forceinline__ int SplitChunk(int len, int n_splits, int* used) {
  const int chunk = max((len + n_splits - 1) / n_splits, kMinChunk);
  *used = (len + chunk - 1) / chunk;
  return chunk;
}

// Grid (n_kv, n_splits, n_seqs). Warp w of split s walks tokens start+w, start+w+8, ... of the
// split's range keeping an online softmax per query head of the GQA group; the block merges its
// warps and writes one partial (acc, m, l) per head and split.
template <int D, int GM>  // dims per lane: hd = 32 * D; GM >= the GQA group, a compile-time bound
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
#pragma unroll
    for (int t = 0; t < kPrefetch; ++t) {
      const int tok = min(tok0 + t * kDecWarps, end - 1);
      const int64_t base = (KvRow(a.kv, slot, tok) + kvh) * hd + lane * D;
      if constexpr (D >= 2) {
#pragma unroll
        for (int d = 0; d < D; d += 2) {
          const float2 kk = __half22float2(*reinterpret_cast<const __half2*>(a.kv.k + base + d));
          const float2 vv = __half22float2(*reinterpret_cast<const __half2*>(a.kv.v + base + d));
          kf[t][d] = kk.x; kf[t][d + 1] = kk.y;
          vf[t][d] = vv.x; vf[t][d + 1] = vv.y;
        }
      } else {
        kf[t][0] = __half2float(__ushort_as_half(a.kv.k[base]));
        vf[t][0] = __half2float(__ushort_as_half(a.kv.v[base]));
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

template <int D>
void LaunchAttnDecode(const AttnDecodeArgs& a, dim3 grid, cudaStream_t stream) {
  const int G = a.shape.n_head / a.shape.n_kv;
  if (G <= 1) AttnDecodeKernel<D, 1><<<grid, kDecWarps * 32, 0, stream>>>(a);
  else if (G <= 2) AttnDecodeKernel<D, 2><<<grid, kDecWarps * 32, 0, stream>>>(a);
  else if (G <= 4) AttnDecodeKernel<D, 4><<<grid, kDecWarps * 32, 0, stream>>>(a);
  else if (G <= 6) AttnDecodeKernel<D, 6><<<grid, kDecWarps * 32, 0, stream>>>(a);
  else AttnDecodeKernel<D, 8><<<grid, kDecWarps * 32, 0, stream>>>(a);
}

// Grid (n_head, n_seqs), hd threads: merge the partials and apply the sigmoid output gate.
__global__ void AttnCombineKernel(const AttnDecodeArgs a) {
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

// Copies cache rows [0, L) of one slot into contiguous [L, n_kv*hd] buffers for cuBLAS.
__global__ void GatherKvKernel(const KvCacheView kv, int slot, int L, uint16_t* __restrict__ k,
                               uint16_t* __restrict__ v) {
  const int width = kv.n_kv * kv.hd;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(L) * width) return;
  const int pos = static_cast<int>(i / width), e = static_cast<int>(i % width);
  const int64_t src = KvRow(kv, slot, pos) * kv.hd + e;
  k[i] = kv.k[src];
  v[i] = kv.v[src];
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

absl::Status QkvPrep(const QkvPrepArgs& a, cudaStream_t stream) {
  if (a.T == 0) return absl::OkStatus();
  const int nw = 8;
  const size_t smem = sizeof(float) * (a.shape.n_rot + nw * a.shape.hd);
  QkvPrepKernel<<<a.T, nw * 32, smem, stream>>>(a);
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
  const dim3 grid(s.n_kv, a.n_splits, a.n_seqs);
  switch (s.hd) {
    case 32: LaunchAttnDecode<1>(a, grid, stream); break;
    case 64: LaunchAttnDecode<2>(a, grid, stream); break;
    case 128: LaunchAttnDecode<4>(a, grid, stream); break;
    case 256: LaunchAttnDecode<8>(a, grid, stream); break;
    default: return absl::UnimplementedError(absl::StrCat("AttnDecode: head_dim ", s.hd, " not in {32,64,128,256}"));
  }
  DS_RETURN_IF_ERROR(LastLaunchStatus("AttnDecode"));
  AttnCombineKernel<<<dim3(s.n_head, a.n_seqs), s.hd, 0, stream>>>(a);  // hd >= 32: whole warps
  return LastLaunchStatus("AttnCombine");
}

absl::Status AttnPrefill(const AttnPrefillArgs& a, CublasGemm* gemm, cudaStream_t stream) {
  const AttnShape& s = a.shape;
  if (a.T == 0) return absl::OkStatus();
  const int L = a.pos0 + a.T, G = s.n_head / s.n_kv, hd = s.hd;
  const int64_t width = static_cast<int64_t>(s.n_kv) * hd;
  GatherKvKernel<<<CeilDiv(L * width, 256), 256, 0, stream>>>(a.kv, a.slot, L, a.k_tmp, a.v_tmp);
  DS_RETURN_IF_ERROR(LastLaunchStatus("GatherKv"));
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
