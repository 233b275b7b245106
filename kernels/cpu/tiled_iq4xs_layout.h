// The tiled layout of IQ4_XS matrices (issue #22): one definition for the CUDA repack and the f16
// tensor-core kernel (kernels/cuda/tiled_formats.cu, tiled_f16.cu) and for the CPU tests and
// reference (tests/kernels/cpu/tiled_iq4xs_layout_test.cc, kernels/cpu/tiled_f16_ref.h).
//
// IQ4_XS (spec/model.md §10): per 256 elements d (f16), scales_h (2 bits of each of the 8
// sub-block scales), scales_l (their low 4 bits) and 4-bit indices into the 16-value codebook;
// w = d * (ls_j - 32) * codebook[idx]. As the other tiled formats, 16-row tiles of tile-units of
// exactly the bytes of the 16 raw blocks (16 x 136 = 2176), ordered for the f16 mma fragments of
// lane T = 4g + q (rows g and g + 8, k = 16s + 4q + j):
//
//   [0, 2048)      qs: the index nibbles in tiled Q4_K's word order (tiled_kquant_layout.h:
//                  QsWordOffset, NibbleSlot), so `(word >> 4m) & 0x0F0F0F0F` are four indices:
//                  m = 0 (g, j0) (g+8, j0) (g, j1) (g+8, j1), m = 1 the same at j2, j3.
//   [2048, 2080)   scales_h of rows 0..15 (2 bytes each), verbatim.
//   [2080, 2144)   scales_l of rows 0..15 (4 bytes each), verbatim.
//   [2144, 2176)   f16 d as pairs (row g, row g + 8), g = 0..7.
#pragma once
#include <cstdint>

#include "kernels/cpu/tiled_kquant_layout.h"

namespace ds::tiled_iq4xs {

constexpr int kRows = 16;
constexpr int kBlockBytes = 136;
constexpr int kUnitBytes = kRows * kBlockBytes;
constexpr int kOffScalesH = 2048;
constexpr int kOffScalesL = 2080;
constexpr int kOffD = 2144;
static_assert(kOffD + 32 == kUnitBytes, "a tile-unit holds exactly the bytes of its raw blocks");

// The codebook index (0..15) of element e (0..255) of a raw block: sub-block b = e / 32 in
// qs[16b..16b+15] (at byte 8 of the block), elements 0..15 in the low nibbles, 16..31 high.
DS_TILE_FN int RawIndex(const uint8_t* blk, int e) {
  const int b = e >> 5, j = e & 31;
  return (blk[8 + 16 * b + (j & 15)] >> (j >= 16 ? 4 : 0)) & 0xF;
}

// What lane T of the warp that repacks one tile-unit writes: its qs words; T < 16 row T's
// scales_h and scales_l; T < 8 the d pair of rows T and T + 8. blk[r]: row r's raw block
// (nullptr for padding rows: zero).
struct IndexNibble {
  DS_TILE_FN int operator()(const uint8_t* blk, int e) const { return RawIndex(blk, e); }
};

DS_TILE_FN void PackLane(const uint8_t* const (&blk)[kRows], int T, uint8_t* unit) {
  const int g = T >> 2, q = T & 3;
  for (int s = 0; s < 16; ++s)
    *reinterpret_cast<uint32_t*>(unit + tiled_kq::QsWordOffset(T, s)) =
        tiled_kq::PackNibbleWord(blk[g], blk[g + 8], q, s, IndexNibble{});
  if (T < kRows) {
    for (int i = 0; i < 2; ++i) unit[kOffScalesH + 2 * T + i] = blk[T] ? blk[T][2 + i] : 0;
    for (int i = 0; i < 4; ++i) unit[kOffScalesL + 4 * T + i] = blk[T] ? blk[T][4 + i] : 0;
  }
  if (T < 8)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 2; ++i) {
        const uint8_t* b = blk[T + 8 * h];
        unit[kOffD + 4 * T + 2 * h + i] = b ? b[i] : 0;
      }
}

// A row's 8 six-bit sub-block scales ls_j (0..63; the weight scale is ls_j - 32) from its
// scales_h (bits 2j, 2j + 1) and scales_l (nibble j of the word), one per byte: ls[0] = j 0..3,
// ls[1] = j 4..7.
DS_TILE_FN void SubBlockScales(uint32_t scales_h, uint32_t scales_l, uint32_t (&ls)[2]) {
  const uint32_t lo = scales_l & 0x0F0F0F0Fu, hi = (scales_l >> 4) & 0x0F0F0F0Fu;
  // Nibbles in sub-block order: bytes (lo.b0, hi.b0, lo.b1, hi.b1) and (lo.b2, hi.b2, lo.b3, hi.b3).
  const uint32_t n0 = (lo & 0xFFu) | ((hi & 0xFFu) << 8) | ((lo & 0xFF00u) << 8) | ((hi & 0xFF00u) << 16);
  const uint32_t n1 = ((lo >> 16) & 0xFFu) | (((hi >> 16) & 0xFFu) << 8) | ((lo >> 8) & 0xFF0000u) |
                      (hi & 0xFF000000u);
  // The 2-bit fields of scales_h spread to bits 4..5 of bytes 0..3 (four sub-blocks per word).
  auto spread = [](uint32_t t) {
    return ((t | (t << 6) | (t << 12) | (t << 18)) & 0x03030303u) << 4;
  };
  ls[0] = n0 | spread(scales_h & 0xFFu);
  ls[1] = n1 | spread((scales_h >> 8) & 0xFFu);
}

}  // namespace ds::tiled_iq4xs
