// Device-side decoding of the GGUF weight formats (spec/model.md §10), one table entry per format.
//
// The unit of work is 256 consecutive elements of a row (one K-quant super-block, or 8 blocks of a
// 32-element format, or 256 raw floats). Lane L of a warp owns the 8 consecutive elements
// [8L, 8L+8) of a unit, so its matching activations are 8 contiguous int8 (or f32) values and
// belong to one 32-element activation block (block L/4). Every quantized format decodes its 8
// elements to the form   w_i = sc * q_i - mn   with q_i packed as 8 int8 in two 32-bit words, so
// the dot product with int8 activations is two dp4a instructions (ggml's mmvq idea, own layout).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/gguf/ggml_types.h"
#include "kernels/cuda/common.cuh"

namespace ds::cuda {

constexpr int kUnitElems = 256;

// Bytes of one 256-element unit; 0 for formats the CUDA kernels do not handle.
constexpr int UnitBytes(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 1024;
    case GgmlType::F16: return 512;
    case GgmlType::BF16: return 512;
    case GgmlType::Q8_0: return 8 * 34;
    case GgmlType::IQ4_NL: return 8 * 18;
    case GgmlType::Q4_K: return 144;
    case GgmlType::Q5_K: return 176;
    case GgmlType::Q6_K: return 210;
    case GgmlType::IQ4_XS: return 136;
    default: return 0;
  }
}
constexpr bool IsFloatType(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}
// Element granularity a row length must respect for the fallback (non-unit) paths.
constexpr int BlockElems(GgmlType t) { return GgmlBlockElems(t); }

#ifdef __CUDACC__

// 4 bytes at a 2-byte aligned address (most block layouts only guarantee that).
__device__ __forceinline__ uint32_t Ld32A2(const uint8_t* p) {
  const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint32_t>(q[0]) | (static_cast<uint32_t>(q[1]) << 16);
}
__device__ __forceinline__ uint32_t Ld32A4(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ float LdHalf(const uint8_t* p) {
  return HalfBitsToF32(*reinterpret_cast<const uint16_t*>(p));
}

// IQ4 codebook lookup of 4 nibble indices (one per byte, values 0..15) with byte_perm, which picks
// bytes of a 64-bit pair by 3-bit selectors: the low and high halves of the table are looked up
// separately and merged by bit 3 of each index.
__device__ __forceinline__ uint32_t Iq4Lookup(uint32_t idx) {
  // Table bytes in order (spec §10 codebook), packed little-endian into four words.
  constexpr uint32_t w0 = (uint32_t)(uint8_t)-127 | ((uint32_t)(uint8_t)-104 << 8) |
                          ((uint32_t)(uint8_t)-83 << 16) | ((uint32_t)(uint8_t)-65 << 24);
  constexpr uint32_t w1 = (uint32_t)(uint8_t)-49 | ((uint32_t)(uint8_t)-35 << 8) |
                          ((uint32_t)(uint8_t)-22 << 16) | ((uint32_t)(uint8_t)-10 << 24);
  constexpr uint32_t w2 = 1u | (13u << 8) | (25u << 16) | (38u << 24);
  constexpr uint32_t w3 = 53u | (69u << 8) | (89u << 16) | (113u << 24);
  const uint32_t sel = (idx & 0x7u) | ((idx >> 4) & 0x70u) | ((idx >> 8) & 0x700u) |
                       ((idx >> 12) & 0x7000u);
  const uint32_t lo = __byte_perm(w0, w1, sel);
  const uint32_t hi = __byte_perm(w2, w3, sel);
  const uint32_t m = ((idx >> 3) & 0x01010101u) * 0xFFu;  // 0xFF in bytes whose index >= 8
  return (hi & m) | (lo & ~m);
}

// K-quant 6-bit scale/min unpacking (spec §10), sub-block j in 0..7.
__device__ __forceinline__ void KScaleMin(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Decoded lane share of a unit: w_i = sc * int8(q[i]) - mn for the lane's 8 elements.
struct LaneQ {
  uint32_t q0, q1;  // 8 int8, element order little-endian
  float sc, mn;
};

template <GgmlType T>
struct UnitCodec;

// q - 32 for 4 packed 6-bit values in [0, 63] without the emulated saturating __vsubss4:
// per byte (q + 96) ^ 0x80 is q + 96 - 128 when q >= 32 and q + 96 + 128 - 256 below; the add never
// carries into the next byte (q + 96 <= 159).
__device__ __forceinline__ uint32_t Q6Center(uint32_t q) { return (q + 0x60606060u) ^ 0x80808080u; }

template <>
struct UnitCodec<GgmlType::Q6_K> {
  static constexpr bool kHasMin = false;
  // kA4: the unit starts 4-byte aligned (warp-uniform; in a row of 8-aligned rows every even unit
  // does), so ql/qh are read as single 32-bit words: 6 loads per lane instead of 10.
  template <bool kA4 = false>
  __device__ __forceinline__ static LaneQ Decode(const uint8_t* u, int lane) {
    const int n = lane >> 4, w = (lane & 15) * 8, q = w >> 5, l0 = w & 31;
    const uint8_t* ql = u + 64 * n + l0 + (q & 1) * 32;
    const uint8_t* qh = u + 128 + 32 * n + l0;
    const int ns = (q >> 1) * 4, hs = 2 * q;
    uint32_t l_0, l_1, h_0, h_1;
    if constexpr (kA4) {
      l_0 = Ld32A4(ql); l_1 = Ld32A4(ql + 4); h_0 = Ld32A4(qh); h_1 = Ld32A4(qh + 4);
    } else {
      l_0 = Ld32A2(ql); l_1 = Ld32A2(ql + 4); h_0 = Ld32A2(qh); h_1 = Ld32A2(qh + 4);
    }
    const uint32_t a0 = (l_0 >> ns) & 0x0F0F0F0Fu, a1 = (l_1 >> ns) & 0x0F0F0F0Fu;
    const uint32_t h0 = ((h_0 >> hs) & 0x03030303u) << 4;
    const uint32_t h1 = ((h_1 >> hs) & 0x03030303u) << 4;
    LaneQ r;
    r.q0 = Q6Center(a0 | h0);
    r.q1 = Q6Center(a1 | h1);
    const int8_t s = static_cast<int8_t>(u[192 + 8 * n + l0 / 16 + 2 * q]);
    r.sc = LdHalf(u + 208) * s;
    r.mn = 0.f;
    return r;
  }
};

template <>
struct UnitCodec<GgmlType::Q4_K> {
  static constexpr bool kHasMin = true;
  __device__ __forceinline__ static LaneQ Decode(const uint8_t* u, int lane) {
    const int c = lane >> 3, half = (lane >> 2) & 1, l0 = (lane & 3) * 8;
    const uint8_t* qs = u + 16 + 32 * c + l0;
    const int ns = 4 * half;
    LaneQ r;
    r.q0 = (Ld32A4(qs) >> ns) & 0x0F0F0F0Fu;
    r.q1 = (Ld32A4(qs + 4) >> ns) & 0x0F0F0F0Fu;
    int sc, mn;
    KScaleMin(u + 4, 2 * c + half, sc, mn);
    r.sc = LdHalf(u) * sc;
    r.mn = LdHalf(u + 2) * mn;
    return r;
  }
};

template <>
struct UnitCodec<GgmlType::Q5_K> {
  static constexpr bool kHasMin = true;
  __device__ __forceinline__ static LaneQ Decode(const uint8_t* u, int lane) {
    const int c = lane >> 3, half = (lane >> 2) & 1, l0 = (lane & 3) * 8;
    const uint8_t* qs = u + 48 + 32 * c + l0;
    const uint8_t* qh = u + 16 + l0;
    const int ns = 4 * half, j = 2 * c + half;
    LaneQ r;
    r.q0 = ((Ld32A4(qs) >> ns) & 0x0F0F0F0Fu) | (((Ld32A4(qh) >> j) & 0x01010101u) << 4);
    r.q1 = ((Ld32A4(qs + 4) >> ns) & 0x0F0F0F0Fu) | (((Ld32A4(qh + 4) >> j) & 0x01010101u) << 4);
    int sc, mn;
    KScaleMin(u + 4, j, sc, mn);
    r.sc = LdHalf(u) * sc;
    r.mn = LdHalf(u + 2) * mn;
    return r;
  }
};

template <>
struct UnitCodec<GgmlType::Q8_0> {
  static constexpr bool kHasMin = false;
  __device__ __forceinline__ static LaneQ Decode(const uint8_t* u, int lane) {
    const uint8_t* b = u + 34 * (lane >> 2);
    const uint8_t* qs = b + 2 + 8 * (lane & 3);
    LaneQ r;
    r.q0 = Ld32A2(qs);
    r.q1 = Ld32A2(qs + 4);
    r.sc = LdHalf(b);
    r.mn = 0.f;
    return r;
  }
};

template <>
struct UnitCodec<GgmlType::IQ4_NL> {
  static constexpr bool kHasMin = false;
  __device__ __forceinline__ static LaneQ Decode(const uint8_t* u, int lane) {
    const uint8_t* b = u + 18 * (lane >> 2);
    const int s = lane & 3;
    const uint8_t* qs = b + 2 + 8 * (s & 1);
    const int ns = 4 * (s >> 1);
    LaneQ r;
    r.q0 = Iq4Lookup((Ld32A2(qs) >> ns) & 0x0F0F0F0Fu);
    r.q1 = Iq4Lookup((Ld32A2(qs + 4) >> ns) & 0x0F0F0F0Fu);
    r.sc = LdHalf(b);
    r.mn = 0.f;
    return r;
  }
};

template <>
struct UnitCodec<GgmlType::IQ4_XS> {
  static constexpr bool kHasMin = false;
  __device__ __forceinline__ static LaneQ Decode(const uint8_t* u, int lane) {
    const int b = lane >> 2, s = lane & 3;
    const uint8_t* qs = u + 8 + 16 * b + 8 * (s & 1);
    const int ns = 4 * (s >> 1);
    LaneQ r;
    r.q0 = Iq4Lookup((Ld32A4(qs) >> ns) & 0x0F0F0F0Fu);
    r.q1 = Iq4Lookup((Ld32A4(qs + 4) >> ns) & 0x0F0F0F0Fu);
    const uint16_t sh = *reinterpret_cast<const uint16_t*>(u + 2);
    const int ls = ((u[4 + b / 2] >> (4 * (b % 2))) & 0x0F) | (((sh >> (2 * b)) & 3) << 4);
    r.sc = LdHalf(u) * (ls - 32);
    r.mn = 0.f;
    return r;
  }
};

// Float formats: the lane's 8 weights of a unit (elements [8L, 8L+8)) as loaded, 32 bytes for
// F32 and 16 for F16 / BF16 (the second half unused), and as f32. Split so that a kernel can issue
// the loads early and decode later (GemvUnitKernel's weights before its wait); DecodeFloat8 is
// the two in a row.
struct RawFloat8 {
  uint4 a, b;
};

template <GgmlType T>
__device__ __forceinline__ RawFloat8 LoadFloat8(const uint8_t* u, int lane) {
  RawFloat8 r;
  if constexpr (T == GgmlType::F32) {
    const uint4* p = reinterpret_cast<const uint4*>(u + 32 * lane);
    r.a = p[0];
    r.b = p[1];
  } else {
    r.a = *reinterpret_cast<const uint4*>(u + 16 * lane);
    r.b = make_uint4(0, 0, 0, 0);
  }
  return r;
}

template <GgmlType T>
__device__ __forceinline__ void DecodeFloat8(const RawFloat8& r, float (&w)[8]) {
  if constexpr (T == GgmlType::F32) {
    w[0] = __uint_as_float(r.a.x);
    w[1] = __uint_as_float(r.a.y);
    w[2] = __uint_as_float(r.a.z);
    w[3] = __uint_as_float(r.a.w);
    w[4] = __uint_as_float(r.b.x);
    w[5] = __uint_as_float(r.b.y);
    w[6] = __uint_as_float(r.b.z);
    w[7] = __uint_as_float(r.b.w);
  } else {
    const uint32_t words[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (T == GgmlType::F16) {
        w[2 * i] = HalfBitsToF32(static_cast<uint16_t>(words[i] & 0xFFFFu));
        w[2 * i + 1] = HalfBitsToF32(static_cast<uint16_t>(words[i] >> 16));
      } else {
        w[2 * i] = __uint_as_float(words[i] << 16);
        w[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
      }
    }
  }
}

template <GgmlType T>
__device__ __forceinline__ void DecodeFloat8(const uint8_t* u, int lane, float (&w)[8]) {
  DecodeFloat8<T>(LoadFloat8<T>(u, lane), w);
}

// Lane's 8 weights as f32 for any supported format (used by the dequant-to-bf16 kernel).
template <GgmlType T>
__device__ __forceinline__ void DecodeLane8(const uint8_t* u, int lane, float (&w)[8]) {
  if constexpr (IsFloatType(T)) {
    DecodeFloat8<T>(u, lane, w);
  } else {
    const LaneQ q = UnitCodec<T>::Decode(u, lane);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = q.sc * static_cast<float>(static_cast<int8_t>(q.q0 >> (8 * i))) - q.mn;
      w[4 + i] = q.sc * static_cast<float>(static_cast<int8_t>(q.q1 >> (8 * i))) - q.mn;
    }
  }
}

// One element `i` of a row, for rows whose length is not a multiple of 256 (slow fallback; all
// model matrices take the unit path). Decodes via the unit codec of the containing block.
template <GgmlType T>
__device__ __forceinline__ float DecodeElem(const uint8_t* row, int64_t i) {
  if constexpr (T == GgmlType::F32) return reinterpret_cast<const float*>(row)[i];
  if constexpr (T == GgmlType::F16) return HalfBitsToF32(reinterpret_cast<const uint16_t*>(row)[i]);
  if constexpr (T == GgmlType::BF16) return Bf16BitsToF32(reinterpret_cast<const uint16_t*>(row)[i]);
  if constexpr (T == GgmlType::Q8_0 || T == GgmlType::IQ4_NL) {
    // 32-element blocks: address the block directly, pretend it is lane (i%32)/8 of a unit.
    const int bb = T == GgmlType::Q8_0 ? 34 : 18;
    const uint8_t* b = row + (i / 32) * bb;
    const int e = static_cast<int>(i % 32);
    const LaneQ q = UnitCodec<T>::Decode(b, e / 8);  // lane < 4 stays inside block 0
    const uint32_t w = (e % 8) < 4 ? q.q0 : q.q1;
    return q.sc * static_cast<float>(static_cast<int8_t>(w >> (8 * (e % 4)))) - q.mn;
  } else if constexpr (!IsFloatType(T)) {
    const uint8_t* u = row + (i / 256) * UnitBytes(T);
    const int e = static_cast<int>(i % 256);
    const LaneQ q = UnitCodec<T>::Decode(u, e / 8);
    const uint32_t w = (e % 8) < 4 ? q.q0 : q.q1;
    return q.sc * static_cast<float>(static_cast<int8_t>(w >> (8 * (e % 4)))) - q.mn;
  }
  return 0.f;
}

// Calls f(std::integral_constant<GgmlType, T>{}) for the runtime type (callers: `[&](auto tag) {
// constexpr GgmlType T = decltype(tag)::value; ... }`, C++17: the sm_70 check compiles device
// code with CUDA 11.8, which has no template lambdas); returns false when unsupported.
template <typename F>
bool DispatchType(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::F32: f(std::integral_constant<GgmlType, GgmlType::F32>{}); return true;
    case GgmlType::F16: f(std::integral_constant<GgmlType, GgmlType::F16>{}); return true;
    case GgmlType::BF16: f(std::integral_constant<GgmlType, GgmlType::BF16>{}); return true;
    case GgmlType::Q8_0: f(std::integral_constant<GgmlType, GgmlType::Q8_0>{}); return true;
    case GgmlType::IQ4_NL: f(std::integral_constant<GgmlType, GgmlType::IQ4_NL>{}); return true;
    case GgmlType::Q4_K: f(std::integral_constant<GgmlType, GgmlType::Q4_K>{}); return true;
    case GgmlType::Q5_K: f(std::integral_constant<GgmlType, GgmlType::Q5_K>{}); return true;
    case GgmlType::Q6_K: f(std::integral_constant<GgmlType, GgmlType::Q6_K>{}); return true;
    case GgmlType::IQ4_XS: f(std::integral_constant<GgmlType, GgmlType::IQ4_XS>{}); return true;
    default: return false;
  }
}

#endif  // __CUDACC__

}  // namespace ds::cuda
