// The coarse draft head: its copy from a tiled Q6_K matrix and its one-column matmul (see
// draft_head.cuh). The matmul is the tiled column kernel's one-column form (gemv_tiled.cu,
// kOneCol: 4 warps per 16-row tile split the K units, the next unit in flight, the first loaded
// before the wait for the kernel ahead) on the smaller unit.
#include "kernels/cuda/draft_head.cuh"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/draft_head_fit.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/tiled_q6k.cuh"

namespace ds::cuda {
namespace {

using namespace tiled;  // NOLINT: the tiled layout's helpers (tiled_q6k.cuh)

constexpr int kWarps = 4;
constexpr int kCoarseOffSc = 2048;
static_assert(kCoarseOffSc + 16 * 16 * 2 == kCoarseUnitBytes);

// Block = one tile-unit, thread (r, s) = 16 r + s: row r's 16 values of step (sub-block) s. Each
// thread decodes its values from the tiled layout (the same float operations as the CPU
// reference: (d * sc) * (q - 32)) and fits their scale and codes; the nibbles go through shared
// memory into the ql word order.
__global__ void __launch_bounds__(256)
    CoarsenKernel(const uint8_t* __restrict__ tiled, uint8_t* __restrict__ coarse) {
  __shared__ uint8_t nib[kTiledRows][256];
  const int64_t u = blockIdx.x;
  const uint8_t* src = tiled + u * kTileUnitBytes;
  uint8_t* dst = coarse + u * kCoarseUnitBytes;
  const int r = threadIdx.x >> 4, s = threadIdx.x & 15, g = r & 7, hi = r >> 3;
  const float d6 = HalfBitsToF32(*reinterpret_cast<const uint16_t*>(src + kOffD + 4 * g + 2 * hi));
  const float dsc = d6 * static_cast<float>(static_cast<int8_t>(src[kOffSc + 16 * r + s]));
  float w[16];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int T = 4 * g + q;
    const uint32_t ql =
        *reinterpret_cast<const uint32_t*>(src + 512 * (s >> 2) + 16 * T + 4 * (s & 3));
    const uint32_t qh = *reinterpret_cast<const uint32_t*>(src + kOffQh + 512 * (s >> 3) + 16 * T +
                                                           4 * ((s & 7) >> 1));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = (ql >> (8 * j + 4 * hi)) & 0xFu;
      const uint32_t h2 = (qh >> (8 * j + 4 * (s & 1) + 2 * hi)) & 3u;
      const int t6 = static_cast<int>(lo | (h2 << 4));  // (q - 32) & 63
      w[4 * q + j] = dsc * static_cast<float>(t6 >= 32 ? t6 - 64 : t6);
    }
  }
  const uint16_t scale = draft_head::SubBlockScale(w);
  reinterpret_cast<uint16_t*>(dst + kCoarseOffSc)[16 * r + s] = scale;
#pragma unroll
  for (int i = 0; i < 16; ++i)
    nib[r][16 * s + i] = static_cast<uint8_t>(draft_head::Nibble(w[i], scale));
  __syncthreads();
  for (int wi = threadIdx.x; wi < 512; wi += 256) {  // word wi = (i, T, w): 128 i + 4 T + w
    const int i4 = wi >> 7, T = (wi >> 2) & 31, ww = wi & 3, st = 4 * i4 + ww;
    const int gg = T >> 2, qq = T & 3;
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k = 16 * st + 4 * qq + j;
      word |= static_cast<uint32_t>(nib[gg][k] | (nib[gg + 8][k] << 4)) << (8 * j);
    }
    *reinterpret_cast<uint32_t*>(dst + 4 * wi) = word;
  }
}

struct CoarseUnit {
  uint4 nib[4];
  uint4 sc[4];  // bf16 scales: row g steps 0-7, 8-15, row g + 8 steps 0-7, 8-15
};

__device__ __forceinline__ void LoadCoarseUnit(CoarseUnit& t, const uint8_t* p, int lane) {
  const int g = lane >> 2;
#pragma unroll
  for (int i = 0; i < 4; ++i) t.nib[i] = LdStream(p + 512 * i + 16 * lane);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    t.sc[i] = __ldg(
        reinterpret_cast<const uint4*>(p + kCoarseOffSc + 32 * (g + 8 * (i >> 1)) + 16 * (i & 1)));
}

// Step s's bf16 scale of row g (h = 0) or g + 8 (h = 1) as f32.
__device__ __forceinline__ float StepScale(const CoarseUnit& t, int h, int s) {
  const uint32_t word = Word(t.sc[2 * h + (s >> 3)], (s & 7) >> 1);
  return __uint_as_float((s & 1) ? word & 0xFFFF0000u : word << 16);
}

// 4 nibbles (one per byte, code + 8) -> the int8 codes (n + 120 <= 135 never carries; ^ 0x80 is
// -128).
__device__ __forceinline__ uint32_t CodeBytes4(uint32_t n) {
  return (n + 0x78787878u) ^ 0x80808080u;
}

// Block = one 16-row tile; warp w takes units w, w + 4, ...; one activation column. Thread
// (g, q) holds C rows g and g + 8 of column 2q; every q computes column 0 (only q == 0 stores).
__global__ void __launch_bounds__(kWarps * 32)
    CoarseGemvKernel(const uint8_t* __restrict__ w, int64_t M, int K, const int8_t* __restrict__ xq,
                     const float* __restrict__ xd, float* __restrict__ y) {
  __shared__ float red[kWarps][kTiledRows];
  const int tile = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int nu = K / 256;
  const uint8_t* wp = w + (static_cast<int64_t>(tile) * nu + warp) * kCoarseUnitBytes;
  const int8_t* xb = xq + 4 * q + warp * 256;
  const float* xs = xd + warp * 8;

  CoarseUnit next;
  if (warp < nu) LoadCoarseUnit(next, wp, lane);
  WaitForPrerequisiteGrids();  // launched early: only the weights above

  float acc0 = 0.f, acc2 = 0.f;
  for (int u = warp; u < nu; u += kWarps) {
    const CoarseUnit cu = next;
    if (u + kWarps < nu) LoadCoarseUnit(next, wp + kWarps * kCoarseUnitBytes, lane);
    uint32_t b_unit[16];
#pragma unroll
    for (int s = 0; s < 16; ++s) b_unit[s] = __ldg(reinterpret_cast<const uint32_t*>(xb + 16 * s));
    float4 xs_unit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) xs_unit[h] = __ldg(reinterpret_cast<const float4*>(xs + 4 * h));
    float part0 = 0.f, part2 = 0.f;
#pragma unroll
    for (int s = 0; s < 16; ++s) {
      const uint32_t word = Word(cu.nib[s >> 2], s & 3);
      const uint32_t a0 = CodeBytes4(word & 0x0F0F0F0Fu);
      const uint32_t a1 = CodeBytes4((word >> 4) & 0x0F0F0F0Fu);
      const float s0 = StepScale(cu, 0, s), s1 = StepScale(cu, 1, s);
      float f[4];
      Mma(a0, a1, b_unit[s], f);
      if ((s & 1) == 0) {
        part0 = s0 * f[0];
        part2 = s1 * f[2];
      } else {
        part0 = fmaf(s0, f[0], part0);
        part2 = fmaf(s1, f[2], part2);
        const int blk = s >> 1;  // both sub-blocks of a 32-element activation block done
        const float x0 = blk < 4 ? (&xs_unit[0].x)[blk] : (&xs_unit[1].x)[blk - 4];
        acc0 = fmaf(x0, part0, acc0);
        acc2 = fmaf(x0, part2, acc2);
      }
    }
    wp += kWarps * kCoarseUnitBytes;
    xb += kWarps * 256;
    xs += kWarps * 8;
  }
  AllowDependentLaunch();
  if (q == 0) {
    red[warp][g] = acc0;
    red[warp][g + 8] = acc2;
  }
  __syncthreads();
  if (threadIdx.x < kTiledRows) {
    const int64_t r = static_cast<int64_t>(tile) * kTiledRows + threadIdx.x;
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) v += red[k][threadIdx.x];
    if (r < M) y[r] = v;
  }
}

}  // namespace

uint64_t CoarseBytes(int64_t M, int K) {
  if (K % 256 != 0 || M <= 0) return 0;
  return static_cast<uint64_t>(CeilDiv(M, kTiledRows)) * (K / 256) * kCoarseUnitBytes;
}

absl::Status CoarsenTiled(const void* tiled, int64_t M, int K, void* coarse, cudaStream_t stream) {
  if (K % 256 != 0 || M <= 0 || tiled == nullptr || coarse == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("CoarsenTiled: bad shape M=", M, " K=", K));
  const int64_t n_units = CeilDiv(M, kTiledRows) * (K / 256);
  CoarsenKernel<<<static_cast<unsigned>(n_units), 256, 0, stream>>>(
      static_cast<const uint8_t*>(tiled), static_cast<uint8_t*>(coarse));
  return LastLaunchStatus("CoarsenTiled");
}

absl::Status CoarseGemv(const void* coarse, int64_t M, int K, const int8_t* xq, const float* xd,
                        float* y, cudaStream_t stream, bool early) {
  if (K % 256 != 0 || M <= 0 || coarse == nullptr || xq == nullptr || xd == nullptr || y == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("CoarseGemv: bad arguments M=", M, " K=", K));
  if (reinterpret_cast<uintptr_t>(xd) % 16 != 0)
    return absl::InvalidArgumentError("CoarseGemv: xd not 16-byte aligned");
  LaunchMaybeEarly(CoarseGemvKernel, static_cast<unsigned>(CeilDiv(M, kTiledRows)), kWarps * 32, 0,
                   stream, early, static_cast<const uint8_t*>(coarse), M, K, xq, xd, y);
  return LastLaunchStatus("CoarseGemv");
}

}  // namespace ds::cuda
