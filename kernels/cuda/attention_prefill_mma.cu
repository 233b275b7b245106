// Causal prefill attention on f16 tensor cores, flash style (see attention_prefill_mma.cuh and
// kernels/cuda/README.md, "Prefill attention on tensor cores").
//
// Why: the cuBLAS path writes the scores of every 256-query chunk to memory as f32, softmaxes
// them into f16 probabilities and multiplies those back: at long contexts that traffic (~12 bytes
// per query, head and key) and the per-chunk launches are most of a prefill (a 32k prompt:
// attention 2.1 of 5.8 s on the H200). Here nothing of size queries x keys leaves the SM.
//
// Block = one KV head x 16 query positions, one warp per query head of the GQA group (warp w:
// head kvh * G + w, the block's 16 positions as the 16 rows of its mma tiles), so every K/V tile
// staged in shared memory serves the whole group. Per 32-key tile a warp computes S = Q Kᵀ
// (`mma.m16n8k16`, Q and K fragments by ldmatrix), an online softmax per row (a lane holds rows
// g and g + 8), and O += P V with P re-packed from the S accumulator as the A operand and V by
// ldmatrix.trans. K/V tiles are double-buffered with cp.async. Output O / l times the sigmoid
// gate, f32. Numerics as the cuBLAS path: f16 Q, K, V and P, f32 accumulation.
#include <cuda_fp16.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention_prefill_mma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/flash_tile.cuh"
#include "kernels/cuda/mma_f16.cuh"

namespace ds::cuda {
namespace {

constexpr int kRows = 16;  // query positions per block (the mma's M)
constexpr int kKeys = 32;  // keys per tile
constexpr int kStages = 2;

// Shared-memory layout of a block: every row (a query or a key) is hd halves plus 16 bytes of
// padding, so the 8 rows an ldmatrix reads at one column start 4 banks apart (no conflicts).
template <int HD>
struct PrefillSmem {
  static constexpr int kStride = HD * 2 + 16;  // bytes per row
  static constexpr int kTile = kKeys * kStride;
  static int Bytes(int G) { return G * kRows * kStride + kStages * 2 * kTile; }
};

template <int HD>
__global__ void __launch_bounds__(256) AttnPrefillMmaKernel(const AttnPrefillArgs a) {
  using Sm = PrefillSmem<HD>;
  constexpr int NT = HD / 8;  // n-tiles of the output (8 dims each)
  extern __shared__ __align__(16) uint8_t smem[];
  const AttnShape& s = a.shape;
  const int G = s.n_head / s.n_kv;
  const int kvh = blockIdx.y, t0 = blockIdx.x * kRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int nthreads = blockDim.x, h = kvh * G + warp;
  const int L = a.pos0 + a.T;
  const int last = min(t0 + kRows, a.T) - 1;  // the block's last query (local index)
  const int n_keys = a.pos0 + last + 1;       // keys the block's last query sees
  const int64_t qw = static_cast<int64_t>(s.n_head) * HD, kvw = static_cast<int64_t>(s.n_kv) * HD;

  uint8_t* qs = smem + warp * kRows * Sm::kStride;
  uint8_t* kv0 = smem + G * kRows * Sm::kStride;
  // This warp's 16 query rows (rows past T repeat the last one; they are not written).
  for (int c = lane; c < kRows * (HD / 8); c += 32) {
    const int r = c / (HD / 8), col = c % (HD / 8);
    const int t = min(t0 + r, a.T - 1);
    CpAsync16(qs + r * Sm::kStride + col * 16, a.q16 + t * qw + static_cast<int64_t>(h) * HD + col * 8);
  }
  auto stage = [&](int tile, int st) {
    uint8_t* ks = kv0 + st * 2 * Sm::kTile;
    for (int c = threadIdx.x; c < kKeys * (HD / 8); c += nthreads) {
      const int r = c / (HD / 8), col = c % (HD / 8);
      const int key = min(tile * kKeys + r, L - 1);
      const int64_t src = key * kvw + static_cast<int64_t>(kvh) * HD + col * 8;
      CpAsync16(ks + r * Sm::kStride + col * 16, a.k_tmp + src);
      CpAsync16(ks + Sm::kTile + r * Sm::kStride + col * 16, a.v_tmp + src);
    }
    CpAsyncCommit();
  };
  const int n_tiles = (n_keys + kKeys - 1) / kKeys;
  stage(0, 0);  // with the Q rows in its group

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  // Rows g and g + 8 of this lane: running max (of the scaled scores, base 2) and partial sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int pos_row[2] = {a.pos0 + t0 + g, a.pos0 + t0 + g + 8};
  const float scale_log2 = rsqrtf(static_cast<float>(HD)) * 1.4426950408889634f;
  // ldmatrix row addresses of this lane: matrix lane / 8, row lane % 8 of it.
  const int lm = lane >> 3, lr = lane & 7;

  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + 1 < n_tiles) stage(tile + 1, (tile + 1) & 1);
    else CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    const uint8_t* ks = kv0 + (tile & 1) * 2 * Sm::kTile;
    const uint8_t* vs = ks + Sm::kTile;

    // S = Q Kᵀ: 16 rows x 32 keys (4 n-tiles of 8 keys).
    float sc[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t qa[4];
      // a0: rows 0-7 / dims 0-7, a1: rows 8-15 / dims 0-7, a2: rows 0-7 / dims 8-15, a3: 8-15 / 8-15.
      LdMatrixX4(qs + ((lm & 1) * 8 + lr) * Sm::kStride + (kk * 16 + (lm >> 1) * 8) * 2, qa);
#pragma unroll
      for (int np = 0; np < 2; ++np) {  // keys 16 np .. 16 np + 15
        uint32_t kb[4];
        // (keys 0-7, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 0-7), (keys 8-15, dims 8-15)
        LdMatrixX4(ks + (np * 16 + (lm >> 1) * 8 + lr) * Sm::kStride + (kk * 16 + (lm & 1) * 8) * 2, kb);
        MmaF16(qa, kb[0], kb[1], sc[2 * np]);
        MmaF16(qa, kb[2], kb[3], sc[2 * np + 1]);
      }
    }
    // Online softmax of rows g and g + 8 (flash_tile.cuh), then O rescaled where a max moved.
    const int key0 = tile * kKeys;
    const bool diag = key0 + kKeys - 1 > a.pos0 + t0;  // some key lies past some row's position
    float c[2];
    uint32_t pa[2][4];  // P as the A operand of the two 16-key steps
    FlashSoftmaxTile<4>(sc, key0, diag, pos_row, tig, scale_log2, m, l, c, pa);
    FlashRescale<NT>(o, c);
    // O += P V: B = V (keys x dims) by ldmatrix.trans, two n-tiles of 8 dims per load.
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t vb[4];
        // (keys 0-7, dims 0-7), (keys 8-15, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 8-15)
        LdMatrixX4Trans(vs + (kk * 16 + (lm & 1) * 8 + lr) * Sm::kStride + (np * 16 + (lm >> 1) * 8) * 2, vb);
        MmaF16(pa[kk], vb[0], vb[1], o[2 * np]);
        MmaF16(pa[kk], vb[2], vb[3], o[2 * np + 1]);
      }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  CpAsyncWait<0>();
  FlashRowSums(l);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = t0 + g + 8 * r;
    if (t >= a.T) continue;
    FlashStoreRow<NT>(o, r, l[r], tig, a.qg + t * 2 * qw + static_cast<int64_t>(h) * 2 * HD + HD,
                      a.out + t * qw + static_cast<int64_t>(h) * HD);
  }
}

template <int HD>
absl::Status Launch(const AttnPrefillArgs& a, cudaStream_t stream) {
  const int G = a.shape.n_head / a.shape.n_kv;
  const int bytes = PrefillSmem<HD>::Bytes(G);
  if (bytes > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        AttnPrefillMmaKernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess)
      return absl::InternalError(absl::StrCat("AttnPrefillMma: ", bytes, " bytes of shared memory: ",
                                              cudaGetErrorString(e)));
  }
  const dim3 grid(CeilDiv(a.T, kRows), a.shape.n_kv);
  AttnPrefillMmaKernel<HD><<<grid, G * 32, bytes, stream>>>(a);
  return LastLaunchStatus("AttnPrefillMma");
}

}  // namespace

bool AttnPrefillMmaSupports(const AttnShape& s) {
  return s.n_kv > 0 && s.n_head % s.n_kv == 0 && s.n_head / s.n_kv <= 8 &&
         (s.hd == 64 || s.hd == 128 || s.hd == 256);
}

absl::Status LaunchAttnPrefillMma(const AttnPrefillArgs& a, cudaStream_t stream) {
  switch (a.shape.hd) {
    case 64: return Launch<64>(a, stream);
    case 128: return Launch<128>(a, stream);
    default: return Launch<256>(a, stream);
  }
}

}  // namespace ds::cuda
