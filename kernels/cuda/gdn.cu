// Gated DeltaNet prefill (see gdn.cuh; the decode kernels are in gdn_decode.cu): the causal conv
// over a prompt's tokens, the gates, the recurrence (per token here, chunked in gdn_chunk.cu) and
// the gated RMSNorm; and the shape check both use.
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gdn.cuh"
#include "kernels/cuda/gdn_chunk.cuh"
#include "kernels/cuda/gdn_common.cuh"
#include "kernels/cuda/gdn_state.cuh"

namespace ds::cuda {
namespace {

// One thread per (channel, kConvTokens consecutive tokens): the K taps read the pre-conv rows
// t-K+1..t, those of positions before pos0 from the ring; the thread keeps the last K-1 rows in
// registers, so each row is read ~once (one thread per (token, channel) read it K times), and
// issues all its row loads before the first sum (v1 walked the T tokens in one thread per
// channel: one dependent load per token, ~0.2 ms per layer of a 512-token prefill on the 27B).
// A 2-D grid: the 64-bit division of a flat index by C cost the per-element form ~3x its load
// time (H200, 27B shape: 158 us for 2,048 tokens). The sum is taken in the same order as the
// decode kernel's: tap K-1 first, then taps 0..K-2.
constexpr int kConvTokens = 8;
__global__ void GdnConvPrefillKernel(const GdnPrefillArgs a) {
  const int C = a.shape.channels();
  const int t0 = blockIdx.x * kConvTokens, c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float* ring = a.conv_ring + static_cast<int64_t>(a.slot) * kConvK * C;
  const float* w = a.p.conv_w + static_cast<int64_t>(c) * kConvK;
  const int n = min(kConvTokens, a.T - t0);
  float win[kConvK - 1 + kConvTokens];  // rows t0-K+1 .. t0+n-1
#pragma unroll
  for (int tap = 0; tap < kConvK - 1; ++tap) {
    const int tt = t0 - (kConvK - 1) + tap;
    win[tap] = tt >= 0 ? a.mixed[static_cast<int64_t>(tt) * C + c]
                       : ring[Mod(a.pos0 + tt, kConvK) * C + c];
  }
#pragma unroll
  for (int i = 0; i < kConvTokens; ++i)
    win[kConvK - 1 + i] = i < n ? a.mixed[static_cast<int64_t>(t0 + i) * C + c] : 0.f;
#pragma unroll
  for (int i = 0; i < kConvTokens; ++i) {
    if (i >= n) break;
    float acc = w[kConvK - 1] * win[kConvK - 1 + i];
#pragma unroll
    for (int tap = 0; tap < kConvK - 1; ++tap) acc += w[tap] * win[i + tap];
    a.y[static_cast<int64_t>(t0 + i) * C + c] = Silu(acc);
  }
}

// After GdnConvPrefillKernel (which read the old rows): the ring keeps the pre-conv rows of the
// last K-1 positions, pos0+T-K+1 .. pos0+T-1 (older ones from the ring itself when T < K-1).
__global__ void GdnConvRingKernel(const GdnPrefillArgs a) {
  const int C = a.shape.channels();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* ring = a.conv_ring + static_cast<int64_t>(a.slot) * kConvK * C;
  float keep[kConvK - 1];
#pragma unroll
  for (int i = 0; i < kConvK - 1; ++i) {  // every read before any write: the rows may alias
    const int tt = a.T - (kConvK - 1) + i;
    keep[i] = tt >= 0 ? a.mixed[static_cast<int64_t>(tt) * C + c] : ring[Mod(a.pos0 + tt, kConvK) * C + c];
  }
#pragma unroll
  for (int i = 0; i < kConvK - 1; ++i) ring[Mod(a.pos0 + a.T - (kConvK - 1) + i, kConvK) * C + c] = keep[i];
}

// Per token: l2-normalise the q and k heads in place (one warp per head) and compute the gates.
__global__ void GdnPrepKernel(const GdnPrefillArgs a) {
  const GdnShape& d = a.shape;
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int C = d.channels();
  float* yt = a.y + static_cast<int64_t>(t) * C;
  const float qscale = rsqrtf(static_cast<float>(d.k_dim));
  for (int head = warp; head < 2 * d.k_heads; head += nw) {
    float* v = yt + head * d.k_dim;  // q heads first, then k heads (channel order of §5.2)
    float ss = 0.f;
    for (int e = lane; e < d.k_dim; e += 32) ss += v[e] * v[e];
    ss = WarpSum(ss);
    const float sc = rsqrtf(ss + a.p.eps) * (head < d.k_heads ? qscale : 1.f);
    for (int e = lane; e < d.k_dim; e += 32) v[e] *= sc;
  }
  for (int h = threadIdx.x; h < d.v_heads; h += blockDim.x) {
    const int64_t gi = static_cast<int64_t>(t) * d.v_heads + h;
    a.beta[gi] = Sigmoid(a.b[gi]);
    a.g[gi] = a.p.ssm_a[h] * Softplus(a.alpha[gi] + a.p.dt_bias[h]);
  }
}

// TS: the state's storage type (gdn_state.cuh); the piece keeps it in f32 and stores it once.
template <int DK, typename TS>
__global__ void __launch_bounds__(128, 1) GdnScanKernel(const GdnPrefillArgs a) {
  __shared__ float qs[2][DK], ks[2][DK];
  const GdnShape& d = a.shape;
  const int h = blockIdx.x, j = threadIdx.x;
  const int C = d.channels(), Kw = d.k_heads * DK, dv = d.v_dim, Hv = d.v_heads;
  const int kh = h % d.k_heads;
  TS* S = static_cast<TS*>(a.state) + (static_cast<int64_t>(a.slot) * Hv + h) * DK * dv + j;
  float s[DK];
#pragma unroll
  for (int k = 0; k < DK; ++k) s[k] = LoadState(S + k * dv);
  if (j < DK) {
    qs[0][j] = a.y[kh * DK + j];
    ks[0][j] = a.y[Kw + kh * DK + j];
  }
  float vv = a.y[2 * Kw + h * dv + j], beta = a.beta[h], g = a.g[h];
  __syncthreads();
  for (int t = 0; t < a.T; ++t) {
    const int buf = t & 1;
    // Prefetch token t+1 while computing token t (its q/k go to the other smem buffer, which
    // every thread finished reading before the barrier that ended iteration t-1).
    float vn = 0.f, bn = 0.f, gn = 0.f;
    if (t + 1 < a.T) {
      const float* yn = a.y + static_cast<int64_t>(t + 1) * C;
      if (j < DK) {
        qs[buf ^ 1][j] = yn[kh * DK + j];
        ks[buf ^ 1][j] = yn[Kw + kh * DK + j];
      }
      vn = yn[2 * Kw + h * dv + j];
      bn = a.beta[static_cast<int64_t>(t + 1) * Hv + h];
      gn = a.g[static_cast<int64_t>(t + 1) * Hv + h];
    }
    const float decay = __expf(g);
    float u = 0.f;
#pragma unroll
    for (int k = 0; k < DK; ++k) {
      s[k] *= decay;
      u = fmaf(s[k], ks[buf][k], u);
    }
    const float delta = beta * (vv - u);
    float o = 0.f;
#pragma unroll
    for (int k = 0; k < DK; ++k) {
      s[k] = fmaf(ks[buf][k], delta, s[k]);
      o = fmaf(s[k], qs[buf][k], o);
    }
    a.out[static_cast<int64_t>(t) * Hv * dv + h * dv + j] = o;
    vv = vn;
    beta = bn;
    g = gn;
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < DK; ++k) StoreState(S + k * dv, s[k]);
}

// out[t, h*dv + j] = rmsnorm(o[t, h, :])[j] * w[j] * silu(z[t, h*dv + j]), in place.
__global__ void GatedNormKernel(float* __restrict__ o, const float* __restrict__ z,
                                const float* __restrict__ w, int dv, float eps) {
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dv;
  const int j = threadIdx.x;  // blockDim = dv rounded up to a warp
  const float v = j < dv ? o[base + j] : 0.f;
  const float ss = BlockSum(v * v, scratch);
  if (j < dv) o[base + j] = v * rsqrtf(ss / dv + eps) * w[j] * Silu(z[base + j]);
}

}  // namespace

absl::Status GdnShapeSupported(const GdnShape& s) {
  if (s.k_dim != 16 && s.k_dim != 32 && s.k_dim != 64 && s.k_dim != 128)
    return absl::UnimplementedError(absl::StrCat("GDN on CUDA: ssm.state_size ", s.k_dim, " not in {16,32,64,128}"));
  if (s.v_dim % 16 != 0 || s.v_dim < s.k_dim || s.v_dim > 128)
    return absl::UnimplementedError(absl::StrCat("GDN on CUDA: value head dim ", s.v_dim, " unsupported"));
  if (s.conv_kernel != kConvK)
    return absl::UnimplementedError(absl::StrCat("GDN on CUDA: ssm.conv_kernel ", s.conv_kernel, " != 4"));
  if (s.k_heads <= 0 || s.v_heads % s.k_heads != 0)
    return absl::InvalidArgumentError("GDN: value heads must be a multiple of key heads");
  return absl::OkStatus();
}

absl::Status GdnPrefill(const GdnPrefillArgs& a, cudaStream_t stream) {
  DS_RETURN_IF_ERROR(GdnShapeSupported(a.shape));
  if (a.T == 0) return absl::OkStatus();
  const int C = a.shape.channels();
  GdnConvPrefillKernel<<<dim3(CeilDiv(a.T, kConvTokens), CeilDiv(C, 256)), 256, 0, stream>>>(a);
  GdnConvRingKernel<<<CeilDiv(C, 128), 128, 0, stream>>>(a);
  DS_RETURN_IF_ERROR(LastLaunchStatus("GdnConvPrefill"));
  GdnPrepKernel<<<a.T, 512, 0, stream>>>(a);
  DS_RETURN_IF_ERROR(LastLaunchStatus("GdnPrep"));
  if (a.chunk != 0 && a.chunk != kGdnChunk)
    return absl::InvalidArgumentError(absl::StrCat("GdnPrefill: chunk ", a.chunk, " not 0 or ", kGdnChunk));
  // The per-token recurrence, for k_dim DK and the state's storage type.
  auto scan = [&] {
    DispatchDk(a.shape.k_dim, [&](auto tag) {
      constexpr int DK = decltype(tag)::value;
      DispatchState(a.state_bf16, [&](auto st) {
        GdnScanKernel<DK, decltype(st)><<<a.shape.v_heads, a.shape.v_dim, 0, stream>>>(a);
      });
    });
  };
  if (a.chunk == 0) {
    scan();
    DS_RETURN_IF_ERROR(LastLaunchStatus("GdnScan"));
  } else {
    if (a.wy == nullptr)
      return absl::InvalidArgumentError("GdnPrefill: the chunked form needs its scratch (wy)");
    if (!gdn_chunk::Launch(a, stream)) scan();  // not enough shared memory (sm_75): the recurrence
    DS_RETURN_IF_ERROR(LastLaunchStatus("GdnChunk"));
  }
  GatedNormKernel<<<a.T * a.shape.v_heads, WarpRound(a.shape.v_dim), 0, stream>>>(a.out, a.z, a.p.norm_w,
                                                                      a.shape.v_dim, a.p.eps);
  return LastLaunchStatus("GatedNorm");
}

}  // namespace ds::cuda
