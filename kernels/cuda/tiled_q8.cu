// Tiled Q8_0: repack and dequantization (see tiled_q8.cuh; the layout:
// kernels/cpu/tiled_q8_layout.h).
#include "kernels/cuda/tiled_q8.cuh"

#include <cuda_fp16.h>

#include "kernels/cuda/common.cuh"

namespace ds::cuda {
namespace {

using namespace tiled_q8;  // NOLINT: the layout (kernels/cpu/tiled_q8_layout.h)

// One warp per tile-unit; lane T writes what PackLane gives it (the CPU tests pack with the same
// function). Rows past `rows` (padding of the last tile) are zero.
__global__ void TileRowsQ8Kernel(const uint8_t* __restrict__ raw, int64_t rows, int nu, int64_t rb,
                                 uint8_t* __restrict__ dst) {
  const int64_t tu = blockIdx.x;  // tile-unit index within the chunk
  const int64_t tile = tu / nu;
  const int u = static_cast<int>(tu % nu);
  const uint8_t* unit_rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = tile * kRows + r;
    unit_rows[r] = row < rows ? raw + row * rb + static_cast<int64_t>(u) * 8 * kBlockBytes : nullptr;
  }
  PackLane(unit_rows, threadIdx.x, dst + tu * kUnitBytes);
}

// One thread per (tile-unit, g, step, q): the 4 elements k = 16s + 4q .. +3 of rows g and g + 8,
// d * q as the raw dequantization computes them, rounded to bf16 / f16.
__global__ void DequantTiledQ8Kernel(const uint8_t* __restrict__ tiled, int64_t tu0, int64_t n_tu,
                                     int nu, int64_t row0, int64_t rows, int K,
                                     uint16_t* __restrict__ out, bool bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tu * 512) return;
  const auto [q, s, g, T, u, tu, tile] = tiled::DequantSlotOf(i, tu0, nu);
  const uint8_t* p = tiled + tu * kUnitBytes;
  for (int h = 0; h < 2; ++h) {
    const int rr = g + 8 * h;
    const int64_t r = tile * kRows + rr - row0;
    if (r < 0 || r >= rows) continue;
    const uint32_t w = *reinterpret_cast<const uint32_t*>(p + QsWordOffset(T, s, h));
    const float d = HalfBitsToF32(*reinterpret_cast<const uint16_t*>(p + kOffD + 16 * rr + 2 * (s >> 1)));
    uint16_t v[4];
    for (int j = 0; j < 4; ++j) {
      const float x = d * static_cast<float>(static_cast<int8_t>(w >> (8 * j)));
      v[j] = bf16 ? F32ToBf16Bits(x) : __half_as_ushort(__float2half_rn(x));
    }
    uint2 o;
    o.x = v[0] | (static_cast<uint32_t>(v[1]) << 16);
    o.y = v[2] | (static_cast<uint32_t>(v[3]) << 16);
    *reinterpret_cast<uint2*>(out + r * K + u * 256 + 16 * s + 4 * q) = o;
  }
}

}  // namespace

absl::Status TileRowsQ8(const void* raw, int64_t rows, int K, int64_t rb, void* dst,
                        cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const int nu = K / 256;
  const int64_t n_tu = static_cast<int64_t>(CeilDiv(rows, kRows)) * nu;
  TileRowsQ8Kernel<<<static_cast<unsigned>(n_tu), 32, 0, stream>>>(
      static_cast<const uint8_t*>(raw), rows, nu, rb, static_cast<uint8_t*>(dst));
  return LastLaunchStatus("TileRowsQ8");
}

absl::Status DequantizeTiledRowsQ8(const void* tiled, int64_t row0, int64_t rows, int K, void* out,
                                   bool bf16, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const int nu = K / 256;
  const int64_t t0 = row0 / kRows, t1 = (row0 + rows - 1) / kRows + 1;
  const int64_t n_tu = (t1 - t0) * nu;
  DequantTiledQ8Kernel<<<CeilDiv(n_tu * 512, 256), 256, 0, stream>>>(
      static_cast<const uint8_t*>(tiled), t0 * nu, n_tu, nu, row0, rows, K,
      static_cast<uint16_t*>(out), bf16);
  return LastLaunchStatus("DequantizeTiledRowsQ8");
}

}  // namespace ds::cuda
