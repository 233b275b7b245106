// Tiled IQ4_XS (issue #22): the repack at upload, the dequantization of tiled rows for the cuBLAS
// path, and the warp's share of a tile-unit as the f16 tensor-core kernel (tiled_f16.cu) loads it.
// The layout, one definition for host and device: kernels/cpu/tiled_iq4xs_layout.h. The host
// entry points for every tiled format are TileRows / DequantizeTiledRows (gemv_tiled.cuh).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"
#include "kernels/cpu/tiled_iq4xs_layout.h"
#include "kernels/cuda/tiled_q6k.cuh"

namespace ds::cuda {

// TileRows for IQ4_XS: `rows` raw rows (row bytes rb) into the tiled matrix at `dst`, already
// offset to the chunk's first tile.
absl::Status TileRowsIq4Xs(const void* raw, int64_t rows, int K, int64_t rb, void* dst,
                           cudaStream_t stream);
// DequantizeTiledRows for IQ4_XS: the values the raw dequantization gives, bit for bit.
absl::Status DequantizeTiledRowsIq4Xs(const void* tiled, int64_t row0, int64_t rows, int K,
                                      void* out, bool bf16, cudaStream_t stream);

#ifdef __CUDACC__
namespace tiled_iq4xs_dev {

// Lane (g, q)'s share of a tile-unit: its 16 qs words, the scales_h / scales_l of rows g and
// g + 8, and the (row g, row g + 8) pair of d.
struct Unit {
  uint4 qs[4];
  uint32_t sh0, sh8, sl0, sl8;
  uint32_t d;
};

__device__ __forceinline__ void LoadUnit(Unit& t, const uint8_t* p, int lane) {
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

}  // namespace tiled_iq4xs_dev
#endif  // __CUDACC__

}  // namespace ds::cuda
