// KV cache element type of the attention layers (`--kv-type f16|q8_0|q4_0`), as a GgmlType with
// GGML block layouts (spec/model.md §10): F16, Q8_0 (f16 d + 32 int8: x = d*q) or Q4_0 (f16 d +
// 16 bytes of nibbles: x = d*(q-8)). Blocks run along head_dim (hd/32 blocks per head row).
// The CUDA backend stores all three; the CPU backend keeps its f32 cache and accepts only the
// default F16 (a non-f16 request is an error there, not silently ignored).
// Header-only so tools that merely forward the flag (serve) can validate it without linking.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/gguf/ggml_types.h"

namespace ds {

constexpr std::optional<GgmlType> KvTypeFromName(std::string_view name) {
  if (name == "f16") return GgmlType::F16;
  if (name == "q8_0") return GgmlType::Q8_0;
  if (name == "q4_0") return GgmlType::Q4_0;
  return std::nullopt;
}

// const char* rather than string_view: this absl's StrCat does not take std::string_view.
constexpr const char* KvTypeName(GgmlType t) {
  switch (t) {
    case GgmlType::F16:
      return "f16";
    case GgmlType::Q8_0:
      return "q8_0";
    case GgmlType::Q4_0:
      return "q4_0";
    default:
      return "unsupported";
  }
}

constexpr bool KvTypeSupported(GgmlType t) {
  return t == GgmlType::F16 || t == GgmlType::Q8_0 || t == GgmlType::Q4_0;
}

inline absl::StatusOr<GgmlType> ParseKvType(std::string_view name) {
  if (auto t = KvTypeFromName(name)) return *t;
  return absl::InvalidArgumentError("--kv-type expects f16, q8_0 or q4_0, got '" +
                                    std::string(name) + "'");
}

// Bytes of one head row of hd elements (hd a multiple of 32 for the block types).
constexpr uint64_t KvRowBytes(GgmlType t, int hd) { return GgmlRowBytes(t, hd); }

}  // namespace ds
