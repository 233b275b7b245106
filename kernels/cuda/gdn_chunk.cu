// The chunked Gated DeltaNet prefill (see gdn_chunk.cuh for the math and the split).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gdn_chunk.cuh"
#include "kernels/cuda/gdn_chunk_scan_mma.cuh"
#include "kernels/cuda/gdn_state.cuh"

namespace ds::cuda::gdn_chunk {
namespace {

constexpr int NC = kGdnChunk;  // tokens per chunk (32: one per lane)
// State columns per scan block: 16 at dk >= 64 (the 27B: 384 blocks of 128 threads, ~3 per SM,
// each thread half the products of a 32-column block's), 32 below (a thread's state rows must
// stay a multiple of 4). A block's threads form kThreads / COLS groups of COLS, one column each.
template <int DK>
constexpr int ScanCols() {
  return DK >= 64 ? 16 : 32;
}

// The scratch of chunk c and value head h: W [NC][DK], then P [NC][NC].
template <int DK>
__device__ __forceinline__ float* ScratchOf(const GdnPrefillArgs& a, int c, int h) {
  return a.wy + (static_cast<int64_t>(c) * a.shape.v_heads + h) * ScratchFloatsPerChunkHead(DK);
}

// ---------------------------------------------------------------------------------------------
// 1. Per (chunk, head), in parallel. Every global load of a thread is issued before its first
// use (a chain of dependent loads per row cost ~1 us each: 66 us per block in the first cut).
constexpr int kThreads = 128;

template <int DK>
struct PrepSmem {
  float K[NC][DK + 4];  // +4: 16-byte rows whose lanes s fall 4 banks apart
  float Q[NC][DK + 4];
  float A[NC][NC + 1];
  float Tt[NC][NC + 4];  // Tt[s][r] = T[r][s], T = (I + A)^-1
  float gam[NC], beta[NC], sb[NC];  // sb = β e^γ
};

__device__ __forceinline__ float Dot4(const float4& x, const float4& y, float acc) {
  acc = fmaf(x.x, y.x, acc);
  acc = fmaf(x.y, y.y, acc);
  acc = fmaf(x.z, y.z, acc);
  return fmaf(x.w, y.w, acc);
}

template <int DK>
__global__ void __launch_bounds__(kThreads) GdnChunkPrepKernel(const GdnPrefillArgs a) {
  __shared__ __align__(16) PrepSmem<DK> sm;
  constexpr int kLoads = NC * DK / 4 / kThreads;  // float4 of Q (and of K) per thread
  const GdnShape& d = a.shape;
  const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const int Hv = d.v_heads, dv = d.v_dim, C = d.channels(), Kw = d.k_heads * DK;
  const int kh = h % d.k_heads;
  const int t0 = c * NC, n = min(NC, a.T - t0);
  {
    float4 qv[kLoads], kv[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = tid + kThreads * i, r = idx / (DK / 4), k = 4 * (idx % (DK / 4));
      qv[i] = kv[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < n) {
        const float* yr = a.y + static_cast<int64_t>(t0 + r) * C + kh * DK + k;
        qv[i] = *reinterpret_cast<const float4*>(yr);
        kv[i] = *reinterpret_cast<const float4*>(yr + Kw);
      }
    }
    if (tid < NC) {  // padded rows: β = g = 0, so they drop out and γ stays at the last real row's
      const bool ok = tid < n;
      float v = ok ? a.g[static_cast<int64_t>(t0 + tid) * Hv + h] : 0.f;
      const float be = ok ? a.beta[static_cast<int64_t>(t0 + tid) * Hv + h] : 0.f;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float u = __shfl_up_sync(0xffffffffu, v, o);
        if (tid >= o) v += u;
      }
      sm.gam[tid] = v;
      sm.beta[tid] = be;
      sm.sb[tid] = be * __expf(v);
      if (ok) a.g[static_cast<int64_t>(t0 + tid) * Hv + h] = v;  // γ for the scan
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = tid + kThreads * i, r = idx / (DK / 4), k = 4 * (idx % (DK / 4));
      *reinterpret_cast<float4*>(&sm.Q[r][k]) = qv[i];
      *reinterpret_cast<float4*>(&sm.K[r][k]) = kv[i];
    }
  }
  // This thread's V column (U below), loaded now so the loads overlap the products.
  float vs[NC];
  float* vcol = a.y + static_cast<int64_t>(t0) * C + 2 * Kw + h * dv + tid;
#pragma unroll
  for (int s = 0; s < NC; ++s) vs[s] = tid < dv && s < n ? vcol[static_cast<int64_t>(s) * C] : 0.f;
  __syncthreads();

  float* Wg = ScratchOf<DK>(a, c, h);
  float* Pg = Wg + NC * DK;
  {  // A and P: lane = s, rows r = w + 4m
    float kk[NC / 4], qk[NC / 4];
#pragma unroll
    for (int m = 0; m < NC / 4; ++m) kk[m] = qk[m] = 0.f;
#pragma unroll 4
    for (int k = 0; k < DK; k += 4) {
      const float4 ks = *reinterpret_cast<const float4*>(&sm.K[lane][k]);
#pragma unroll
      for (int m = 0; m < NC / 4; ++m) {
        kk[m] = Dot4(*reinterpret_cast<const float4*>(&sm.K[w + 4 * m][k]), ks, kk[m]);
        qk[m] = Dot4(*reinterpret_cast<const float4*>(&sm.Q[w + 4 * m][k]), ks, qk[m]);
      }
    }
    const int s = lane;
#pragma unroll
    for (int m = 0; m < NC / 4; ++m) {
      const int r = w + 4 * m;
      const float dec = s <= r ? __expf(sm.gam[r] - sm.gam[s]) : 0.f;  // masked before exp
      sm.A[r][s] = s < r ? sm.beta[r] * kk[m] * dec : 0.f;
      Pg[r * NC + s] = s <= r ? qk[m] * dec : 0.f;
    }
  }
  __syncthreads();
  if (w == 0) {  // column cc = lane of T: T[r][cc] = δ_r,cc - Σ_{s<r} A[r][s] T[s][cc] (T[s][cc] = 0 for s < cc)
    const int cc = lane;
    float tc[NC];
#pragma unroll
    for (int r = 0; r < NC; ++r) {
      float v = 0.f;
#pragma unroll
      for (int s = 0; s < r; ++s) v = fmaf(-sm.A[r][s], tc[s], v);
      tc[r] = r == cc ? 1.f : (r > cc ? v : 0.f);
    }
#pragma unroll
    for (int r = 0; r < NC; r += 4)
      *reinterpret_cast<float4*>(&sm.Tt[cc][r]) = make_float4(tc[r], tc[r + 1], tc[r + 2], tc[r + 3]);
  }
  __syncthreads();
  if (tid < DK) {  // W[r][k] = Σ_{s<=r} T[r][s] β_s e^{γ_s} K[s][k], thread = column k
    float acc[NC];
#pragma unroll
    for (int r = 0; r < NC; ++r) acc[r] = 0.f;
#pragma unroll 4
    for (int s = 0; s < NC; ++s) {
      const float ks = sm.K[s][tid] * sm.sb[s];
#pragma unroll
      for (int r = 0; r < NC; r += 4) {
        const float4 t = *reinterpret_cast<const float4*>(&sm.Tt[s][r]);  // 0 where r < s
        acc[r] = fmaf(t.x, ks, acc[r]);
        acc[r + 1] = fmaf(t.y, ks, acc[r + 1]);
        acc[r + 2] = fmaf(t.z, ks, acc[r + 2]);
        acc[r + 3] = fmaf(t.w, ks, acc[r + 3]);
      }
    }
#pragma unroll
    for (int r = 0; r < NC; ++r) Wg[r * DK + tid] = acc[r];
  }
  if (tid < dv) {  // U[r][j] = Σ_{s<=r} T[r][s] β_s V[s][j], over V in y, thread = column j
    float acc[NC];
#pragma unroll
    for (int r = 0; r < NC; ++r) acc[r] = 0.f;
#pragma unroll
    for (int s = 0; s < NC; ++s) {
      const float x = vs[s] * sm.beta[s];
#pragma unroll
      for (int r = 0; r < NC; r += 4) {
        const float4 t = *reinterpret_cast<const float4*>(&sm.Tt[s][r]);
        acc[r] = fmaf(t.x, x, acc[r]);
        acc[r + 1] = fmaf(t.y, x, acc[r + 1]);
        acc[r + 2] = fmaf(t.z, x, acc[r + 2]);
        acc[r + 3] = fmaf(t.w, x, acc[r + 3]);
      }
    }
#pragma unroll
    for (int r = 0; r < NC; ++r)
      if (r < n) vcol[static_cast<int64_t>(r) * C] = acc[r];
  }
}

// ---------------------------------------------------------------------------------------------
// 2. Per (head, ScanCols state columns), chunks in order. Thread (group w, column j): state column
// c0 + j; rows [w R, (w+1) R) of the chunk's V' and O (R = NC / groups); state rows [w DK/groups,
// (w+1) DK/groups) in registers for the update (St keeps the whole block, transposed, for the
// products that read every row). TS: the state's storage type (gdn_state.cuh): loaded at the
// start, stored (rounded) once at the end.
template <int DK, int kCols = ScanCols<DK>()>
struct ScanSmem {
  float St[kCols][DK + 4];  // S transposed: St[j][k]; +4 keeps 16-byte rows, lanes 8 banks apart
  float W[NC][DK + 4];
  float Qg[NC][DK + 4];  // e^{γ_r} q_r
  float Kt[NC][DK + 4];  // e^{γ_L - γ_r} k_r
  float P[NC][NC + 4];
  float V[NC][kCols];  // U, then V'
  float gam[2][NC];    // this chunk's γ and the next one's (loaded a chunk ahead)
};

template <int DK, typename TS>
__global__ void __launch_bounds__(kThreads) GdnChunkScanKernel(const GdnPrefillArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  ScanSmem<DK>& sm = *reinterpret_cast<ScanSmem<DK>*>(smem_raw);
  constexpr int kCols = ScanCols<DK>(), kGroups = kThreads / kCols;
  constexpr int kRowsPerGroup = NC / kGroups;     // chunk rows of V' / O per thread
  constexpr int KQ = DK / kGroups;                // state rows per thread in the update
  constexpr int kLoads = NC * DK / 4 / kThreads;  // float4 of W (of q, of k) per thread
  constexpr int kPLoads = NC * NC / 4 / kThreads;
  const GdnShape& d = a.shape;
  const int h = blockIdx.x, c0 = blockIdx.y * kCols, tid = threadIdx.x;
  const int w = tid / kCols, j = tid % kCols, r0 = w * kRowsPerGroup, k0 = w * KQ;
  const int Hv = d.v_heads, dv = d.v_dim, C = d.channels(), Kw = d.k_heads * DK;
  const int kh = h % d.k_heads;
  const bool jv = c0 + j < dv;
  TS* Sg = static_cast<TS*>(a.state) + (static_cast<int64_t>(a.slot) * Hv + h) * DK * dv + c0 + j;
  float s[KQ];
#pragma unroll
  for (int i = 0; i < KQ; ++i) {
    s[i] = jv ? LoadState(Sg + static_cast<int64_t>(k0 + i) * dv) : 0.f;
    sm.St[j][k0 + i] = s[i];
  }
  // γ of chunk c's row i (padded rows repeat the last real row's).
  auto gamma_of = [&](int c, int i) {
    const int t0 = c * NC, n = min(NC, a.T - t0);
    return a.g[static_cast<int64_t>(t0 + min(i, n - 1)) * Hv + h];
  };
  if (tid < NC) sm.gam[0][tid] = gamma_of(0, tid);
  __syncthreads();

  const int n_chunks = (a.T + NC - 1) / NC;
  for (int c = 0; c < n_chunks; ++c) {
    const int t0 = c * NC, n = min(NC, a.T - t0), buf = c & 1;
    const float* Wg = ScratchOf<DK>(a, c, h);
    const float* Pg = Wg + NC * DK;
    const float gnext = tid < NC && c + 1 < n_chunks ? gamma_of(c + 1, tid) : 0.f;
    {  // stage the chunk: every load issued before the first store
      float4 wv[kLoads], qv[kLoads], kv[kLoads], pv[kPLoads];
      float uv[kRowsPerGroup];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int idx = tid + kThreads * i, r = idx / (DK / 4), k = 4 * (idx % (DK / 4));
        wv[i] = *reinterpret_cast<const float4*>(Wg + r * DK + k);
        qv[i] = kv[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < n) {
          const float* yr = a.y + static_cast<int64_t>(t0 + r) * C + kh * DK + k;
          qv[i] = *reinterpret_cast<const float4*>(yr);
          kv[i] = *reinterpret_cast<const float4*>(yr + Kw);
        }
      }
#pragma unroll
      for (int i = 0; i < kPLoads; ++i) pv[i] = *reinterpret_cast<const float4*>(Pg + 4 * (tid + kThreads * i));
#pragma unroll
      for (int i = 0; i < kRowsPerGroup; ++i) {
        const int r = r0 + i;
        uv[i] = r < n && jv ? a.y[static_cast<int64_t>(t0 + r) * C + 2 * Kw + h * dv + c0 + j] : 0.f;
      }
      const float gl = sm.gam[buf][NC - 1];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int idx = tid + kThreads * i, r = idx / (DK / 4), k = 4 * (idx % (DK / 4));
        const float eq = __expf(sm.gam[buf][r]), ek = __expf(gl - sm.gam[buf][r]);
        *reinterpret_cast<float4*>(&sm.W[r][k]) = wv[i];
        *reinterpret_cast<float4*>(&sm.Qg[r][k]) = make_float4(qv[i].x * eq, qv[i].y * eq, qv[i].z * eq, qv[i].w * eq);
        *reinterpret_cast<float4*>(&sm.Kt[r][k]) = make_float4(kv[i].x * ek, kv[i].y * ek, kv[i].z * ek, kv[i].w * ek);
      }
#pragma unroll
      for (int i = 0; i < kPLoads; ++i) {
        const int idx = tid + kThreads * i, r = idx / (NC / 4), k = 4 * (idx % (NC / 4));
        *reinterpret_cast<float4*>(&sm.P[r][k]) = pv[i];
      }
#pragma unroll
      for (int i = 0; i < kRowsPerGroup; ++i) sm.V[r0 + i][j] = uv[i];
    }
    __syncthreads();
    const float gl = sm.gam[buf][NC - 1];

    // V' = U - W S and O1 = Qg S for rows r0 .. r0 + kRowsPerGroup - 1, column j.
    float vp[kRowsPerGroup], o[kRowsPerGroup];
#pragma unroll
    for (int i = 0; i < kRowsPerGroup; ++i) {
      vp[i] = 0.f;
      o[i] = 0.f;
    }
#pragma unroll 4
    for (int k = 0; k < DK; k += 4) {
      const float4 sv = *reinterpret_cast<const float4*>(&sm.St[j][k]);
#pragma unroll
      for (int i = 0; i < kRowsPerGroup; ++i) {
        vp[i] = Dot4(*reinterpret_cast<const float4*>(&sm.W[r0 + i][k]), sv, vp[i]);
        o[i] = Dot4(*reinterpret_cast<const float4*>(&sm.Qg[r0 + i][k]), sv, o[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kRowsPerGroup; ++i) sm.V[r0 + i][j] -= vp[i];  // only this thread's entries
    __syncthreads();  // V' complete; every thread done reading St

    // O = O1 + P V'
#pragma unroll 2
    for (int s4 = 0; s4 < NC; s4 += 4) {
      const float4 v = make_float4(sm.V[s4][j], sm.V[s4 + 1][j], sm.V[s4 + 2][j], sm.V[s4 + 3][j]);
#pragma unroll
      for (int i = 0; i < kRowsPerGroup; ++i)
        o[i] = Dot4(*reinterpret_cast<const float4*>(&sm.P[r0 + i][s4]), v, o[i]);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerGroup; ++i) {
      const int r = r0 + i;
      if (r < n && jv) a.out[static_cast<int64_t>(t0 + r) * Hv * dv + h * dv + c0 + j] = o[i];
    }

    // S <- e^{γ_L} S + Σ_r Kt[r] V'[r]ᵀ for this thread's state rows.
    const float el = __expf(gl);
#pragma unroll
    for (int i = 0; i < KQ; ++i) s[i] *= el;
#pragma unroll 4
    for (int r = 0; r < NC; ++r) {
      const float v = sm.V[r][j];
#pragma unroll
      for (int i = 0; i < KQ; i += 4) {
        const float4 kt = *reinterpret_cast<const float4*>(&sm.Kt[r][k0 + i]);
        s[i] = fmaf(kt.x, v, s[i]);
        s[i + 1] = fmaf(kt.y, v, s[i + 1]);
        s[i + 2] = fmaf(kt.z, v, s[i + 2]);
        s[i + 3] = fmaf(kt.w, v, s[i + 3]);
      }
    }
#pragma unroll
    for (int i = 0; i < KQ; i += 4)
      *reinterpret_cast<float4*>(&sm.St[j][k0 + i]) = make_float4(s[i], s[i + 1], s[i + 2], s[i + 3]);
    if (tid < NC) sm.gam[buf ^ 1][tid] = gnext;
    __syncthreads();  // before the next chunk's staging overwrites W / Qg / Kt / P / V
  }
  if (jv)
#pragma unroll
    for (int i = 0; i < KQ; ++i) StoreState(Sg + static_cast<int64_t>(k0 + i) * dv, s[i]);
}

template <int DK, typename TS>
bool LaunchDk(const GdnPrefillArgs& a, cudaStream_t stream) {
  const int bytes = static_cast<int>(sizeof(ScanSmem<DK>));
  if (cudaFuncSetAttribute(GdnChunkScanKernel<DK, TS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           bytes) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const int n_chunks = (a.T + NC - 1) / NC;
  GdnChunkPrepKernel<DK><<<dim3(n_chunks, a.shape.v_heads), kThreads, 0, stream>>>(a);
  if constexpr (DK >= 32) {  // the mma scan's warps hold dk / 32 state tiles each
    if (a.scan_mma && LaunchScanMma<DK, TS>(a, stream)) return true;
  }
  GdnChunkScanKernel<DK, TS>
      <<<dim3(a.shape.v_heads, (a.shape.v_dim + ScanCols<DK>() - 1) / ScanCols<DK>()), kThreads,
         bytes, stream>>>(a);
  return true;
}

template <typename TS>
bool LaunchTyped(const GdnPrefillArgs& a, cudaStream_t stream) {
  switch (a.shape.k_dim) {
    case 16: return LaunchDk<16, TS>(a, stream);
    case 32: return LaunchDk<32, TS>(a, stream);
    case 64: return LaunchDk<64, TS>(a, stream);
    case 128: return LaunchDk<128, TS>(a, stream);
    default: return false;
  }
}

}  // namespace

bool Launch(const GdnPrefillArgs& a, cudaStream_t stream) {
  return a.state_bf16 ? LaunchTyped<__nv_bfloat16>(a, stream) : LaunchTyped<float>(a, stream);
}

}  // namespace ds::cuda::gdn_chunk

namespace ds::cuda {

int64_t GdnChunkScratchFloats(const GdnShape& s, int T) {
  const int64_t chunks = (static_cast<int64_t>(T) + kGdnChunk - 1) / kGdnChunk;
  return chunks * s.v_heads * gdn_chunk::ScratchFloatsPerChunkHead(s.k_dim);
}

}  // namespace ds::cuda
