// Tiled Q4_K / Q5_K: repack and dequantization (see tiled_kquant.cuh; the layout:
// kernels/cpu/tiled_kquant_layout.h).
#include "kernels/cuda/tiled_kquant.cuh"

#include "kernels/cuda/common.cuh"

namespace ds::cuda {
namespace {

using namespace tiled_kq;  // NOLINT: the layout (kernels/cpu/tiled_kquant_layout.h)

// One warp per tile-unit; lane T writes what PackLane gives it (the CPU tests pack with the same
// function). Rows past `rows` (padding of the last tile) are zero.
template <bool kQ5>
__global__ void TileRowsKquantKernel(const uint8_t* __restrict__ raw, int64_t rows, int nu,
                                     int64_t rb, uint8_t* __restrict__ dst) {
  const int64_t tu = blockIdx.x;  // tile-unit index within the chunk
  const int64_t tile = tu / nu;
  const int u = static_cast<int>(tu % nu);
  const uint8_t* blk[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = tile * kRows + r;
    blk[r] = row < rows ? raw + row * rb + static_cast<int64_t>(u) * RawBlockBytes(kQ5) : nullptr;
  }
  PackLane(blk, kQ5, threadIdx.x, dst + tu * UnitBytes(kQ5));
}

// One thread per (tile-unit, g, step, q): the 4 elements k = 16s + 4q .. +3 of rows g and g + 8,
// as the raw dequantization (DecodeLane8 in quant_decode.cuh) computes them: f32(d * sc) * q -
// f32(dmin * mn), then rounded to bf16 / f16.
template <bool kQ5>
__global__ void DequantTiledKquantKernel(const uint8_t* __restrict__ tiled, int64_t tu0,
                                         int64_t n_tu, int nu, int64_t row0, int64_t rows, int K,
                                         uint16_t* __restrict__ out, bool bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tu * 512) return;
  const auto [q, s, g, T, u, tu, tile] = tiled::DequantSlotOf(i, tu0, nu);
  const uint8_t* p = tiled + tu * UnitBytes(kQ5);
  const uint32_t qs = *reinterpret_cast<const uint32_t*>(p + QsWordOffset(T, s));
  const uint32_t qh = kQ5 ? *reinterpret_cast<const uint32_t*>(p + QhWordOffset(T, s >> 2)) : 0u;
  for (int h = 0; h < 2; ++h) {
    const int rr = g + 8 * h;
    const int64_t r = tile * kRows + rr - row0;
    if (r < 0 || r >= rows) continue;
    const uint32_t* sw = reinterpret_cast<const uint32_t*>(p + OffScales(kQ5) + kScaleRowBytes * rr);
    uint32_t sc[2], mn[2];
    UnpackScales(sw[0], sw[1], sw[2], sc, mn);
    const float d = HalfBitsToF32(*reinterpret_cast<const uint16_t*>(p + OffD(kQ5) + 4 * g + 2 * h));
    const float dmin =
        HalfBitsToF32(*reinterpret_cast<const uint16_t*>(p + OffDmin(kQ5) + 4 * g + 2 * h));
    const float scf = d * ScaleByte(sc, s >> 1), mnf = dmin * ScaleByte(mn, s >> 1);
    uint16_t v[4];
    for (int jp = 0; jp < 2; ++jp) {  // pairs (j = 0, 1) and (2, 3) of row half h
      const uint32_t bits = PairBits(qs, qh, kQ5, s, h + 2 * jp);
      for (int e = 0; e < 2; ++e) {
        const int quant = static_cast<int>((bits >> (16 * e)) & 0x3FF);
        const float x = scf * static_cast<float>(quant) - mnf;
        v[2 * jp + e] = bf16 ? F32ToBf16Bits(x) : __half_as_ushort(__float2half_rn(x));
      }
    }
    uint2 o;
    o.x = v[0] | (static_cast<uint32_t>(v[1]) << 16);
    o.y = v[2] | (static_cast<uint32_t>(v[3]) << 16);
    *reinterpret_cast<uint2*>(out + r * K + u * 256 + 16 * s + 4 * q) = o;
  }
}

}  // namespace

absl::Status TileRowsKquant(bool q5, const void* raw, int64_t rows, int K, int64_t rb, void* dst,
                            cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const int nu = K / kUnitElems;
  const int64_t n_tu = static_cast<int64_t>(CeilDiv(rows, kRows)) * nu;
  auto* kernel = q5 ? TileRowsKquantKernel<true> : TileRowsKquantKernel<false>;
  kernel<<<static_cast<unsigned>(n_tu), 32, 0, stream>>>(static_cast<const uint8_t*>(raw), rows, nu,
                                                         rb, static_cast<uint8_t*>(dst));
  return LastLaunchStatus("TileRowsKquant");
}

absl::Status DequantizeTiledRowsKquant(bool q5, const void* tiled, int64_t row0, int64_t rows,
                                       int K, void* out, bool bf16, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const int nu = K / kUnitElems;
  const int64_t t0 = row0 / kRows, t1 = (row0 + rows - 1) / kRows + 1;
  const int64_t n_tu = (t1 - t0) * nu;
  auto* kernel = q5 ? DequantTiledKquantKernel<true> : DequantTiledKquantKernel<false>;
  kernel<<<CeilDiv(n_tu * 512, 256), 256, 0, stream>>>(static_cast<const uint8_t*>(tiled), t0 * nu,
                                                       n_tu, nu, row0, rows, K,
                                                       static_cast<uint16_t*>(out), bf16);
  return LastLaunchStatus("DequantizeTiledRowsKquant");
}

}  // namespace ds::cuda
