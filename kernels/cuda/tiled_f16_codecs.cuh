// The f16 tensor-core kernel's codecs (tiled_f16.cu, TiledF16Kernel<Codec, ...>): how a warp
// loads and decodes a tile-unit of each tiled format into the A fragments of m16n8k16, and the
// unit's scales. Q6_K's layout: gemv_tiled.cuh; the others': kernels/cpu/tiled_*_layout.h and
// tiled_formats.cuh. Included by tiled_f16.cu only.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_f16.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/tiled_formats.cuh"
#include "kernels/cuda/tiled_q6k.cuh"

namespace ds::cuda::f16_codecs {

using namespace tiled;  // NOLINT: the Q6_K layout helpers (tiled_q6k.cuh)

// The f16 pair (sc, sc) of sub-block scale byte s of a row (sc16: its 16 int8 scales, with
// 0x80 already xored into every byte, i.e. sc + 128 as unsigned): 0x64 above the byte gives
// 1152 + sc exactly, minus 1152.
__device__ __forceinline__ __half2 ScalePair(const uint4& sc16, int s) {
  const uint32_t sel = (s & 3) | 0x40 | ((s & 3) << 8) | 0x4000;
  const uint32_t h = __byte_perm(Word(sc16, s >> 2), 0x64646464u, sel);
  return __hsub2(Half2(h), __float2half2_rn(1152.f));
}

// The f16 pair ((q0 - 32) * s, (q1 - 32) * s) of two unsigned 6-bit quants (bytes picked by
// `sel` from `a`): 1024 + q exactly, minus 1056 exactly, times s rounded once.
__device__ __forceinline__ uint32_t WeightPair(uint32_t a, uint32_t sel, __half2 s) {
  const __half2 h = __hsub2(Half2(__byte_perm(a, 0x64646464u, sel)), __float2half2_rn(1056.f));
  return Bits(__hmul2(h, s));
}

// How the kernel reads a tile-unit of one format: Load (the warp's 16-byte loads), Prepare (once
// per unit, after the loads arrived), Operands (the A fragment of step s: rows g and g + 8,
// k = 16s + 4q .. +3, each weight quant x sub-block scale in f16: exact up to 2048, rounded once
// above, and for Q8_0 / IQ4_NL rounded once), D (the unit's scale of rows g, g + 8). kMins
// formats (Q4_K / Q5_K, w = d sc q - dmin mn) also give the m16n8k8 A fragment of their mins
// (MinOperands: sub-blocks 2q, 2q + 1) and -64 dmin (Dmin), which the kernel multiplies with the
// activations' sub-block sums (xhs, 2^-6 scaled). kPrefetchMaxNt: up to which column form the
// next unit is loaded a unit ahead (into a second Unit's registers).
// kPairedScales: Prepare interleaves the two rows' scale bytes (below); the 64-column forms keep
// the per-row form (the interleaved one spilled 88-136 more bytes there).
template <bool kPairedScales>
struct Q6kCodecT {
  static constexpr bool kMins = false;
  static constexpr int kUnitBytes = kTileUnitBytes;
  static constexpr int kPrefetchMaxNt = 4;  // the next unit in registers up to 32 columns
  using Unit = TileUnit;
  __device__ __forceinline__ static void Load(Unit& t, const uint8_t* p, int lane) {
    LoadTileUnit(t, p, lane);
  }
  // With kPairedScales, Prepare also interleaves the two rows' scale bytes (sc + 128) by step
  // pairs: word j of (sc0, sc1) then holds (g: step 2j, g + 8: step 2j, g: step 2j + 1, g + 8:
  // step 2j + 1), so that one PRMT and one HSUB2 per step make both rows' scales (RowScales) and
  // each HMUL2 takes its row's half by an operand swizzle: per unit 8 PRMT instead of 16 PRMT and
  // 16 HSUB2. The same f16 scales, so the same bits.
  __device__ __forceinline__ static void Prepare(Unit& tu) {
    tu.qh[0] = Xor4(tu.qh[0], 0xAAAAAAAAu);  // t ^ 32 = q, the unsigned quant
    tu.qh[1] = Xor4(tu.qh[1], 0xAAAAAAAAu);
    const uint4 g0 = Xor4(tu.sc0, 0x80808080u), g8 = Xor4(tu.sc1, 0x80808080u);
    if constexpr (kPairedScales) {
      tu.sc0 = make_uint4(__byte_perm(g0.x, g8.x, 0x5140), __byte_perm(g0.x, g8.x, 0x7362),
                          __byte_perm(g0.y, g8.y, 0x5140), __byte_perm(g0.y, g8.y, 0x7362));
      tu.sc1 = make_uint4(__byte_perm(g0.z, g8.z, 0x5140), __byte_perm(g0.z, g8.z, 0x7362),
                          __byte_perm(g0.w, g8.w, 0x5140), __byte_perm(g0.w, g8.w, 0x7362));
    } else {
      tu.sc0 = g0;
      tu.sc1 = g8;
    }
  }
  // kPairedScales: (sc of row g, sc of row g + 8) at step s, from Prepare's interleaved words;
  // 0x64 above each byte is 1152 + sc exactly, minus 1152.
  __device__ __forceinline__ static __half2 RowScales(const Unit& tu, int s) {
    const uint32_t w = Word(s < 8 ? tu.sc0 : tu.sc1, (s >> 1) & 3);
    const uint32_t sel = (s & 1) ? 0x4342u : 0x4140u;
    return __hsub2(Half2(__byte_perm(w, 0x64646464u, sel)), __float2half2_rn(1152.f));
  }
  __device__ __forceinline__ static void Operands(const Unit& tu, int s, uint32_t (&A)[4]) {
    uint32_t a0, a1;  // rows g and g + 8, k = 16s + 4q .. +3, unsigned
    DecodeStepUnsigned(Word(tu.ql[s >> 2], s & 3), Word(tu.qh[s >> 3], (s & 7) >> 1), s & 1, a0, a1);
    __half2 s0, s1;
    if constexpr (kPairedScales) {
      const __half2 sp = RowScales(tu, s);
      s0 = __low2half2(sp);
      s1 = __high2half2(sp);
    } else {
      s0 = ScalePair(tu.sc0, s);
      s1 = ScalePair(tu.sc1, s);
    }
    A[0] = WeightPair(a0, 0x4140, s0);
    A[1] = WeightPair(a1, 0x4140, s1);
    A[2] = WeightPair(a0, 0x4342, s0);
    A[3] = WeightPair(a1, 0x4342, s1);
  }
  __device__ __forceinline__ static float2 D(const Unit& tu) {
    return make_float2(HalfBitsToF32(tu.d & 0xFFFF), HalfBitsToF32(tu.d >> 16));
  }
};

using Q6kCodec = Q6kCodecT<false>;

// Q4_K / Q5_K (kernels/cpu/tiled_kquant_layout.h): (1024 + quant) from the packed nibbles (and
// the 5th bit) by a mask, minus 1024, times (sc, sc): sc * quant exactly (at most 31 * 63 = 1953
// < 2048). (One HFMA2 with a -1024 sc addend gives the same bits in one instruction less, but its
// addends, hoisted by the compiler, spilled 60-92 bytes at 64 columns; this form spills none.)
template <bool kQ5>
struct KquantCodec {
  static constexpr bool kMins = true;
  static constexpr int kUnitBytes = tiled_kq::UnitBytes(kQ5);
  static constexpr int kPrefetchMaxNt = 4;
  struct Unit {
    tiled_dev::KquantUnit w;
    uint32_t sc0[2], mn0[2], sc8[2], mn8[2];  // rows g, g + 8: sub-blocks' scales and mins
  };
  __device__ __forceinline__ static void Load(Unit& t, const uint8_t* p, int lane) {
    tiled_dev::LoadKquantUnit<kQ5>(t.w, p, lane);
  }
  __device__ __forceinline__ static void Prepare(Unit& tu) {
    tiled_kq::UnpackScales(tu.w.s0[0], tu.w.s0[1], tu.w.s0[2], tu.sc0, tu.mn0);
    tiled_kq::UnpackScales(tu.w.s8[0], tu.w.s8[1], tu.w.s8[2], tu.sc8, tu.mn8);
  }
  __device__ __forceinline__ static void Operands(const Unit& tu, int s, uint32_t (&A)[4]) {
    const int j = s >> 1;  // the 32-element sub-block
    const uint32_t b = j & 3;
    const __half2 s0 = tiled_dev::BytePair(tu.sc0[j >> 2], b, b);
    const __half2 s8 = tiled_dev::BytePair(tu.sc8[j >> 2], b, b);
    const uint32_t qs = Word(tu.w.qs[s >> 2], s & 3);
    const uint32_t qh = kQ5 ? Word(tu.w.qh, s >> 2) : 0u;
#pragma unroll
    for (int p = 0; p < 4; ++p)
      A[p] = Bits(__hmul2(__hsub2(Half2(tiled_kq::PairBits(qs, qh, kQ5, s, p)), __float2half2_rn(1024.f)),
                          (p & 1) ? s8 : s0));
  }
  __device__ __forceinline__ static float2 D(const Unit& tu) {
    return make_float2(HalfBitsToF32(tu.w.d & 0xFFFF), HalfBitsToF32(tu.w.d >> 16));
  }
  // Rows g / g + 8 at k = 2q, 2q + 1 of the m16n8k8: the mins of sub-blocks 2q, 2q + 1.
  __device__ __forceinline__ static void MinOperands(const Unit& tu, int q, uint32_t (&A)[2]) {
    const uint32_t b0 = 2 * (q & 1);
    A[0] = Bits(tiled_dev::BytePair(q < 2 ? tu.mn0[0] : tu.mn0[1], b0, b0 + 1));
    A[1] = Bits(tiled_dev::BytePair(q < 2 ? tu.mn8[0] : tu.mn8[1], b0, b0 + 1));
  }
  // -64 dmin: the sums are 2^-6 of the activations' (HalfSubBlockSums).
  __device__ __forceinline__ static float2 Dmin(const Unit& tu) {
    return make_float2(-64.f * HalfBitsToF32(tu.w.dmin & 0xFFFF),
                       -64.f * HalfBitsToF32(tu.w.dmin >> 16));
  }
};

// The f16 pair (v0 * s, v1 * s) of two int8 values (bytes picked by `sel` from w, stored as
// v + 128): 0x64 above the byte is 1152 + v exactly, minus 1152, times s rounded once.
__device__ __forceinline__ uint32_t ScaledInt8Pair(uint32_t w, uint32_t sel, __half2 s) {
  const __half2 v = __hsub2(Half2(__byte_perm(w, 0x64646464u, sel)), __float2half2_rn(1152.f));
  return Bits(__hmul2(v, s));
}

// The e of a row's unit from its 8 f16 block scales (tiled_q8::UnitExponent: the largest d 2^e in
// [2^8, 2^9)), for the formats with a scale per 32-block (Q8_0, IQ4_NL).
__device__ __forceinline__ int BlockScalesExponent(const uint4& d) {
  const uint16_t h[8] = {static_cast<uint16_t>(d.x), static_cast<uint16_t>(d.x >> 16),
                         static_cast<uint16_t>(d.y), static_cast<uint16_t>(d.y >> 16),
                         static_cast<uint16_t>(d.z), static_cast<uint16_t>(d.z >> 16),
                         static_cast<uint16_t>(d.w), static_cast<uint16_t>(d.w >> 16)};
  return tiled_q8::UnitExponent(h);
}

// A row's 8 block scales d' = f16(d 2^e), two per word (blocks 2i, 2i + 1 in word i), made once
// per unit; BlockScale picks (d'_b, d'_b) for a step.
__device__ __forceinline__ uint4 ScaledBlockScales(const uint4& d, int e) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t two = Word(d, i);
    w[i] = Bits(__floats2half2_rn(tiled_q8::ScaledScale(HalfBitsToF32(two & 0xFFFFu), e),
                                  tiled_q8::ScaledScale(HalfBitsToF32(two >> 16), e)));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ __half2 BlockScale(const uint4& dp, int b) {
  return Half2(__byte_perm(Word(dp, b >> 1), 0u, (b & 1) ? 0x3232u : 0x1010u));
}

// The per-32-block scales of rows g and g + 8 (Q8_0, IQ4_NL): e per row and unit, and d' in place
// of d from Prepare on; the unit's D is 2^-e.
struct RowBlockScales {
  int e0, e8;
  __device__ __forceinline__ void Prepare(uint4& d0, uint4& d8) {
    e0 = BlockScalesExponent(d0);
    e8 = BlockScalesExponent(d8);
    d0 = ScaledBlockScales(d0, e0);
    d8 = ScaledBlockScales(d8, e8);
  }
  __device__ __forceinline__ float2 D() const {
    return make_float2(tiled_q8::ScaledScale(1.f, -e0), tiled_q8::ScaledScale(1.f, -e8));
  }
};

// The A fragment of one step of a 4-bit-index format (IQ4_XS, IQ4_NL) from its index word
// (tiled_kquant_layout.h order) and the rows' scale pairs: Iq4Lookup gives the codebook values
// at (g, j0) (g+8, j0) (g, j1) (g+8, j1), then the same at j2, j3; made f16 exactly (as v + 128)
// and scaled, one rounding each.
__device__ __forceinline__ void Iq4Operands(uint32_t w, __half2 s0, __half2 s8, uint32_t (&A)[4]) {
  const uint32_t v0 = Iq4Lookup(w & 0x0F0F0F0Fu) ^ 0x80808080u;
  const uint32_t v1 = Iq4Lookup((w >> 4) & 0x0F0F0F0Fu) ^ 0x80808080u;
  A[0] = ScaledInt8Pair(v0, 0x4240, s0);
  A[1] = ScaledInt8Pair(v0, 0x4341, s8);
  A[2] = ScaledInt8Pair(v1, 0x4240, s0);
  A[3] = ScaledInt8Pair(v1, 0x4341, s8);
}

// Q8_0 (kernels/cpu/tiled_q8_layout.h): the int8 quants made f16 exactly (0x64 above q ^ 0x80 is
// 1152 + q, minus 1152), times the block's scale d' = d 2^e in f16, rounded once per weight (the
// e of the row's unit puts its largest d' in [2^8, 2^9): nothing overflows, the large weights are
// normal numbers); the unit's D = 2^-e undoes it exactly.
struct Q8Codec {
  static constexpr bool kMins = false;
  static constexpr int kUnitBytes = tiled_q8::kUnitBytes;
  // Its unit is 40 registers: a second one spills at 32 columns (ptxas, sm_90a), so up to 16.
  static constexpr int kPrefetchMaxNt = 2;
  struct Unit {
    tiled_dev::Q8Unit w;
    RowBlockScales bs;
  };
  __device__ __forceinline__ static void Load(Unit& t, const uint8_t* p, int lane) {
    tiled_dev::LoadQ8Unit(t.w, p, lane);
  }
  __device__ __forceinline__ static void Prepare(Unit& tu) {
    tu.bs.Prepare(tu.w.d0, tu.w.d8);  // d' from here on
#pragma unroll
    for (int i = 0; i < 8; ++i) tu.w.qs[i] = Xor4(tu.w.qs[i], 0x80808080u);  // q + 128
  }
  __device__ __forceinline__ static void Operands(const Unit& tu, int s, uint32_t (&A)[4]) {
    const __half2 d0 = BlockScale(tu.w.d0, s >> 1), d8 = BlockScale(tu.w.d8, s >> 1);
    const uint32_t w0 = Word(tu.w.qs[s >> 1], 2 * (s & 1)), w8 = Word(tu.w.qs[s >> 1], 2 * (s & 1) + 1);
    A[0] = ScaledInt8Pair(w0, 0x4140, d0);
    A[1] = ScaledInt8Pair(w8, 0x4140, d8);
    A[2] = ScaledInt8Pair(w0, 0x4342, d0);
    A[3] = ScaledInt8Pair(w8, 0x4342, d8);
  }
  __device__ __forceinline__ static float2 D(const Unit& tu) { return tu.bs.D(); }
};

// IQ4_XS (kernels/cpu/tiled_iq4xs_layout.h): four indices' codebook values at once (Iq4Lookup),
// made f16 exactly, times the sub-block's ls - 32 in f16: |v (ls - 32)| <= 127 * 32, exact up to
// 2048 and rounded once above, as Q6_K's (q - 32) * sc; the unit's d in D.
struct Iq4XsCodec {
  static constexpr bool kMins = false;
  static constexpr int kUnitBytes = tiled_iq4xs::kUnitBytes;
  static constexpr int kPrefetchMaxNt = 4;
  struct Unit {
    tiled_dev::Iq4XsUnit w;
    uint32_t ls0[2], ls8[2];  // rows g, g + 8: the 8 six-bit sub-block scales, one per byte
  };
  __device__ __forceinline__ static void Load(Unit& t, const uint8_t* p, int lane) {
    tiled_dev::LoadIq4XsUnit(t.w, p, lane);
  }
  __device__ __forceinline__ static void Prepare(Unit& tu) {
    tiled_iq4xs::SubBlockScales(tu.w.sh0, tu.w.sl0, tu.ls0);
    tiled_iq4xs::SubBlockScales(tu.w.sh8, tu.w.sl8, tu.ls8);
  }
  // (ls - 32, ls - 32) of byte b of w: 0x64 above it is 1024 + ls, minus 1056.
  __device__ __forceinline__ static __half2 ScalePair(uint32_t w, uint32_t b) {
    const uint32_t h = __byte_perm(w, 0x64646464u, b | 0x40u | (b << 8) | 0x4000u);
    return __hsub2(Half2(h), __float2half2_rn(1056.f));
  }
  __device__ __forceinline__ static void Operands(const Unit& tu, int s, uint32_t (&A)[4]) {
    const int j = s >> 1;
    const __half2 s0 = ScalePair(tu.ls0[j >> 2], j & 3), s8 = ScalePair(tu.ls8[j >> 2], j & 3);
    Iq4Operands(Word(tu.w.qs[s >> 2], s & 3), s0, s8, A);
  }
  __device__ __forceinline__ static float2 D(const Unit& tu) {
    return make_float2(HalfBitsToF32(tu.w.d & 0xFFFF), HalfBitsToF32(tu.w.d >> 16));
  }
};

// IQ4_NL (kernels/cpu/tiled_iq4nl_layout.h): IQ4_XS's lookups with Q8_0's scale per 32-block:
// f16(v d'), d' = f16(d 2^e), one rounding per weight (|v| <= 127, d' < 2^9); 2^-e per unit.
struct Iq4NlCodec {
  static constexpr bool kMins = false;
  static constexpr int kUnitBytes = tiled_iq4nl::kUnitBytes;
  static constexpr int kPrefetchMaxNt = 4;
  struct Unit {
    tiled_dev::Iq4NlUnit w;
    RowBlockScales bs;
  };
  __device__ __forceinline__ static void Load(Unit& t, const uint8_t* p, int lane) {
    tiled_dev::LoadIq4NlUnit(t.w, p, lane);
  }
  __device__ __forceinline__ static void Prepare(Unit& tu) {
    tu.bs.Prepare(tu.w.d0, tu.w.d8);  // d' from here on
  }
  __device__ __forceinline__ static void Operands(const Unit& tu, int s, uint32_t (&A)[4]) {
    Iq4Operands(Word(tu.w.qs[s >> 2], s & 3), BlockScale(tu.w.d0, s >> 1),
                BlockScale(tu.w.d8, s >> 1), A);
  }
  __device__ __forceinline__ static float2 D(const Unit& tu) { return tu.bs.D(); }
};

}  // namespace ds::cuda::f16_codecs
