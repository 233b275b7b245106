// Device helpers of the tiled Q6_K layout (gemv_tiled.cuh describes it), shared by the tiled
// column kernel (gemv_tiled.cu) and the int8 MMQ kernel (mmq.cu): both decode the same fragments
// and run the same mma, so that a (row, column) result is the same float computation in either
// kernel (mmq_cuda_test checks them bit for bit).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_tiled.cuh"

namespace ds::cuda::tiled {

constexpr int kOffQh = 2048, kOffSc = 3072, kOffD = 3328;

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// 4 bytes of 6-bit two's complement values -> int8 (sign bit 5 copied into bits 6 and 7; the
// per-byte product (a & 0x20) * 6 = 0xC0 never carries into the next byte).
__device__ __forceinline__ uint32_t SignExtend6(uint32_t a) { return a | ((a & 0x20202020u) * 6u); }

// The A fragments (rows g and g+8, k = 16s + 4q .. +3) of step s from the thread's words.
__device__ __forceinline__ void DecodeStep(uint32_t ql, uint32_t qh, int p, uint32_t& a0,
                                           uint32_t& a1) {
  const uint32_t h0 = (p ? qh : qh << 4) & 0x30303030u;
  const uint32_t h1 = (p ? qh >> 2 : qh << 2) & 0x30303030u;
  a0 = SignExtend6((ql & 0x0F0F0F0Fu) | h0);
  a1 = SignExtend6(((ql >> 4) & 0x0F0F0F0Fu) | h1);
}

// DecodeStep for weights whose qh bits were flipped to the unsigned quants q = t ^ 32 (0..63):
// no sign extension; the caller subtracts 32 * (the activations' sum) through C (MmaFrom).
__device__ __forceinline__ void DecodeStepUnsigned(uint32_t ql, uint32_t qh, int p, uint32_t& a0,
                                                   uint32_t& a1) {
  const uint32_t h0 = (p ? qh : qh << 4) & 0x30303030u;
  const uint32_t h1 = (p ? qh >> 2 : qh << 2) & 0x30303030u;
  a0 = (ql & 0x0F0F0F0Fu) | h0;
  a1 = ((ql >> 4) & 0x0F0F0F0Fu) | h1;
}

__device__ __forceinline__ uint4 Xor4(uint4 v, uint32_t m) {
  return {v.x ^ m, v.y ^ m, v.z ^ m, v.w ^ m};
}

// Weights are streamed once per step: 16-byte loads that do not allocate in L1, which keeps
// L1 for the activations every warp re-reads.
__device__ __forceinline__ uint4 LdStream(const uint8_t* p) {
  uint4 v;
#if __CUDA_ARCH__ >= 800
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
#else
  v = __ldg(reinterpret_cast<const uint4*>(p));
#endif
  return v;
}

// What thread i of a tiled dequantization (any tiled format: 16 x 256 tile-units, 512 threads
// each) handles: tile-unit tu (unit u of tile `tile`), lane T = 4g + q's step s. Thread order q,
// s, g (q fastest): 64 consecutive threads write one row's 512 contiguous bytes.
struct DequantSlot {
  int q, s, g, T, u;
  int64_t tu, tile;
};
__device__ __forceinline__ DequantSlot DequantSlotOf(int64_t i, int64_t tu0, int nu) {
  DequantSlot d;
  d.q = static_cast<int>(i & 3);
  d.s = static_cast<int>((i >> 2) & 15);
  d.g = static_cast<int>((i >> 6) & 7);
  d.T = 4 * d.g + d.q;
  d.tu = tu0 + (i >> 9);
  d.u = static_cast<int>(d.tu % nu);
  d.tile = d.tu / nu;
  return d;
}

struct TileUnit {
  uint4 ql[4], qh[2], sc0, sc1;
  uint32_t d;
};

__device__ __forceinline__ void LoadTileUnit(TileUnit& t, const uint8_t* p, int lane) {
  const int g = lane >> 2;
#pragma unroll
  for (int i = 0; i < 4; ++i) t.ql[i] = LdStream(p + 512 * i + 16 * lane);
#pragma unroll
  for (int i = 0; i < 2; ++i) t.qh[i] = LdStream(p + kOffQh + 512 * i + 16 * lane);
  t.sc0 = __ldg(reinterpret_cast<const uint4*>(p + kOffSc + 16 * g));
  t.sc1 = __ldg(reinterpret_cast<const uint4*>(p + kOffSc + 16 * (g + 8)));
  t.d = __ldg(reinterpret_cast<const uint32_t*>(p + kOffD + 4 * g));
}

constexpr int kMmaBias = 0x4B400000;  // the bits of 1.5 * 2^23

// As Mma (below), with C initialised to c0 / c1 for the thread's columns 2q / 2q + 1 (both rows):
// kMmaBias - 32 * (the column's activation sum) turns the unsigned weights' sum into the centred
// one. f = float(bits of D) - 1.5 * 2^23, exact while the centred |sum| < 2^22.
__device__ __forceinline__ void MmaFrom(uint32_t a0, uint32_t a1, uint32_t b, int c0, int c1,
                                        float (&f)[4]) {
  int d0, d1, d2, d3;
#if __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%7,%8,%9,%10};"
      : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
      : "r"(a0), "r"(a1), "r"(b), "r"(c0), "r"(c1), "r"(c0), "r"(c1));
#else
  d0 = d1 = d2 = d3 = 0;
  __trap();
#endif
  f[0] = __int_as_float(d0) - 12582912.f;
  f[1] = __int_as_float(d1) - 12582912.f;
  f[2] = __int_as_float(d2) - 12582912.f;
  f[3] = __int_as_float(d3) - 12582912.f;
}

// D = A(16x16 s8) * B(16x8 s8) + C, C initialised to the bit pattern of 1.5 * 2^23: the int32
// result read as a float minus 1.5 * 2^23 is the exact sum (|sum| <= 16 * 32 * 127 < 2^22), an
// add instead of the quarter-rate I2F.
__device__ __forceinline__ void Mma(uint32_t a0, uint32_t a1, uint32_t b, float (&f)[4]) {
  int c0 = kMmaBias, c1 = kMmaBias, c2 = kMmaBias, c3 = kMmaBias;
#if __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+r"(c0), "+r"(c1), "+r"(c2), "+r"(c3)
      : "r"(a0), "r"(a1), "r"(b));
#else
  __trap();  // never launched below sm_80 (TiledAvailable)
#endif
  f[0] = __int_as_float(c0) - 12582912.f;
  f[1] = __int_as_float(c1) - 12582912.f;
  f[2] = __int_as_float(c2) - 12582912.f;
  f[3] = __int_as_float(c3) - 12582912.f;
}

}  // namespace ds::cuda::tiled
