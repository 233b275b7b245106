// Tiled Q4_K / Q5_K (issue #22): the repack at upload, the dequantization of tiled rows for the
// cuBLAS path, and the device helpers with which the f16 tensor-core kernel (tiled_f16.cu) reads
// a tile-unit. The layout itself, one definition for host and device: kernels/cpu/
// tiled_kquant_layout.h. The host entry points for every tiled format are TileRows /
// DequantizeTiledRows (gemv_tiled.cuh), which call the launchers below for these two.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"
#include "kernels/cpu/tiled_kquant_layout.h"
#include "kernels/cuda/mma_f16.cuh"
#include "kernels/cuda/tiled_q6k.cuh"

namespace ds::cuda {

// TileRows for Q4_K (q5 = false) / Q5_K: `rows` raw rows (row bytes rb) into the tiled matrix at
// `dst`, already offset to the chunk's first tile.
absl::Status TileRowsKquant(bool q5, const void* raw, int64_t rows, int K, int64_t rb, void* dst,
                            cudaStream_t stream);
// DequantizeTiledRows for Q4_K / Q5_K: the values the raw dequantization gives, bit for bit.
absl::Status DequantizeTiledRowsKquant(bool q5, const void* tiled, int64_t row0, int64_t rows,
                                       int K, void* out, bool bf16, cudaStream_t stream);

#ifdef __CUDACC__
namespace tiled_kq_dev {

// A warp's share of one tile-unit: lane (g, q)'s qs words (16 steps), its Q5_K qh words, the 12
// scale bytes of rows g and g + 8, and the (row g, row g + 8) pairs of d and dmin.
struct Unit {
  uint4 qs[4];
  uint4 qh;
  uint32_t s0[3], s8[3];
  uint32_t d, dmin;
};

template <bool kQ5>
__device__ __forceinline__ void LoadUnit(Unit& t, const uint8_t* p, int lane) {
  using namespace tiled_kq;
  const int g = lane >> 2;
#pragma unroll
  for (int i = 0; i < 4; ++i) t.qs[i] = tiled::LdStream(p + 512 * i + 16 * lane);
  if constexpr (kQ5) t.qh = tiled::LdStream(p + kOffQh + 16 * lane);
  const uint32_t* s0 = reinterpret_cast<const uint32_t*>(p + OffScales(kQ5) + kScaleRowBytes * g);
  const uint32_t* s8 = reinterpret_cast<const uint32_t*>(p + OffScales(kQ5) + kScaleRowBytes * (g + 8));
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    t.s0[i] = __ldg(s0 + i);
    t.s8[i] = __ldg(s8 + i);
  }
  t.d = __ldg(reinterpret_cast<const uint32_t*>(p + OffD(kQ5) + 4 * g));
  t.dmin = __ldg(reinterpret_cast<const uint32_t*>(p + OffDmin(kQ5) + 4 * g));
}

// The f16 pair (v, v) of byte b (0..3, compile-time or not) of `w`: 0x64 above the byte is
// 1024 + v exactly, minus 1024.
__device__ __forceinline__ __half2 BytePair(uint32_t w, uint32_t b0, uint32_t b1) {
  const uint32_t h = __byte_perm(w, 0x64646464u, b0 | 0x40u | (b1 << 8) | 0x4000u);
  return __hsub2(Half2(h), __float2half2_rn(1024.f));
}

}  // namespace tiled_kq_dev
#endif  // __CUDACC__

}  // namespace ds::cuda
