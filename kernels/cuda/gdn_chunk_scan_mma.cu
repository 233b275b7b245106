// The chunked Gated DeltaNet prefill's sequential scan on TF32 tensor cores (sm_80+; see
// gdn_chunk.cuh for the math and gdn_chunk_scan_mma.cuh for the choice).
//
// One block of 16 warps per (value head, 64 state columns): the 27B's 48 heads x 128 columns
// make 96 blocks, one per SM (the block holds ~217 KB of shared memory). Per chunk of 32 tokens:
//
//   A. X = [W; Qg] S            64 x 64 outputs, K = dk: warp w one 16-row x 16-column tile;
//      warps 0-7 (W rows) write V' = U - X to shared memory, warps 8-15 (Qg rows) keep O1;
//   B. O = O1 + P V'            warps 8-15, K = 32; stored to `out`;
//   C. S <- e^{γ_L} S + Ktᵀ V'  every warp dk / 32 tiles of 16 x 8 (in one 16-row band), the
//      state in the warps' accumulator registers all along, and copied to shared memory after
//      the update for the next chunk's A (the B operand there).
//
// The B operands (S, V') are kept in shared memory already split into their TF32 hi / lo parts
// (split once when written instead of by every warp that reads them). The first form, 8 warps
// splitting on read, ran 4.6k instructions per warp and chunk at 2 warps per scheduler with half
// the issue slots idle; this one is only a little faster (H200, one 27B layer at 8,192 tokens:
// 2.0-2.1 -> 1.96 ms; the f32 scan 2.33): ~8 us per chunk, bound by the chunk's chain of
// dependent steps (ncu: the fixed-latency "wait" stall first), not by tensor throughput.
//
// The next chunk's operands (W, P from the prep's scratch; q, k, U rows from y; its γ) are
// copied with cp.async into the second of two stage buffers while this chunk computes, so the
// loop waits on no global load. Products are 3xTF32 (mma_tf32.cuh: f32 accuracy); the e^γ factors
// of Qg and Kt are applied as the fragments are read.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/gdn_chunk.cuh"
#include "kernels/cuda/gdn_chunk_scan_mma.cuh"
#include "kernels/cuda/gdn_state.cuh"
#include "kernels/cuda/mma_tf32.cuh"

namespace ds::cuda::gdn_chunk {
namespace {

constexpr int NC = kGdnChunk;                       // tokens per chunk (32)
constexpr int kCols = 64;                           // state columns per block
constexpr int kWarps = 16, kThreads = kWarps * 32;  // dk >= 32: dk / 32 state tiles per warp

// Row strides (floats) chosen so that every fragment read of a warp hits 32 distinct banks:
// row-major A reads (rows g, columns t) want a stride = 4 mod 32, the transposed / B reads
// (rows t, columns g) a stride = 8 mod 32.
template <int DK>
struct ScanMmaSmem {
  struct Stage {
    float W[NC][DK + 4];
    float Q[NC][DK + 4];
    float K[NC][DK + 8];  // read transposed (Ktᵀ is step C's A operand)
    float P[NC][NC + 4];
    float U[NC][kCols + 8];
    float gam[NC];
  } stage[2];
  // The state block after the last update (step A's B operand) and V', as TF32 hi / lo parts.
  uint32_t S_hi[DK][kCols + 8], S_lo[DK][kCols + 8];
  uint32_t V_hi[NC][kCols + 8], V_lo[NC][kCols + 8];
};

template <int R>
__device__ __forceinline__ void PutSplit(uint32_t (&hi)[R][kCols + 8], uint32_t (&lo)[R][kCols + 8],
                                         int r, int c, float x) {
  const Tf32Pair p = SplitTf32(x);
  hi[r][c] = p.hi;
  lo[r][c] = p.lo;
}
template <int R>
__device__ __forceinline__ Tf32Pair GetSplit(const uint32_t (&hi)[R][kCols + 8],
                                             const uint32_t (&lo)[R][kCols + 8], int r, int c) {
  return {hi[r][c], lo[r][c]};
}

// Copies chunk c's operands into `st` (one cp.async group per thread). Rows past the sequence
// and columns past dv are zero-filled; γ of padded rows repeats the last real row's.
template <int DK>
__device__ __forceinline__ void StageChunk(const GdnPrefillArgs& a, int c, int h, int c0,
                                           typename ScanMmaSmem<DK>::Stage& st) {
  const GdnShape& d = a.shape;
  const int tid = threadIdx.x, Hv = d.v_heads, dv = d.v_dim, C = d.channels(), Kw = d.k_heads * DK;
  const int kh = h % d.k_heads, t0 = c * NC, n = min(NC, a.T - t0);
  const float* Wg = a.wy + (static_cast<int64_t>(c) * Hv + h) * ScratchFloatsPerChunkHead(DK);
  const float* Pg = Wg + NC * DK;
  for (int i = tid; i < NC * DK / 4; i += kThreads) {
    const int r = i / (DK / 4), k = 4 * (i % (DK / 4));
    CpAsync16(&st.W[r][k], Wg + r * DK + k);
    const bool ok = r < n;
    const float* yr = a.y + static_cast<int64_t>(t0 + (ok ? r : 0)) * C + kh * DK + k;
    CpAsync16Zfill(&st.Q[r][k], yr, ok);
    CpAsync16Zfill(&st.K[r][k], yr + Kw, ok);
  }
  for (int i = tid; i < NC * NC / 4; i += kThreads) {
    const int r = i / (NC / 4), k = 4 * (i % (NC / 4));
    CpAsync16(&st.P[r][k], Pg + r * NC + k);
  }
  for (int i = tid; i < NC * kCols / 4; i += kThreads) {
    const int r = i / (kCols / 4), j = 4 * (i % (kCols / 4));
    const bool ok = r < n && c0 + j < dv;
    const float* src = ok ? a.y + static_cast<int64_t>(t0 + r) * C + 2 * Kw + h * dv + c0 + j : a.y;
    CpAsync16Zfill(&st.U[r][j], src, ok);
  }
  if (tid < NC) CpAsync4(&st.gam[tid], a.g + static_cast<int64_t>(t0 + min(tid, n - 1)) * Hv + h);
  CpAsyncCommit();
}

template <int DK, typename TS>
__global__ void __launch_bounds__(kThreads, 1) GdnChunkScanMmaKernel(const GdnPrefillArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  ScanMmaSmem<DK>& sm = *reinterpret_cast<ScanMmaSmem<DK>*>(smem_raw);
  constexpr int kStateTiles = DK / 32;  // 16 x 8 state tiles per warp: (DK / 16) x 8 over 16 warps
  const GdnShape& d = a.shape;
  const int h = blockIdx.x, c0 = blockIdx.y * kCols, tid = threadIdx.x;
  const int w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int Hv = d.v_heads, dv = d.v_dim;
  TS* Sg = static_cast<TS*>(a.state) + (static_cast<int64_t>(a.slot) * Hv + h) * DK * dv + c0;

  // The state tiles this warp updates (step C): one 16-row band, rows sr .. sr + 15, and in it
  // kStateTiles tiles of 8 columns from sc (the block's (DK / 16) x 8 tiles, DK / 32 per warp).
  const int sr = (w * kStateTiles / 8) * 16, sc = (w * kStateTiles % 8) * 8;
  float s[kStateTiles][4];
#pragma unroll
  for (int i = 0; i < kStateTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = sr + g + (e >> 1) * 8, col = sc + 8 * i + 2 * t + (e & 1);
      s[i][e] = c0 + col < dv ? LoadState(Sg + static_cast<int64_t>(row) * dv + col) : 0.f;
      PutSplit<DK>(sm.S_hi, sm.S_lo, row, col, s[i][e]);
    }

  const int n_chunks = (a.T + NC - 1) / NC;
  StageChunk<DK>(a, 0, h, c0, sm.stage[0]);
  // Step A's tile of this warp: rows ar .. +15 of W (warps 0-7) or Qg (8-15), columns ac .. +15.
  const bool q_rows = w >= 8;
  const int ar = ((w >> 2) & 1) * 16, ac = (w & 3) * 16;
  for (int c = 0; c < n_chunks; ++c) {
    const int t0 = c * NC, n = min(NC, a.T - t0);
    if (c + 1 < n_chunks)
      StageChunk<DK>(a, c + 1, h, c0, sm.stage[(c + 1) & 1]);
    else
      CpAsyncCommit();  // an empty group keeps the wait count below uniform
    CpAsyncWait<1>();
    __syncthreads();  // chunk c's operands (every thread's copies) and the state in sm.S
    typename ScanMmaSmem<DK>::Stage& st = sm.stage[c & 1];
    const float gl = st.gam[NC - 1];

    // A. X = [W; Qg] S for this warp's 16 x 16 tile.
    float x[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[j][e] = 0.f;
    {
      const float(*M)[DK + 4] = q_rows ? st.Q : st.W;
      const float e0 = q_rows ? __expf(st.gam[ar + g]) : 1.f;
      const float e1 = q_rows ? __expf(st.gam[ar + g + 8]) : 1.f;
#pragma unroll 4
      for (int k0 = 0; k0 < DK; k0 += 8) {
        const Tf32Pair af[4] = {
            SplitTf32(M[ar + g][k0 + t] * e0), SplitTf32(M[ar + g + 8][k0 + t] * e1),
            SplitTf32(M[ar + g][k0 + t + 4] * e0), SplitTf32(M[ar + g + 8][k0 + t + 4] * e1)};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int col = ac + 8 * j + g;
          const Tf32Pair b0 = GetSplit<DK>(sm.S_hi, sm.S_lo, k0 + t, col);
          const Tf32Pair b1 = GetSplit<DK>(sm.S_hi, sm.S_lo, k0 + t + 4, col);
          Mma3xTf32(af, b0, b1, x[j]);
        }
      }
    }
    if (!q_rows) {  // V' = U - W S
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = ac + 8 * j + 2 * t;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = ar + g + (e >> 1) * 8, cc = col + (e & 1);
          PutSplit<NC>(sm.V_hi, sm.V_lo, row, cc, st.U[row][cc] - x[j][e]);
        }
      }
    }
    __syncthreads();  // V' complete; every warp done reading sm.S

    if (q_rows) {  // B. O = O1 + P V' (rows ar .. +15 of the chunk), stored
#pragma unroll
      for (int k0 = 0; k0 < NC; k0 += 8) {
        const Tf32Pair af[4] = {
            SplitTf32(st.P[ar + g][k0 + t]), SplitTf32(st.P[ar + g + 8][k0 + t]),
            SplitTf32(st.P[ar + g][k0 + t + 4]), SplitTf32(st.P[ar + g + 8][k0 + t + 4])};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int col = ac + 8 * j + g;
          Mma3xTf32(af, GetSplit<NC>(sm.V_hi, sm.V_lo, k0 + t, col),
                    GetSplit<NC>(sm.V_hi, sm.V_lo, k0 + t + 4, col), x[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = c0 + ac + 8 * j + 2 * t;  // dv is even: both columns or neither
        if (col >= dv) continue;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = ar + g + 8 * half;
          if (r < n)
            *reinterpret_cast<float2*>(a.out + static_cast<int64_t>(t0 + r) * Hv * dv + h * dv +
                                       col) = make_float2(x[j][2 * half], x[j][2 * half + 1]);
        }
      }
    }

    // C. S <- e^{γ_L} S + Ktᵀ V', Kt[r] = e^{γ_L - γ_r} k_r.
    const float el = __expf(gl);
#pragma unroll
    for (int i = 0; i < kStateTiles; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] *= el;
#pragma unroll
    for (int k0 = 0; k0 < NC; k0 += 8) {
      const float ea = __expf(gl - st.gam[k0 + t]), eb = __expf(gl - st.gam[k0 + t + 4]);
      const int m = sr + g;
      const Tf32Pair af[4] = {SplitTf32(st.K[k0 + t][m] * ea), SplitTf32(st.K[k0 + t][m + 8] * ea),
                              SplitTf32(st.K[k0 + t + 4][m] * eb),
                              SplitTf32(st.K[k0 + t + 4][m + 8] * eb)};
#pragma unroll
      for (int i = 0; i < kStateTiles; ++i) {
        const int col = sc + 8 * i + g;
        Mma3xTf32(af, GetSplit<NC>(sm.V_hi, sm.V_lo, k0 + t, col),
                  GetSplit<NC>(sm.V_hi, sm.V_lo, k0 + t + 4, col), s[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kStateTiles; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        PutSplit<DK>(sm.S_hi, sm.S_lo, sr + g + (e >> 1) * 8, sc + 8 * i + 2 * t + (e & 1),
                     s[i][e]);
    __syncthreads();  // before the next stage copy overwrites this chunk's buffer
  }
  CpAsyncWait<0>();
#pragma unroll
  for (int i = 0; i < kStateTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = sr + g + (e >> 1) * 8, col = sc + 8 * i + 2 * t + (e & 1);
      if (c0 + col < dv) StoreState(Sg + static_cast<int64_t>(row) * dv + col, s[i][e]);
    }
}

}  // namespace

template <int DK, typename TS>
bool LaunchScanMma(const GdnPrefillArgs& a, cudaStream_t stream) {
  if (a.shape.v_dim % 4 != 0) return false;  // 16-byte copies of U rows
  auto* kernel = GdnChunkScanMmaKernel<DK, TS>;
  const int bytes = static_cast<int>(sizeof(ScanMmaSmem<DK>));
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) !=
      cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  kernel<<<dim3(a.shape.v_heads, (a.shape.v_dim + kCols - 1) / kCols), kThreads, bytes, stream>>>(
      a);
  return true;
}

template bool LaunchScanMma<32, float>(const GdnPrefillArgs&, cudaStream_t);
template bool LaunchScanMma<64, float>(const GdnPrefillArgs&, cudaStream_t);
template bool LaunchScanMma<128, float>(const GdnPrefillArgs&, cudaStream_t);
template bool LaunchScanMma<32, __nv_bfloat16>(const GdnPrefillArgs&, cudaStream_t);
template bool LaunchScanMma<64, __nv_bfloat16>(const GdnPrefillArgs&, cudaStream_t);
template bool LaunchScanMma<128, __nv_bfloat16>(const GdnPrefillArgs&, cudaStream_t);

}  // namespace ds::cuda::gdn_chunk
