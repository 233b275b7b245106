// The tiled layout of IQ4_NL matrices (issue #22): one definition for the CUDA repack and the f16
// tensor-core kernel (kernels/cuda/tiled_formats.cu, tiled_f16.cu) and for the CPU tests and
// reference (tests/kernels/cpu/tiled_iq4nl_layout_test.cc, kernels/cpu/tiled_f16_ref.h).
//
// IQ4_NL (spec/model.md §10): blocks of 32 elements, f16 d and 4-bit indices into the 16-value
// codebook; w = d * codebook[idx]. Tile-units of 16 rows x 256 elements hold exactly the bytes of
// their 16 x 8 raw blocks (2304):
//
//   [0, 2048)     the index nibbles in tiled Q4_K's word order (tiled_kquant_layout.h), as IQ4_XS.
//   [2048, 2304)  the 8 f16 block scales d of each row (row r at 2048 + 16 r), verbatim.
//
// The kernel multiplies f16(codebook[idx] * d') with d' = f16(d * 2^e), e per (row, unit) as for
// Q8_0 (tiled_q8_layout.h: UnitExponent, ScaledScale; 127 * 2^9 < 65504 holds here too), and
// applies 2^-e once per unit.
#pragma once
#include <cstdint>

#include "kernels/cpu/tiled_iq4xs_layout.h"
#include "kernels/cpu/tiled_kquant_layout.h"
#include "kernels/cpu/tiled_q8_layout.h"

namespace ds::tiled_iq4nl {

constexpr int kRows = 16;
constexpr int kBlockBytes = 18;  // GGUF block_iq4_nl: f16 d, qs[16]
constexpr int kUnitBytes = kRows * 8 * kBlockBytes;
constexpr int kOffD = 2048;
static_assert(kOffD + kRows * 16 == kUnitBytes, "a tile-unit holds exactly its raw blocks' bytes");

// The codebook index of element e (0..255) of a row's unit (its 8 raw blocks): block b = e / 32,
// elements 0..15 in the low nibbles of qs, 16..31 in the high ones.
DS_TILE_FN int RawIndex(const uint8_t* unit_row, int e) {
  const int b = e >> 5, j = e & 31;
  return (unit_row[kBlockBytes * b + 2 + (j & 15)] >> (j >= 16 ? 4 : 0)) & 0xF;
}

struct IndexNibble {
  DS_TILE_FN int operator()(const uint8_t* unit_row, int e) const { return RawIndex(unit_row, e); }
};

// What lane T of the warp that repacks one tile-unit writes: its qs words; T < 16 the 8 scales of
// row T. rows[r]: row r's 8 raw blocks of this unit (nullptr for padding rows: zero).
DS_TILE_FN void PackLane(const uint8_t* const (&rows)[kRows], int T, uint8_t* unit) {
  const int g = T >> 2, q = T & 3;
  for (int s = 0; s < 16; ++s)
    *reinterpret_cast<uint32_t*>(unit + tiled_kq::QsWordOffset(T, s)) =
        tiled_kq::PackNibbleWord(rows[g], rows[g + 8], q, s, IndexNibble{});
  if (T < kRows)
    for (int b = 0; b < 8; ++b)
      for (int i = 0; i < 2; ++i)
        unit[kOffD + 16 * T + 2 * b + i] = rows[T] ? rows[T][kBlockBytes * b + i] : 0;
}

}  // namespace ds::tiled_iq4nl
