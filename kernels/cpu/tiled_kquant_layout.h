// The tiled layout of Q4_K and Q5_K matrices (issue #22): one definition of where every bit goes,
// for the CUDA repack and the f16 tensor-core kernel that reads it (kernels/cuda/tiled_formats.cuh,
// tiled_f16.cu) and for the CPU tests that check the layout against the raw GGUF blocks
// (tests/kernels/cpu/tiled_kquant_layout_test.cc). Pure integer code, host and device alike.
//
// Like tiled Q6_K (kernels/cuda/gemv_tiled.cuh) a matrix [M, K] becomes tiles of 16 rows (M
// rounded up, padding rows zero), each a run of K/256 tile-units, tile-major, and a tile-unit
// holds exactly the bytes of its 16 raw blocks (Q4_K 16 x 144 = 2304, Q5_K 16 x 176 = 2816),
// reordered so that thread T = 4g + q of a warp loads its operands of the f16 `mma.m16n8k16`
// with 16-byte loads: rows g and g + 8, k = 16s + 4q + j (j = 0..3) of step s = 0..15 (the f16
// fragment's positions 2q, 2q + 1 hold j = 0, 1 and 2q + 8, 2q + 9 hold j = 2, 3, as for Q6_K).
//
//   [0, 2048)       qs: at 512 (s / 4) + 16 T + 4 (s % 4) the word of step s: the 4-bit quant of
//                   (row half h = 0 for row g, 1 for g + 8; j) in nibble NibbleSlot(h, j), i.e.
//                   nibbles 0..3 = (g, 0) (g, 2) (g+8, 0) (g+8, 2), 4..7 = the same with j + 1:
//                   `(word >> 4 (2h + j / 2)) & 0x000F000F` is one f16 pair's two quants.
//   Q5_K: [2048, 2560)  qh: at 2048 + 16 T + 4 i the word of steps 4i..4i+3: the 5th bit of the
//                   element of nibble n of step s = 4i + t at bit 16 (n / 4) + 4t + n % 4.
//   [sc, sc + 192)  the 12 GGUF scale bytes of each of the 16 rows (row r at sc + 12 r), verbatim
//                   (sc = 2048 for Q4_K, 2560 for Q5_K).
//   [sc + 192, +32) f16 d as pairs (row g, row g + 8), g = 0..7; then [+32, +64) dmin likewise.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DS_TILE_FN __host__ __device__ inline
#else
#define DS_TILE_FN inline
#endif

namespace ds::tiled_kq {

constexpr int kRows = 16;
constexpr int kUnitElems = 256;
constexpr int kOffQh = 2048;  // Q5_K only
constexpr int kScaleRowBytes = 12;

DS_TILE_FN constexpr int RawBlockBytes(bool q5) { return q5 ? 176 : 144; }
DS_TILE_FN constexpr int UnitBytes(bool q5) { return kRows * RawBlockBytes(q5); }
DS_TILE_FN constexpr int OffScales(bool q5) { return q5 ? 2560 : 2048; }
DS_TILE_FN constexpr int OffD(bool q5) { return OffScales(q5) + kRows * kScaleRowBytes; }
DS_TILE_FN constexpr int OffDmin(bool q5) { return OffD(q5) + 32; }
static_assert(OffDmin(false) + 32 == UnitBytes(false) && OffDmin(true) + 32 == UnitBytes(true),
              "a tile-unit holds exactly the bytes of its 16 raw blocks");

// Byte offsets in a tile-unit of thread T's qs word of step s and its qh word i.
DS_TILE_FN constexpr int QsWordOffset(int T, int s) { return 512 * (s >> 2) + 16 * T + 4 * (s & 3); }
DS_TILE_FN constexpr int QhWordOffset(int T, int i) { return kOffQh + 16 * T + 4 * i; }

// The nibble of (row half h, j) in a step's qs word.
DS_TILE_FN constexpr int NibbleSlot(int h, int j) { return 4 * (j & 1) + 2 * h + (j >> 1); }

// The quant (Q4_K 0..15, Q5_K 0..31) of element e (0..255) of a raw GGUF block (spec/model.md
// §10): 64-element chunk c = e / 64 in qs[32c..32c+31], low nibbles first; Q5_K's 5th bit is bit
// e / 32 of qh[e % 32].
DS_TILE_FN int RawQuant(const uint8_t* blk, bool q5, int e) {
  const int c = e >> 6, l32 = e & 31;
  const uint8_t* qs = blk + (q5 ? 48 : 16);
  int q = (qs[32 * c + l32] >> ((e & 32) ? 4 : 0)) & 0xF;
  if (q5) q |= ((blk[16 + l32] >> (e >> 5)) & 1) << 4;
  return q;
}

// Thread (g, q)'s word of step s in this nibble order from the raw blocks of rows g and g + 8
// (nullptr: padding), nibble(b, e) giving element e's 4 bits: shared by the 4-bit formats whose
// tiles use this word order (IQ4_XS, IQ4_NL).
template <class Nibble>
DS_TILE_FN uint32_t PackNibbleWord(const uint8_t* blk_g, const uint8_t* blk_g8, int q, int s,
                                   const Nibble& nibble) {
  uint32_t w = 0;
  for (int h = 0; h < 2; ++h) {
    const uint8_t* b = h ? blk_g8 : blk_g;
    if (b == nullptr) continue;
    for (int j = 0; j < 4; ++j)
      w |= static_cast<uint32_t>(nibble(b, 16 * s + 4 * q + j) & 0xF) << (4 * NibbleSlot(h, j));
  }
  return w;
}

// The low 4 bits of a Q4_K / Q5_K quant, as PackNibbleWord takes them.
struct KquantNibble {
  bool q5;
  DS_TILE_FN int operator()(const uint8_t* blk, int e) const { return RawQuant(blk, q5, e); }
};

// Thread (g, q)'s qs word of step s from the raw blocks of rows g and g + 8 (nullptr: padding).
DS_TILE_FN uint32_t PackQsWord(const uint8_t* blk_g, const uint8_t* blk_g8, bool q5, int q, int s) {
  return PackNibbleWord(blk_g, blk_g8, q, s, KquantNibble{q5});
}

// Thread (g, q)'s Q5_K qh word i (steps 4i..4i+3).
DS_TILE_FN uint32_t PackQhWord(const uint8_t* blk_g, const uint8_t* blk_g8, int q, int i) {
  uint32_t w = 0;
  for (int t = 0; t < 4; ++t)
    for (int h = 0; h < 2; ++h) {
      const uint8_t* b = h ? blk_g8 : blk_g;
      if (b == nullptr) continue;
      for (int j = 0; j < 4; ++j) {
        const int n = NibbleSlot(h, j);
        const uint32_t bit = (RawQuant(b, true, 16 * (4 * i + t) + 4 * q + j) >> 4) & 1;
        w |= bit << (16 * (n >> 2) + 4 * t + (n & 3));
      }
    }
  return w;
}

// Pair p of step s as the bits of an f16 pair (1024 + quant of the first element, 1024 + quant
// of the second): p = 0 / 1: rows g / g + 8 at j = 0, 1 (the A fragment's a0 / a1), p = 2 / 3:
// at j = 2, 3 (a2 / a3). 0x6400 is the f16 1024, whose ulp is 1: a quant below 1024 in its
// mantissa is exact.
DS_TILE_FN uint32_t PairBits(uint32_t qs_word, uint32_t qh_word, bool q5, int s, int p) {
  const int slot = 2 * (p & 1) + (p >> 1);  // nibble of the first element (the second: + 4)
  uint32_t v = ((qs_word >> (4 * slot)) & 0x000F000Fu) | 0x64006400u;
  if (q5) v |= ((qh_word >> (4 * (s & 3) + slot)) & 0x00010001u) << 4;
  return v;
}

// The 12 scale bytes of a row (as three little-endian words) as the 6-bit scales sc[j] and mins
// mn[j] of its 8 sub-blocks, one per byte: sc[0] = bytes j = 0..3, sc[1] = j = 4..7 (GGUF's
// get_scale_min_k4, four sub-blocks per operation).
DS_TILE_FN void UnpackScales(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t (&sc)[2],
                             uint32_t (&mn)[2]) {
  sc[0] = w0 & 0x3F3F3F3Fu;
  mn[0] = w1 & 0x3F3F3F3Fu;
  sc[1] = (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
  mn[1] = ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
}

// Byte j (sub-block 0..7) of an UnpackScales pair.
DS_TILE_FN int ScaleByte(const uint32_t (&v)[2], int j) { return (v[j >> 2] >> (8 * (j & 3))) & 0xFF; }

// What thread T of the warp that repacks one tile-unit writes into it (`unit`, 4-byte aligned):
// its qs (and Q5_K qh) words; T < 16 the scale bytes of row T, T < 8 the d and dmin pairs of rows
// T and T + 8. blk[r]: row r's raw block of this unit (nullptr for padding rows, which become
// zero). The CUDA repack runs it in every lane (kernels/cuda/tiled_formats.cu), the CPU tests over
// all 32.
DS_TILE_FN void PackLane(const uint8_t* const (&blk)[kRows], bool q5, int T, uint8_t* unit) {
  const int g = T >> 2, q = T & 3;
  for (int s = 0; s < 16; ++s)
    *reinterpret_cast<uint32_t*>(unit + QsWordOffset(T, s)) = PackQsWord(blk[g], blk[g + 8], q5, q, s);
  if (q5)
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<uint32_t*>(unit + QhWordOffset(T, i)) = PackQhWord(blk[g], blk[g + 8], q, i);
  if (T < kRows)
    for (int b = 0; b < kScaleRowBytes; ++b)
      unit[OffScales(q5) + kScaleRowBytes * T + b] = blk[T] ? blk[T][4 + b] : 0;
  if (T < 8) {
    for (int f = 0; f < 2; ++f) {  // d (bytes 0, 1 of a raw block), dmin (2, 3)
      const int off = (f ? OffDmin(q5) : OffD(q5)) + 4 * T;
      for (int h = 0; h < 2; ++h) {
        const uint8_t* b = blk[T + 8 * h];
        unit[off + 2 * h] = b ? b[2 * f] : 0;
        unit[off + 2 * h + 1] = b ? b[2 * f + 1] : 0;
      }
    }
  }
}

}  // namespace ds::tiled_kq
