// Tiled IQ4_NL (issue #22): the repack at upload, the dequantization of tiled rows for the cuBLAS
// path, and the warp's share of a tile-unit as the f16 tensor-core kernel (tiled_f16.cu) loads it.
// The layout, one definition for host and device: kernels/cpu/tiled_iq4nl_layout.h. The host
// entry points for every tiled format are TileRows / DequantizeTiledRows (gemv_tiled.cuh).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"
#include "kernels/cpu/tiled_iq4nl_layout.h"
#include "kernels/cuda/tiled_q6k.cuh"

namespace ds::cuda {

// TileRows for IQ4_NL: `rows` raw rows (row bytes rb) into the tiled matrix at `dst`, already
// offset to the chunk's first tile.
absl::Status TileRowsIq4Nl(const void* raw, int64_t rows, int K, int64_t rb, void* dst,
                           cudaStream_t stream);
// DequantizeTiledRows for IQ4_NL: the values the raw dequantization gives, bit for bit.
absl::Status DequantizeTiledRowsIq4Nl(const void* tiled, int64_t row0, int64_t rows, int K,
                                      void* out, bool bf16, cudaStream_t stream);

#ifdef __CUDACC__
namespace tiled_iq4nl_dev {

// Lane (g, q)'s share of a tile-unit: its 16 index words and the 8 f16 scales of rows g, g + 8.
struct Unit {
  uint4 qs[4];
  uint4 d0, d8;
};

__device__ __forceinline__ void LoadUnit(Unit& t, const uint8_t* p, int lane) {
  const int g = lane >> 2;
#pragma unroll
  for (int i = 0; i < 4; ++i) t.qs[i] = tiled::LdStream(p + 512 * i + 16 * lane);
  t.d0 = __ldg(reinterpret_cast<const uint4*>(p + tiled_iq4nl::kOffD + 16 * g));
  t.d8 = __ldg(reinterpret_cast<const uint4*>(p + tiled_iq4nl::kOffD + 16 * (g + 8)));
}

}  // namespace tiled_iq4nl_dev
#endif  // __CUDACC__

}  // namespace ds::cuda
