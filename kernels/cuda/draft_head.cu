// The coarse draft head: its copy from a tiled Q6_K matrix and its one-column matmul (see
// draft_head.cuh). The matmul is the tiled column kernel's one-column form (gemv_tiled.cu,
// kOneCol: 4 warps per 16-row tile split the K units, the next unit in flight, the first loaded
// before the wait for the kernel ahead) on the smaller unit.
#include "kernels/cuda/draft_head.cuh"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/tiled_q6k.cuh"

namespace ds::cuda {
namespace {

using namespace tiled;  // NOLINT: the tiled layout's helpers (tiled_q6k.cuh)

constexpr int kWarps = 4;
constexpr int kCoarseOffSc = 2048, kCoarseOffD = 2304;
static_assert(kCoarseOffD + 32 == kCoarseUnitBytes);
static_assert(kOffD + 32 - kOffSc == kCoarseUnitBytes - kCoarseOffSc, "scales and d move as one run");

// One warp per tile-unit: thread T turns its ql / qh words of each step into the nibbles of
// the same positions; scales and d are copied.
__global__ void CoarsenKernel(const uint8_t* __restrict__ tiled, int64_t n_units,
                              uint8_t* __restrict__ coarse) {
  const int64_t u = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (u >= n_units) return;
  const int T = threadIdx.x & 31;
  const uint8_t* src = tiled + u * kTileUnitBytes;
  uint8_t* dst = coarse + u * kCoarseUnitBytes;
#pragma unroll
  for (int s = 0; s < 16; ++s) {
    const int off = 512 * (s >> 2) + 16 * T + 4 * (s & 3);
    const uint32_t ql = *reinterpret_cast<const uint32_t*>(src + off);
    const uint32_t qh =
        *reinterpret_cast<const uint32_t*>(src + kOffQh + 512 * (s >> 3) + 16 * T + 4 * ((s & 7) >> 1));
    uint32_t t0, t1;  // t = (q - 32) & 63 of rows g / g + 8; q = t ^ 32
    DecodeStepUnsigned(ql, qh, s & 1, t0, t1);
    const uint32_t h0 = ((t0 ^ 0x20202020u) >> 2) & 0x0F0F0F0Fu;
    const uint32_t h1 = ((t1 ^ 0x20202020u) >> 2) & 0x0F0F0F0Fu;
    *reinterpret_cast<uint32_t*>(dst + off) = h0 | (h1 << 4);
  }
  for (int i = T; i < (kCoarseUnitBytes - kCoarseOffSc) / 4; i += 32)
    reinterpret_cast<uint32_t*>(dst + kCoarseOffSc)[i] =
        reinterpret_cast<const uint32_t*>(src + kOffSc)[i];
}

struct CoarseUnit {
  uint4 nib[4], sc0, sc1;
  uint32_t d;
};

__device__ __forceinline__ void LoadCoarseUnit(CoarseUnit& t, const uint8_t* p, int lane) {
  const int g = lane >> 2;
#pragma unroll
  for (int i = 0; i < 4; ++i) t.nib[i] = LdStream(p + 512 * i + 16 * lane);
  t.sc0 = __ldg(reinterpret_cast<const uint4*>(p + kCoarseOffSc + 16 * g));
  t.sc1 = __ldg(reinterpret_cast<const uint4*>(p + kCoarseOffSc + 16 * (g + 8)));
  t.d = __ldg(reinterpret_cast<const uint32_t*>(p + kCoarseOffD + 4 * g));
}

// 4 nibbles h (one per byte) -> the int8 8h - 61 (8h + 67 <= 187 never carries; ^ 0x80 is -128).
__device__ __forceinline__ uint32_t CoarseBytes4(uint32_t h) {
  return (h * 8u + 0x43434343u) ^ 0x80808080u;
}

// Block = one 16-row tile; warp w takes units w, w + 4, ...; one activation column. Thread
// (g, q) holds C rows g and g + 8 of column 2q; every q computes column 0 (only q == 0 stores).
__global__ void __launch_bounds__(kWarps * 32) CoarseGemvKernel(const uint8_t* __restrict__ w,
                                                                int64_t M, int K,
                                                                const int8_t* __restrict__ xq,
                                                                const float* __restrict__ xd,
                                                                float* __restrict__ y) {
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
    const float dg = HalfBitsToF32(cu.d & 0xFFFF) * 0.5f;  // the bracket is fed doubled
    const float dg8 = HalfBitsToF32(cu.d >> 16) * 0.5f;
    float part0 = 0.f, part2 = 0.f;
#pragma unroll
    for (int s = 0; s < 16; ++s) {
      const uint32_t word = Word(cu.nib[s >> 2], s & 3);
      const uint32_t a0 = CoarseBytes4(word & 0x0F0F0F0Fu);
      const uint32_t a1 = CoarseBytes4((word >> 4) & 0x0F0F0F0Fu);
      const float s0 = dg * static_cast<float>(static_cast<int8_t>(Word(cu.sc0, s >> 2) >> (8 * (s & 3))));
      const float s1 = dg8 * static_cast<float>(static_cast<int8_t>(Word(cu.sc1, s >> 2) >> (8 * (s & 3))));
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
  CoarsenKernel<<<static_cast<unsigned>(CeilDiv(n_units, 8)), 256, 0, stream>>>(
      static_cast<const uint8_t*>(tiled), n_units, static_cast<uint8_t*>(coarse));
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
