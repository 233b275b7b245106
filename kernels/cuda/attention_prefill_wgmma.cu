// Causal prefill attention on warpgroup tensor cores (sm_90a), flash style (see
// attention_prefill_wgmma.cuh and kernels/cuda/README.md, "Prefill attention on warpgroup tensor
// cores").
//
// Why: the mma.sync flash kernel (attention_prefill_mma.cu) gives each warp 16 rows, so every K
// and V fragment is read from shared memory by each warp: at head_dim 256 it is bound by that
// traffic and by one 6-warp block per SM (233 registers), ~190 TFLOPS over a 190k-token fill.
// Here a warpgroup multiplies 64 rows at once with wgmma, which reads K and V from shared memory
// itself: the shared-memory traffic per product drops 4x and the products run asynchronously.
//
// Block = 2 warpgroups x 64 rows = 128 (query head, position) rows of one KV head: the G query
// heads of the GQA group x P = 128 / G positions (row R = head * P + position; rows past G * P
// repeat the last and are not written), so each K/V tile staged in shared memory serves the whole
// group. Per 64-key tile a warpgroup computes S = Q Kᵀ (64 x 64, Q and K from shared memory,
// 16-element steps over head_dim), the online softmax of its rows in registers (base 2, keys past
// a row's position masked on the diagonal tiles), and O += P V with P from registers as the A
// operand and V from shared memory, stored transposed (head_dim rows x 64 keys) so that both B
// operands are K-major. K/V tiles are double-buffered with cp.async into 128-byte swizzled tiles
// (wgmma.cuh). Numerics as the other paths: f16 Q, K, V and P, f32 accumulation, output O / l
// times the sigmoid gate.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention_prefill_wgmma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/flash_tile.cuh"
#include "kernels/cuda/mma_f16.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ds::cuda {
namespace {

constexpr int kWgRows = 64;                        // rows of a warpgroup (wgmma's M)
constexpr int kWarpgroups = 2;                     // per block
constexpr int kBlockRows = kWgRows * kWarpgroups;  // (head, position) rows per block
constexpr int kThreads = 128 * kWarpgroups;

// Shared memory of a block, every tile 1024-byte aligned: Q (HD / 64 tiles of 128 rows x 128
// bytes), then two stages of K (HD / 64 tiles of 64 keys x 128 bytes) and Vᵀ (HD rows x 64 keys).
template <int HD>
struct WgmmaSmem {
  static constexpr int kQBytes = kBlockRows * HD * 2;
  static constexpr int kKBytes = kWgmmaKeys * HD * 2;
  static constexpr int kVBytes = HD * kWgmmaKeys * 2;
  static constexpr int kStage = kKBytes + kVBytes;
  static constexpr int kBytes = kQBytes + 2 * kStage + 1024;  // + the alignment of the base
};

template <int HD>
__global__ void __launch_bounds__(kThreads, 1) AttnPrefillWgmmaKernel(const AttnPrefillArgs a) {
#if DS_WGMMA
  using Sm = WgmmaSmem<HD>;
  constexpr int NO = HD / 8;  // 8-column blocks of O: 64 rows x HD over 128 threads, 4 each
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* const qs = smem_raw + (base - raw);
  uint8_t* const kvs = qs + Sm::kQBytes;

  const AttnShape& s = a.shape;
  const int G = s.n_head / s.n_kv, P = kBlockRows / G;
  const int kvh = blockIdx.y;
  // Causal blocks of later positions see more keys: schedule them first.
  const int t0 = (gridDim.x - 1 - blockIdx.x) * P;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, quad = lane & 3;
  const int L = a.pos0 + a.T, Lpad = AttnPrefillVtRows(L);
  const int n_keys = a.pos0 + min(t0 + P, a.T);  // keys the block's last query sees
  const int n_tiles = (n_keys + kWgmmaKeys - 1) / kWgmmaKeys;
  const int64_t qw = static_cast<int64_t>(s.n_head) * HD, kvw = static_cast<int64_t>(s.n_kv) * HD;

  for (int c = tid; c < kBlockRows * (HD / 8); c += kThreads) {
    const int R = c / (HD / 8), ch = c % (HD / 8);
    const int hh = min(R / P, G - 1), t = min(t0 + R % P, a.T - 1);
    CpAsync16(qs + (ch >> 3) * (kBlockRows * 128) + SwizzledOffset(R, ch & 7),
              a.q16 + t * qw + static_cast<int64_t>(kvh * G + hh) * HD + ch * 8);
  }
  auto stage = [&](int tile, int st) {
    uint8_t* ks = kvs + st * Sm::kStage;
    uint8_t* vs = ks + Sm::kKBytes;
    const int key0 = tile * kWgmmaKeys;
    for (int c = tid; c < kWgmmaKeys * (HD / 8); c += kThreads) {
      const int r = c / (HD / 8), ch = c % (HD / 8);
      const int key = min(key0 + r, L - 1);  // rows past L: masked, any finite values
      CpAsync16(ks + (ch >> 3) * (kWgmmaKeys * 128) + SwizzledOffset(r, ch & 7),
                a.k_tmp + key * kvw + static_cast<int64_t>(kvh) * HD + ch * 8);
    }
    for (int c = tid; c < HD * (kWgmmaKeys / 8); c += kThreads) {
      const int d = c >> 3, ch = c & 7;  // Vᵀ is zero past L (the gather pads it)
      CpAsync16(vs + SwizzledOffset(d, ch),
                a.v_tmp + (static_cast<int64_t>(kvh) * HD + d) * Lpad + key0 + ch * 8);
    }
    CpAsyncCommit();
  };
  stage(0, 0);  // with the Q rows in its group

  float o[NO][4];  // wgmma's accumulator layout is mma.sync's C fragment per 8 columns
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  float(&o_flat)[NO * 4] = reinterpret_cast<float(&)[NO * 4]>(o);
  // Rows g and g + 8 of this lane's warp: running max (scaled scores, base 2) and partial sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  int pos_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) pos_row[r] = a.pos0 + t0 + (wg * kWgRows + warp * 16 + g + 8 * r) % P;
  const float scale_log2 = rsqrtf(static_cast<float>(HD)) * 1.4426950408889634f;
  const uint32_t kv_addr = base + Sm::kQBytes;
  const uint64_t q_desc = WgmmaDesc(base + wg * kWgRows * 128);

  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + 1 < n_tiles)
      stage(tile + 1, (tile + 1) & 1);
    else
      CpAsyncCommit();
    CpAsyncWait<1>();
    FenceProxyAsyncShared();  // this thread's cp.async rows, before wgmma reads them
    __syncthreads();
    const uint32_t k_addr = kv_addr + (tile & 1) * Sm::kStage;
    const uint64_t k_desc = WgmmaDesc(k_addr), v_desc = WgmmaDesc(k_addr + Sm::kKBytes);

    // S = Q Kᵀ: 64 rows x 64 keys, 16 dims per step (step k: tile k / 4, 32 bytes per step in it).
    float sc[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[n][e] = 0.f;
    float(&sc_flat)[32] = reinterpret_cast<float(&)[32]>(sc);
    WgmmaFenceOperands(sc_flat);
    WgmmaFence();
#pragma unroll
    for (int k = 0; k < HD / 16; ++k)
      WgmmaM64N64K16SS(sc_flat, q_desc + (((k >> 2) * kBlockRows * 128 + (k & 3) * 32) >> 4),
                       k_desc + (((k >> 2) * kWgmmaKeys * 128 + (k & 3) * 32) >> 4), k > 0);
    WgmmaCommit();
    WgmmaWait<0>();
    WgmmaFenceOperands(sc_flat);

    // Online softmax of rows g and g + 8 (flash_tile.cuh), then O rescaled where a max moved.
    const int key0 = tile * kWgmmaKeys;
    const bool diag = key0 + kWgmmaKeys - 1 > a.pos0 + t0;  // some key lies past some row
    float c[2];
    uint32_t pa[4][4];  // P as the A operand of the four 16-key steps
    FlashSoftmaxTile<8>(sc, key0, diag, pos_row, quad, scale_log2, m, l, c, pa);
    FlashRescale<NO>(o, c);
    // O += P V: 16 keys per step, Vᵀ's 32 bytes per step.
    WgmmaFenceOperands(o_flat);
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint64_t vd = v_desc + ((ks * 32) >> 4);
      if constexpr (HD == 256)
        WgmmaM64N256K16RS(o_flat, pa[ks], vd, 1);
      else if constexpr (HD == 128)
        WgmmaM64N128K16RS(o_flat, pa[ks], vd, 1);
      else
        WgmmaM64N64K16RS(o_flat, pa[ks], vd, 1);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    WgmmaFenceOperands(o_flat);
    __syncthreads();  // both warpgroups are done with this stage before it is refilled
  }
  CpAsyncWait<0>();
  FlashRowSums(l);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int R = wg * kWgRows + warp * 16 + g + 8 * r;
    const int hh = R / P, t = t0 + R % P;
    if (hh >= G || t >= a.T) continue;
    const int h = kvh * G + hh;
    FlashStoreRow<NO>(o, r, l[r], quad, a.qg + t * 2 * qw + static_cast<int64_t>(h) * 2 * HD + HD,
                      a.out + t * qw + static_cast<int64_t>(h) * HD);
  }
#else
  __trap();  // never launched: AttnPrefillWgmmaAvailable() is false without sm_90a code
#endif
}

template <int HD>
absl::Status Launch(const AttnPrefillArgs& a, cudaStream_t stream) {
  const int bytes = WgmmaSmem<HD>::kBytes;
  const cudaError_t e = cudaFuncSetAttribute(AttnPrefillWgmmaKernel<HD>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess)
    return absl::InternalError(absl::StrCat("AttnPrefillWgmma: ", bytes,
                                            " bytes of shared memory: ", cudaGetErrorString(e)));
  const int P = kBlockRows / (a.shape.n_head / a.shape.n_kv);
  const dim3 grid(CeilDiv(a.T, P), a.shape.n_kv);
  AttnPrefillWgmmaKernel<HD><<<grid, kThreads, bytes, stream>>>(a);
  return LastLaunchStatus("AttnPrefillWgmma");
}

}  // namespace

bool AttnPrefillWgmmaSupports(const AttnShape& s) {
  return s.n_kv > 0 && s.n_head % s.n_kv == 0 && s.n_head / s.n_kv <= kBlockRows &&
         (s.hd == 64 || s.hd == 128 || s.hd == 256);
}

bool AttnPrefillWgmmaAvailable() { return WgmmaAvailable(); }

absl::Status LaunchAttnPrefillWgmma(const AttnPrefillArgs& a, cudaStream_t stream) {
  if (!AttnPrefillWgmmaSupports(a.shape))
    return absl::UnimplementedError(absl::StrCat("AttnPrefillWgmma: head_dim ", a.shape.hd,
                                                 ", GQA group ", a.shape.n_head / a.shape.n_kv));
  switch (a.shape.hd) {
    case 64:
      return Launch<64>(a, stream);
    case 128:
      return Launch<128>(a, stream);
    default:
      return Launch<256>(a, stream);
  }
}

}  // namespace ds::cuda
