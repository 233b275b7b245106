// Byte-exact block structs of the GGUF (ggml) quantized weight formats, spec/model.md §10.
//
// fp16 fields are raw IEEE-half bits (uint16_t, little-endian host). Rows inside a GGUF file are
// only guaranteed to be byte-aligned relative to these structs, so code must not dereference a
// `const BlockX*` that points into a file; copy the block out with LoadBlock() (memcpy) instead.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/gguf/ggml_types.h"

namespace ds::cpu {

static_assert(std::endian::native == std::endian::little,
              "GGUF blocks are little-endian and read by memcpy");

inline constexpr int kQK8_0 = 32;        // Q8_0 elements per block
inline constexpr int kQK4_0 = 32;        // Q4_0 elements per block (KV cache only, kv_quant.h)
inline constexpr int kQK4_NL = 32;       // IQ4_NL elements per block
inline constexpr int kQK_K = 256;        // K-quant / IQ4_XS super-block
inline constexpr int kKScaleBytes = 12;  // packed 6-bit scales + mins of Q4_K / Q5_K

// x[j] = d * qs[j]
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};

// x[j] = d * (q_j - 8); q_j (j < 16) in the low nibble of qs[j], q_{j+16} in its high nibble.
// Not a weight format here (GgmlInfo(Q4_0).supported is false): the CUDA KV cache uses it.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK4_0 / 2];
};

// x = d*sc_j*q - dmin*mn_j with 4-bit q; 8 sub-blocks of 32 with 6-bit (sc, mn) packed in scales.
struct BlockQ4K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};

// As Q4_K with a 5th bit per element in qh (bit 2c / 2c+1 of qh[l] for group c).
struct BlockQ5K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};

// x = d * scales[s] * (q - 32), q 6-bit = 4 low bits in ql + 2 high bits in qh; d comes last.
struct BlockQ6K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};

// Centred quant (q - 32, in [-32, 31]) of element e (0..255) of a Q6_K block (spec/model.md §10:
// low nibbles in ql, high 2 bits in qh, 128-element halves).
inline int Q6KCentred(const BlockQ6K& b, int e) {
  const int half = e >> 7, l = e & 127, quarter = l >> 5, l32 = l & 31;
  const uint8_t lo = b.ql[64 * half + l32 + 32 * (quarter & 1)];
  const uint8_t hi = b.qh[32 * half + l32];
  const int q = ((quarter >= 2 ? lo >> 4 : lo) & 0xF) | (((hi >> (2 * quarter)) & 3) << 4);
  return q - 32;
}

// x = d * K[nibble]; element j in low nibble of qs[j], element j+16 in the high nibble.
struct BlockIq4Nl {
  uint16_t d;
  uint8_t qs[kQK4_NL / 2];
};

// 8 sub-blocks of 32, each an IQ4_NL block whose scale is d * (ls - 32), ls 6-bit
// (low 4 bits in scales_l nibbles, high 2 bits in scales_h).
struct BlockIq4Xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};

static_assert(sizeof(BlockQ8_0) == 34 && offsetof(BlockQ8_0, qs) == 2);
static_assert(sizeof(BlockQ4_0) == 18 && offsetof(BlockQ4_0, qs) == 2);
static_assert(sizeof(BlockQ4K) == 144 && offsetof(BlockQ4K, qs) == 16);
static_assert(sizeof(BlockQ5K) == 176 && offsetof(BlockQ5K, qh) == 16 &&
              offsetof(BlockQ5K, qs) == 48);
static_assert(sizeof(BlockQ6K) == 210 && offsetof(BlockQ6K, qh) == 128 &&
              offsetof(BlockQ6K, scales) == 192 && offsetof(BlockQ6K, d) == 208);
static_assert(sizeof(BlockIq4Nl) == 18 && offsetof(BlockIq4Nl, qs) == 2);
static_assert(sizeof(BlockIq4Xs) == 136 && offsetof(BlockIq4Xs, scales_l) == 4 &&
              offsetof(BlockIq4Xs, qs) == 8);

// The structs must agree with the type table the GGUF reader uses.
static_assert(sizeof(BlockQ8_0) == GgmlInfo(GgmlType::Q8_0).block_bytes &&
              kQK8_0 == GgmlInfo(GgmlType::Q8_0).block_elems);
static_assert(sizeof(BlockQ4_0) == GgmlInfo(GgmlType::Q4_0).block_bytes &&
              kQK4_0 == GgmlInfo(GgmlType::Q4_0).block_elems);
static_assert(sizeof(BlockQ4K) == GgmlInfo(GgmlType::Q4_K).block_bytes &&
              kQK_K == GgmlInfo(GgmlType::Q4_K).block_elems);
static_assert(sizeof(BlockQ5K) == GgmlInfo(GgmlType::Q5_K).block_bytes &&
              kQK_K == GgmlInfo(GgmlType::Q5_K).block_elems);
static_assert(sizeof(BlockQ6K) == GgmlInfo(GgmlType::Q6_K).block_bytes &&
              kQK_K == GgmlInfo(GgmlType::Q6_K).block_elems);
static_assert(sizeof(BlockIq4Nl) == GgmlInfo(GgmlType::IQ4_NL).block_bytes &&
              kQK4_NL == GgmlInfo(GgmlType::IQ4_NL).block_elems);
static_assert(sizeof(BlockIq4Xs) == GgmlInfo(GgmlType::IQ4_XS).block_bytes &&
              kQK_K == GgmlInfo(GgmlType::IQ4_XS).block_elems);

// Copies block `i` of a row (any alignment) into a properly aligned struct.
template <class Block>
inline Block LoadBlock(const void* row, int64_t i) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(row) + i * static_cast<int64_t>(sizeof(Block)),
              sizeof(Block));
  return b;
}
template <class Block>
inline void StoreBlock(void* row, int64_t i, const Block& b) {
  std::memcpy(static_cast<uint8_t*>(row) + i * static_cast<int64_t>(sizeof(Block)), &b,
              sizeof(Block));
}

// (scale, min) 6-bit pair of sub-block j (0..7) of a Q4_K / Q5_K `scales` array.
inline void UnpackKScaleMin(const uint8_t* scales, int j, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *mn = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

}  // namespace ds::cpu
