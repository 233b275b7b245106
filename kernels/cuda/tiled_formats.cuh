// The tiled formats the f16 tensor-core kernel alone multiplies (issue #22): Q4_K, Q5_K, Q8_0,
// IQ4_XS, IQ4_NL. Their repack at upload, the dequantization of tiled rows for the cuBLAS path
// (tiled_formats.cu), and each format's share of a tile-unit as a warp of the kernel
// (tiled_f16.cu) loads it. The layouts, one definition each for host and device:
// kernels/cpu/tiled_*_layout.h. The host entry points for every tiled format (Q6_K's included)
// are TileRows / DequantizeTiledRows (gemv_tiled.cuh), which call the two below for these.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"
#include "kernels/cpu/tiled_iq4nl_layout.h"
#include "kernels/cpu/tiled_iq4xs_layout.h"
#include "kernels/cpu/tiled_kquant_layout.h"
#include "kernels/cpu/tiled_q8_layout.h"
#include "kernels/cuda/mma_f16.cuh"
#include "kernels/cuda/tiled_q6k.cuh"

namespace ds::cuda {

// TileRows for one of these formats: `rows` raw rows (row bytes rb) into the tiled matrix at
// `dst`, already offset to the chunk's first tile.
absl::Status TileRowsF16Format(GgmlType t, const void* raw, int64_t rows, int K, int64_t rb,
                               void* dst, cudaStream_t stream);
// DequantizeTiledRows for one of these formats: the values the raw dequantization gives, bit for
// bit.
absl::Status DequantizeTiledRowsF16Format(GgmlType t, const void* tiled, int64_t row0,
                                          int64_t rows, int K, void* out, bool bf16,
                                          cudaStream_t stream);

#ifdef __CUDACC__
namespace tiled_dev {

// Q4_K / Q5_K: lane (g, q)'s qs words (16 steps), its Q5_K qh words, the 12 scale bytes of rows g
// and g + 8, and the (row g, row g + 8) pairs of d and dmin.
struct KquantUnit {
  uint4 qs[4];
  uint4 qh;
  uint32_t s0[3], s8[3];
  uint32_t d, dmin;
};

template <bool kQ5>
__device__ __forceinline__ void LoadKquantUnit(KquantUnit& t, const uint8_t* p, int lane) {
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

// Q8_0: lane (g, q)'s 32 qs words (uint4 i: steps 2i, 2i + 1 of rows g, g + 8) and the 8 f16
// scales of rows g and g + 8.
struct Q8Unit {
  uint4 qs[8];
  uint4 d0, d8;
};

// The 8 f16 block scales of rows g and g + 8 of a unit that keeps each row's at off_d + 16 r.
__device__ __forceinline__ void LoadRowBlockScales(const uint8_t* p, int off_d, int g, uint4& d0,
                                                   uint4& d8) {
  d0 = __ldg(reinterpret_cast<const uint4*>(p + off_d + 16 * g));
  d8 = __ldg(reinterpret_cast<const uint4*>(p + off_d + 16 * (g + 8)));
}

__device__ __forceinline__ void LoadQ8Unit(Q8Unit& t, const uint8_t* p, int lane) {
#pragma unroll
  for (int i = 0; i < 8; ++i) t.qs[i] = tiled::LdStream(p + 512 * i + 16 * lane);
  LoadRowBlockScales(p, tiled_q8::kOffD, lane >> 2, t.d0, t.d8);
}

// IQ4_XS: lane (g, q)'s 16 index words, the scales_h / scales_l of rows g and g + 8, their d pair.
struct Iq4XsUnit {
  uint4 qs[4];
  uint32_t sh0, sh8, sl0, sl8;
  uint32_t d;
};

__device__ __forceinline__ void LoadIq4XsUnit(Iq4XsUnit& t, const uint8_t* p, int lane) {
  using namespace tiled_iq4xs;
  const int g = lane >> 2;
#pragma unroll
  for (int i = 0; i < 4; ++i) t.qs[i] = tiled::LdStream(p + 512 * i + 16 * lane);
  t.sh0 = __ldg(reinterpret_cast<const uint16_t*>(p + kOffScalesH + 2 * g));
  t.sh8 = __ldg(reinterpret_cast<const uint16_t*>(p + kOffScalesH + 2 * (g + 8)));
  t.sl0 = __ldg(reinterpret_cast<const uint32_t*>(p + kOffScalesL + 4 * g));
  t.sl8 = __ldg(reinterpret_cast<const uint32_t*>(p + kOffScalesL + 4 * (g + 8)));
  t.d = __ldg(reinterpret_cast<const uint32_t*>(p + kOffD + 4 * g));
}

// IQ4_NL: lane (g, q)'s 16 index words and the 8 f16 scales of rows g, g + 8.
struct Iq4NlUnit {
  uint4 qs[4];
  uint4 d0, d8;
};

__device__ __forceinline__ void LoadIq4NlUnit(Iq4NlUnit& t, const uint8_t* p, int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) t.qs[i] = tiled::LdStream(p + 512 * i + 16 * lane);
  LoadRowBlockScales(p, tiled_iq4nl::kOffD, lane >> 2, t.d0, t.d8);
}

// The f16 pair (v, v) of byte b of `w` (0x64 above the byte is 1024 + v exactly, minus 1024).
__device__ __forceinline__ __half2 BytePair(uint32_t w, uint32_t b0, uint32_t b1) {
  const uint32_t h = __byte_perm(w, 0x64646464u, b0 | 0x40u | (b1 << 8) | 0x4000u);
  return __hsub2(Half2(h), __float2half2_rn(1024.f));
}

}  // namespace tiled_dev
#endif  // __CUDACC__

}  // namespace ds::cuda
