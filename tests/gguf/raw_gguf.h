// Byte-level GGUF image builder for tests and the fuzz corpus: writes exactly what it is told, so
// tests can produce images the Writer would refuse (bad counts, types, offsets, ...).
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

namespace ds::gguf::testing {

class RawGguf {
 public:
  static constexpr uint32_t kMagic = 0x46554747;

  RawGguf& U8(uint8_t v) { return Put(&v, 1); }
  RawGguf& U32(uint32_t v) { return Put(&v, 4); }
  RawGguf& U64(uint64_t v) { return Put(&v, 8); }
  RawGguf& I32(int32_t v) { return Put(&v, 4); }
  RawGguf& F32(float v) { return Put(&v, 4); }
  RawGguf& Str(std::string_view s) {
    U64(s.size());
    return Put(s.data(), s.size());
  }
  RawGguf& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return U32(kMagic).U32(version).U64(n_tensors).U64(n_kv);
  }
  // key + value type tag; the caller appends the payload.
  RawGguf& Key(std::string_view key, uint32_t type) { return Str(key).U32(type); }
  RawGguf& KvU32(std::string_view key, uint32_t v) { return Key(key, 4).U32(v); }
  RawGguf& KvStr(std::string_view key, std::string_view v) { return Key(key, 8).Str(v); }
  RawGguf& TensorInfo(std::string_view name, const std::vector<uint64_t>& ne, uint32_t type,
                      uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(ne.size()));
    for (uint64_t n : ne) U64(n);
    return U32(type).U64(offset);
  }
  RawGguf& PadTo(size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
    return *this;
  }
  RawGguf& Fill(size_t n, uint8_t seed = 1) {
    for (size_t i = 0; i < n; ++i) bytes_.push_back(static_cast<uint8_t>(seed + i * 7));
    return *this;
  }
  RawGguf& Put(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
    return *this;
  }
  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Copies an image into a heap block of exactly its size, so ASan flags any read past the end
// (a std::vector's spare capacity would hide it).
struct ExactBuffer {
  explicit ExactBuffer(const std::vector<uint8_t>& v, size_t n)
      : data(new uint8_t[n > 0 ? n : 1]), size(n) {
    if (n > 0) std::memcpy(data.get(), v.data(), n);
  }
  explicit ExactBuffer(const std::vector<uint8_t>& v) : ExactBuffer(v, v.size()) {}
  std::unique_ptr<uint8_t[]> data;
  size_t size;
};

}  // namespace ds::gguf::testing
