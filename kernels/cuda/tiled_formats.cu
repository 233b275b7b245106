// The f16-kernel-only tiled formats (Q4_K, Q5_K, Q8_0, IQ4_XS, IQ4_NL): repack and dequantization
// (see tiled_formats.cuh; the layouts: kernels/cpu/tiled_*_layout.h).
#include "kernels/cuda/tiled_formats.cuh"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace ds::cuda {
namespace {

// A weight as the raw dequantization (DecodeLane8, quant_decode.cuh) computes it from the lane's
// scale, value and min, so that the tiled copy dequantizes to the same bits.
__device__ __forceinline__ float RawValue(float sc, int v, float mn) {
  return sc * static_cast<float>(v) - mn;
}

// The two codebook words of a 4-bit index word (tiled_kquant_layout.h order): v[m] byte h + 2 i is
// element j = 2m + i of row half h.
__device__ __forceinline__ void Iq4Values(uint32_t w, uint32_t (&v)[2]) {
  v[0] = Iq4Lookup(w & 0x0F0F0F0Fu);
  v[1] = Iq4Lookup((w >> 4) & 0x0F0F0F0Fu);
}
__device__ __forceinline__ int Iq4Value(const uint32_t (&v)[2], int h, int j) {
  return static_cast<int8_t>(v[j >> 1] >> (8 * (h + 2 * (j & 1))));
}

// Per format: the raw bytes of one row's unit, the tile-unit's bytes, what lane T of the repack
// writes (the layout's PackLane), and the 4 weights k = 16s + 4q .. +3 of row g + 8h of a tile-unit.
template <bool kQ5>
struct KquantFormat {
  static constexpr int kRawUnitBytes = tiled_kq::RawBlockBytes(kQ5);
  static constexpr int kUnitBytes = tiled_kq::UnitBytes(kQ5);
  __device__ static void Pack(const uint8_t* const (&rows)[16], int T, uint8_t* unit) {
    tiled_kq::PackLane(rows, kQ5, T, unit);
  }
  __device__ static void Values(const uint8_t* p, int T, int s, int g, int h, float (&x)[4]) {
    using namespace tiled_kq;
    const uint32_t qs = *reinterpret_cast<const uint32_t*>(p + QsWordOffset(T, s));
    const uint32_t qh = kQ5 ? *reinterpret_cast<const uint32_t*>(p + QhWordOffset(T, s >> 2)) : 0u;
    const uint32_t* sw = reinterpret_cast<const uint32_t*>(p + OffScales(kQ5) + kScaleRowBytes * (g + 8 * h));
    uint32_t sc[2], mn[2];
    UnpackScales(sw[0], sw[1], sw[2], sc, mn);
    const float d = HalfBitsToF32(*reinterpret_cast<const uint16_t*>(p + OffD(kQ5) + 4 * g + 2 * h));
    const float dmin = HalfBitsToF32(*reinterpret_cast<const uint16_t*>(p + OffDmin(kQ5) + 4 * g + 2 * h));
    const float scf = d * ScaleByte(sc, s >> 1), mnf = dmin * ScaleByte(mn, s >> 1);
    for (int jp = 0; jp < 2; ++jp) {  // pairs (j = 0, 1) and (2, 3) of row half h
      const uint32_t bits = PairBits(qs, qh, kQ5, s, h + 2 * jp);
      for (int e = 0; e < 2; ++e)
        x[2 * jp + e] = RawValue(scf, static_cast<int>((bits >> (16 * e)) & 0x3FF), mnf);
    }
  }
};

struct Q8Format {
  static constexpr int kRawUnitBytes = 8 * tiled_q8::kBlockBytes;
  static constexpr int kUnitBytes = tiled_q8::kUnitBytes;
  __device__ static void Pack(const uint8_t* const (&rows)[16], int T, uint8_t* unit) {
    tiled_q8::PackLane(rows, T, unit);
  }
  __device__ static void Values(const uint8_t* p, int T, int s, int g, int h, float (&x)[4]) {
    using namespace tiled_q8;
    const uint32_t w = *reinterpret_cast<const uint32_t*>(p + QsWordOffset(T, s, h));
    const float d = HalfBitsToF32(*reinterpret_cast<const uint16_t*>(p + kOffD + 16 * (g + 8 * h) + 2 * (s >> 1)));
    for (int j = 0; j < 4; ++j) x[j] = RawValue(d, static_cast<int8_t>(w >> (8 * j)), 0.f);
  }
};

struct Iq4XsFormat {
  static constexpr int kRawUnitBytes = tiled_iq4xs::kBlockBytes;
  static constexpr int kUnitBytes = tiled_iq4xs::kUnitBytes;
  __device__ static void Pack(const uint8_t* const (&rows)[16], int T, uint8_t* unit) {
    tiled_iq4xs::PackLane(rows, T, unit);
  }
  __device__ static void Values(const uint8_t* p, int T, int s, int g, int h, float (&x)[4]) {
    using namespace tiled_iq4xs;
    uint32_t v[2];
    Iq4Values(*reinterpret_cast<const uint32_t*>(p + tiled_kq::QsWordOffset(T, s)), v);
    const int rr = g + 8 * h;
    uint32_t ls[2];
    SubBlockScales(*reinterpret_cast<const uint16_t*>(p + kOffScalesH + 2 * rr),
                   *reinterpret_cast<const uint32_t*>(p + kOffScalesL + 4 * rr), ls);
    const int j = s >> 1;
    const int l = static_cast<int>((ls[j >> 2] >> (8 * (j & 3))) & 0xFF);
    const float sc = HalfBitsToF32(*reinterpret_cast<const uint16_t*>(p + kOffD + 4 * g + 2 * h)) * (l - 32);
    for (int jj = 0; jj < 4; ++jj) x[jj] = RawValue(sc, Iq4Value(v, h, jj), 0.f);
  }
};

struct Iq4NlFormat {
  static constexpr int kRawUnitBytes = 8 * tiled_iq4nl::kBlockBytes;
  static constexpr int kUnitBytes = tiled_iq4nl::kUnitBytes;
  __device__ static void Pack(const uint8_t* const (&rows)[16], int T, uint8_t* unit) {
    tiled_iq4nl::PackLane(rows, T, unit);
  }
  __device__ static void Values(const uint8_t* p, int T, int s, int g, int h, float (&x)[4]) {
    uint32_t v[2];
    Iq4Values(*reinterpret_cast<const uint32_t*>(p + tiled_kq::QsWordOffset(T, s)), v);
    const float d = HalfBitsToF32(
        *reinterpret_cast<const uint16_t*>(p + tiled_iq4nl::kOffD + 16 * (g + 8 * h) + 2 * (s >> 1)));
    for (int jj = 0; jj < 4; ++jj) x[jj] = RawValue(d, Iq4Value(v, h, jj), 0.f);
  }
};

// One warp per tile-unit; lane T writes what the layout's PackLane gives it (the CPU tests pack
// with the same function). Rows past `rows` (padding of the last tile) are zero.
template <class F>
__global__ void TileRowsKernel(const uint8_t* __restrict__ raw, int64_t rows, int nu, int64_t rb,
                               uint8_t* __restrict__ dst) {
  const int64_t tu = blockIdx.x;  // tile-unit index within the chunk
  const int64_t tile = tu / nu;
  const int u = static_cast<int>(tu % nu);
  const uint8_t* unit_rows[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int64_t row = tile * 16 + r;
    unit_rows[r] = row < rows ? raw + row * rb + static_cast<int64_t>(u) * F::kRawUnitBytes : nullptr;
  }
  F::Pack(unit_rows, threadIdx.x, dst + tu * F::kUnitBytes);
}

// One thread per (tile-unit, g, step, q): the 4 elements k = 16s + 4q .. +3 of rows g and g + 8
// (F::Values), rounded to bf16 / f16.
template <class F>
__global__ void DequantTiledKernel(const uint8_t* __restrict__ tiled, int64_t tu0, int64_t n_tu,
                                   int nu, int64_t row0, int64_t rows, int K,
                                   uint16_t* __restrict__ out, bool bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tu * 512) return;
  const auto [q, s, g, T, u, tu, tile] = tiled::DequantSlotOf(i, tu0, nu);
  const uint8_t* p = tiled + tu * F::kUnitBytes;
  for (int h = 0; h < 2; ++h) {
    const int64_t r = tile * 16 + g + 8 * h - row0;
    if (r < 0 || r >= rows) continue;
    float x[4];
    F::Values(p, T, s, g, h, x);
    uint16_t v[4];
    for (int j = 0; j < 4; ++j) v[j] = bf16 ? F32ToBf16Bits(x[j]) : __half_as_ushort(__float2half_rn(x[j]));
    uint2 o;
    o.x = v[0] | (static_cast<uint32_t>(v[1]) << 16);
    o.y = v[2] | (static_cast<uint32_t>(v[3]) << 16);
    *reinterpret_cast<uint2*>(out + r * K + u * 256 + 16 * s + 4 * q) = o;
  }
}

// f(format tag) for the format of t; false for the others.
template <class Fn>
bool ForFormat(GgmlType t, Fn&& f) {
  switch (t) {
    case GgmlType::Q4_K: f(KquantFormat<false>{}); return true;
    case GgmlType::Q5_K: f(KquantFormat<true>{}); return true;
    case GgmlType::Q8_0: f(Q8Format{}); return true;
    case GgmlType::IQ4_XS: f(Iq4XsFormat{}); return true;
    case GgmlType::IQ4_NL: f(Iq4NlFormat{}); return true;
    default: return false;
  }
}

}  // namespace

absl::Status TileRowsF16Format(GgmlType t, const void* raw, int64_t rows, int K, int64_t rb,
                               void* dst, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const int nu = K / 256;
  const int64_t n_tu = static_cast<int64_t>(CeilDiv(rows, 16)) * nu;
  const bool known = ForFormat(t, [&](auto f) {
    TileRowsKernel<decltype(f)><<<static_cast<unsigned>(n_tu), 32, 0, stream>>>(
        static_cast<const uint8_t*>(raw), rows, nu, rb, static_cast<uint8_t*>(dst));
  });
  if (!known)
    return absl::InvalidArgumentError(absl::StrCat("TileRowsF16Format: ", std::string(GgmlInfo(t).name)));
  return LastLaunchStatus("TileRowsF16Format");
}

absl::Status DequantizeTiledRowsF16Format(GgmlType t, const void* tiled, int64_t row0,
                                          int64_t rows, int K, void* out, bool bf16,
                                          cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const int nu = K / 256;
  const int64_t t0 = row0 / 16, t1 = (row0 + rows - 1) / 16 + 1;
  const int64_t n_tu = (t1 - t0) * nu;
  const bool known = ForFormat(t, [&](auto f) {
    DequantTiledKernel<decltype(f)><<<CeilDiv(n_tu * 512, 256), 256, 0, stream>>>(
        static_cast<const uint8_t*>(tiled), t0 * nu, n_tu, nu, row0, rows, K,
        static_cast<uint16_t*>(out), bf16);
  });
  if (!known)
    return absl::InvalidArgumentError(
        absl::StrCat("DequantizeTiledRowsF16Format: ", std::string(GgmlInfo(t).name)));
  return LastLaunchStatus("DequantizeTiledRowsF16Format");
}

}  // namespace ds::cuda
