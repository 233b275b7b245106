// The tiled layout of Q8_0 matrices (issue #22): one definition for the CUDA repack and the f16
// tensor-core kernel (kernels/cuda/tiled_formats.cu, tiled_f16.cu) and for the CPU tests and reference
// (tests/kernels/cpu/tiled_q8_layout_test.cc, kernels/cpu/tiled_f16_ref.h). Host and device alike.
//
// As the other tiled formats (kernels/cuda/gemv_tiled.cuh): 16-row tiles of 256-element
// tile-units, tile-major, exactly the bytes of the 16 x 8 raw blocks (16 x 8 x 34 = 4352), ordered
// for the f16 `mma.m16n8k16` fragments of lane T = 4g + q (rows g and g + 8, k = 16s + 4q + j):
//
//   [0, 4096)     qs: at 512 i + 16 T four words: row g of step 2i, row g + 8 of step 2i, row g
//                 of step 2i + 1, row g + 8 of step 2i + 1; a word = the 4 int8 quants j = 0..3.
//   [4096, 4352)  the 8 f16 block scales d of each row (row r at 4096 + 16 r), verbatim.
//
// The kernel multiplies f16(q * d'_b) with d'_b = d_b * 2^e, e per (row, unit) such that the
// row's largest d' lies in [2^8, 2^9) (127 * 2^9 < 65504: no weight overflows, and none of the
// large ones is subnormal), and applies 2^-e once per unit: UnitExponent and ScaledScale below.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DS_TILE_Q8_FN __host__ __device__ inline
#else
#define DS_TILE_Q8_FN inline
#endif

namespace ds::tiled_q8 {

constexpr int kRows = 16;
constexpr int kBlockBytes = 34;  // GGUF block_q8_0: f16 d, int8 qs[32]
constexpr int kUnitBytes = kRows * 8 * kBlockBytes;
constexpr int kOffD = 4096;

// Byte offset in a tile-unit of lane T's word of step s for row half h (0: row g, 1: g + 8).
DS_TILE_Q8_FN constexpr int QsWordOffset(int T, int s, int h) {
  return 512 * (s >> 1) + 16 * T + 4 * (2 * (s & 1) + h);
}

// Thread (g, q)'s word of step s, row half h, from the unit's raw blocks of that row (8 blocks of
// 34 bytes; nullptr: padding).
DS_TILE_Q8_FN uint32_t PackQsWord(const uint8_t* unit_row, int q, int s) {
  if (unit_row == nullptr) return 0;
  const int k = 16 * s + 4 * q;  // 4 elements of one 32-block
  const uint8_t* b = unit_row + (k >> 5) * kBlockBytes + 2 + (k & 31);
  return static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) |
         (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24);
}

// What lane T of the warp that repacks one tile-unit writes: its 32 qs words; T < 16 the 8 scales
// of row T. rows[r]: row r's 8 raw blocks of this unit (nullptr for padding rows: zero).
DS_TILE_Q8_FN void PackLane(const uint8_t* const (&rows)[kRows], int T, uint8_t* unit) {
  const int g = T >> 2, q = T & 3;
  for (int s = 0; s < 16; ++s)
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<uint32_t*>(unit + QsWordOffset(T, s, h)) = PackQsWord(rows[g + 8 * h], q, s);
  if (T < kRows)
    for (int b = 0; b < 8; ++b)
      for (int i = 0; i < 2; ++i)
        unit[kOffD + 16 * T + 2 * b + i] = rows[T] ? rows[T][b * kBlockBytes + i] : 0;
}

// e for a row's 8 f16 scale bits: the largest |d| times 2^e lies in [2^8, 2^9); 0 when all are
// zero. From the bits alone (the largest magnitude is the largest of bits & 0x7FFF): a normal d
// with exponent field E lies in [2^(E-15), 2^(E-14)); a subnormal one m 2^-24 in [2^(p-24),
// 2^(p-23)) with p the top bit of m. NaN / inf scales are not handled (no quantizer writes them).
DS_TILE_Q8_FN int UnitExponent(const uint16_t (&d)[8]) {
  uint32_t m = 0;
  for (int b = 0; b < 8; ++b) {
    const uint32_t a = d[b] & 0x7FFFu;
    m = a > m ? a : m;
  }
  if (m == 0) return 0;
  const int E = static_cast<int>(m >> 10);
  if (E > 0) return 23 - E;
  int p = 0;
  while ((m >> (p + 1)) != 0) ++p;
  return 32 - p;
}

// d * 2^e as f32 (exact: a power-of-two product of an f16 value), for f16 rounding by the caller;
// 2^-e, the unit's factor, is ScaledScale(1, -e).
DS_TILE_Q8_FN float ScaledScale(float d, int e) {
  // 2^e as f32 bits: e is in [-7, 32], well inside f32's exponents.
  const uint32_t bits = static_cast<uint32_t>(127 + e) << 23;
#if defined(__CUDA_ARCH__)
  return d * __uint_as_float(bits);
#else
  float p;
  std::memcpy(&p, &bits, 4);
  return d * p;
#endif
}

}  // namespace ds::tiled_q8
