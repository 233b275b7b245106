// Tiled IQ4_NL: repack and dequantization (see tiled_iq4nl.cuh; the layout:
// kernels/cpu/tiled_iq4nl_layout.h).
#include "kernels/cuda/tiled_iq4nl.cuh"

#include <cuda_fp16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace ds::cuda {
namespace {

using namespace tiled_iq4nl;  // NOLINT: the layout (kernels/cpu/tiled_iq4nl_layout.h)

// One warp per tile-unit; lane T writes what PackLane gives it (the CPU tests pack with the same
// function). Rows past `rows` (padding of the last tile) are zero.
__global__ void TileRowsIq4NlKernel(const uint8_t* __restrict__ raw, int64_t rows, int nu,
                                    int64_t rb, uint8_t* __restrict__ dst) {
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
// d * codebook[idx] as the raw dequantization computes them, rounded to bf16 / f16.
__global__ void DequantTiledIq4NlKernel(const uint8_t* __restrict__ tiled, int64_t tu0,
                                        int64_t n_tu, int nu, int64_t row0, int64_t rows, int K,
                                        uint16_t* __restrict__ out, bool bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tu * 512) return;
  const auto [q, s, g, T, u, tu, tile] = tiled::DequantSlotOf(i, tu0, nu);
  const uint8_t* p = tiled + tu * kUnitBytes;
  const uint32_t w = *reinterpret_cast<const uint32_t*>(p + tiled_kq::QsWordOffset(T, s));
  // Values at (g, j0) (g+8, j0) (g, j1) (g+8, j1), then the same at j2, j3 (the layout's order).
  const uint32_t v[2] = {Iq4Lookup(w & 0x0F0F0F0Fu), Iq4Lookup((w >> 4) & 0x0F0F0F0Fu)};
  for (int h = 0; h < 2; ++h) {
    const int rr = g + 8 * h;
    const int64_t r = tile * kRows + rr - row0;
    if (r < 0 || r >= rows) continue;
    const float d = HalfBitsToF32(*reinterpret_cast<const uint16_t*>(p + kOffD + 16 * rr + 2 * (s >> 1)));
    uint16_t o16[4];
    for (int jj = 0; jj < 4; ++jj) {
      const int8_t val = static_cast<int8_t>(v[jj >> 1] >> (8 * (h + 2 * (jj & 1))));
      const float x = d * static_cast<float>(val) - 0.f;
      o16[jj] = bf16 ? F32ToBf16Bits(x) : __half_as_ushort(__float2half_rn(x));
    }
    uint2 o;
    o.x = o16[0] | (static_cast<uint32_t>(o16[1]) << 16);
    o.y = o16[2] | (static_cast<uint32_t>(o16[3]) << 16);
    *reinterpret_cast<uint2*>(out + r * K + u * 256 + 16 * s + 4 * q) = o;
  }
}

}  // namespace

absl::Status TileRowsIq4Nl(const void* raw, int64_t rows, int K, int64_t rb, void* dst,
                           cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const int nu = K / 256;
  const int64_t n_tu = static_cast<int64_t>(CeilDiv(rows, kRows)) * nu;
  TileRowsIq4NlKernel<<<static_cast<unsigned>(n_tu), 32, 0, stream>>>(
      static_cast<const uint8_t*>(raw), rows, nu, rb, static_cast<uint8_t*>(dst));
  return LastLaunchStatus("TileRowsIq4Nl");
}

absl::Status DequantizeTiledRowsIq4Nl(const void* tiled, int64_t row0, int64_t rows, int K,
                                      void* out, bool bf16, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const int nu = K / 256;
  const int64_t t0 = row0 / kRows, t1 = (row0 + rows - 1) / kRows + 1;
  const int64_t n_tu = (t1 - t0) * nu;
  DequantTiledIq4NlKernel<<<CeilDiv(n_tu * 512, 256), 256, 0, stream>>>(
      static_cast<const uint8_t*>(tiled), t0 * nu, n_tu, nu, row0, rows, K,
      static_cast<uint16_t*>(out), bf16);
  return LastLaunchStatus("DequantizeTiledRowsIq4Nl");
}

}  // namespace ds::cuda
