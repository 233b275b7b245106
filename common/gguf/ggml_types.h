// The ggml tensor types deltaserve knows, as one constexpr table: block size (elements) and block
// bytes. Dequantization / dot products per type live in kernels/cpu/quant.h (same table order).
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace ds {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  IQ4_XS = 23,
  BF16 = 30,
};

struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;
  int block_elems;   // elements per block along ne0
  int block_bytes;   // bytes per block
  bool supported;    // deltaserve can compute with it (dequant + dot)
};

inline constexpr GgmlTypeInfo kGgmlTypes[] = {
    {GgmlType::F32, "F32", 1, 4, true},
    {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", 32, 18, false},
    {GgmlType::Q4_1, "Q4_1", 32, 20, false},
    {GgmlType::Q5_0, "Q5_0", 32, 22, false},
    {GgmlType::Q5_1, "Q5_1", 32, 24, false},
    {GgmlType::Q8_0, "Q8_0", 32, 34, true},
    {GgmlType::Q2_K, "Q2_K", 256, 84, false},
    {GgmlType::Q3_K, "Q3_K", 256, 110, false},
    {GgmlType::Q4_K, "Q4_K", 256, 144, true},
    {GgmlType::Q5_K, "Q5_K", 256, 176, true},
    {GgmlType::Q6_K, "Q6_K", 256, 210, true},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18, true},
    {GgmlType::IQ4_XS, "IQ4_XS", 256, 136, true},
    {GgmlType::BF16, "BF16", 1, 2, true},
};

// nullptr when the id is not a known ggml type.
constexpr const GgmlTypeInfo* FindGgmlType(uint32_t id) {
  for (const auto& t : kGgmlTypes)
    if (static_cast<uint32_t>(t.type) == id) return &t;
  return nullptr;
}
constexpr const GgmlTypeInfo& GgmlInfo(GgmlType t) { return *FindGgmlType(static_cast<uint32_t>(t)); }
constexpr std::optional<GgmlType> GgmlTypeFromName(std::string_view name) {
  for (const auto& t : kGgmlTypes)
    if (t.name == name) return t.type;
  return std::nullopt;
}
// Block geometry as switches (no table reads), so the same functions work in CUDA device code,
// where the host table kGgmlTypes does not exist. Checked against the table below.
constexpr int GgmlBlockElems(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: return 1;
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q8_0: case GgmlType::IQ4_NL: return 32;
    default: return 256;  // K-quants, IQ4_XS
  }
}
constexpr int GgmlBlockBytes(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 4;
    case GgmlType::F16: case GgmlType::BF16: return 2;
    case GgmlType::Q4_0: return 18;
    case GgmlType::Q4_1: return 20;
    case GgmlType::Q5_0: return 22;
    case GgmlType::Q5_1: return 24;
    case GgmlType::Q8_0: return 34;
    case GgmlType::IQ4_NL: return 18;
    case GgmlType::Q2_K: return 84;
    case GgmlType::Q3_K: return 110;
    case GgmlType::Q4_K: return 144;
    case GgmlType::Q5_K: return 176;
    case GgmlType::Q6_K: return 210;
    case GgmlType::IQ4_XS: return 136;
  }
  return 0;
}
constexpr bool GgmlGeometryMatchesTable() {
  for (const auto& t : kGgmlTypes)
    if (GgmlBlockElems(t.type) != t.block_elems || GgmlBlockBytes(t.type) != t.block_bytes)
      return false;
  return true;
}
static_assert(GgmlGeometryMatchesTable());

// Bytes of one row of n elements (n must be a multiple of the block size).
constexpr uint64_t GgmlRowBytes(GgmlType t, int64_t n) {
  return static_cast<uint64_t>(n / GgmlBlockElems(t)) * GgmlBlockBytes(t);
}

}  // namespace ds
