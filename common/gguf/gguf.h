// GGUF v3 reader (mmap, strict validation) and streaming writer.
//
// Reader contract: Open()/Parse() never crash on malformed input; every failure is one
// absl::Status whose message names the offending key or tensor (bad magic/version, truncated
// file, offsets out of range, unknown type, shape/size mismatch, ...). Typed getters return
// NotFound / InvalidArgument naming the key. Tensor data pointers point into the mapping and stay
// valid for the File's lifetime.
#pragma once
#include <array>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"

namespace ds::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
std::string_view ValueTypeName(ValueType t);

struct Value;
struct Array {
  ValueType elem_type = ValueType::U8;
  std::vector<Value> items;
};
// One metadata value. Integers keep their declared type (`type`) but are stored widened.
struct Value {
  ValueType type = ValueType::U8;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> v;

  bool is_integer() const;
  bool is_float() const;  // F32 / F64
};

// Validation limits shared by the reader and the writer.
inline constexpr int kMaxArrayDepth = 8;               // arrays nested at most this deep
inline constexpr uint64_t kMaxKeyBytes = 65535;        // metadata key length
inline constexpr uint64_t kMaxTensorNameBytes = 256;   // spec says <= 64; third-party files exceed it
inline constexpr uint32_t kDefaultAlignment = 32;

// Structural equality: same declared types, same numbers (integers compared by value whatever the
// variant alternative holding them), NaN equals NaN, arrays element-wise.
bool SameValue(const Value& a, const Value& b);

struct TensorInfo {
  std::string name;
  int n_dims = 0;
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // ne[0] is the contiguous dimension
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;   // relative to the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  uint64_t row_bytes() const { return GgmlRowBytes(type, ne[0]); }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
};

class File {
 public:
  // mmap()s the file read-only and parses it. Errors name the path.
  static absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path);
  // Parses an in-memory image (not copied: `data` must outlive the File). Used by the fuzzer.
  static absl::StatusOr<std::unique_ptr<File>> Parse(const uint8_t* data, size_t size);
  ~File();
  File(const File&) = delete;  // owns the mapping
  File& operator=(const File&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const Value* Find(std::string_view key) const;  // nullptr if absent
  const TensorInfo* FindTensor(std::string_view name) const;
  absl::StatusOr<const TensorInfo*> GetTensor(std::string_view name) const;  // NotFound names it

  // Typed getters. Integers of any width are accepted if the value fits; floats accept F32/F64.
  absl::StatusOr<uint64_t> GetUInt(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  // Same, with a default when the key is absent (a present key of the wrong type is still an error).
  absl::StatusOr<uint64_t> GetUIntOr(std::string_view key, uint64_t dflt) const;
  absl::StatusOr<double> GetFloatOr(std::string_view key, double dflt) const;

  const uint8_t* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  File() = default;
  absl::Status ParseImpl();

  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;  // non-null when we own an mmap
  size_t mapping_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Streaming writer: collect metadata and tensor descriptions, then write. Tensor bytes are produced
// by a callback at write time so multi-GB files never sit in memory; the callback fills exactly
// nbytes into `dst` (a buffer owned by the writer). Writing uses large sequential writes.
class Writer {
 public:
  void SetAlignment(uint32_t a);  // also written as general.alignment when != 32
  void AddU32(std::string key, uint32_t v);
  void AddI32(std::string key, int32_t v);
  void AddU64(std::string key, uint64_t v);
  void AddF32(std::string key, float v);
  void AddBool(std::string key, bool v);
  void AddString(std::string key, std::string v);
  void AddValue(std::string key, Value v);  // any type, incl. arrays
  void AddStringArray(std::string key, const std::vector<std::string>& v);
  void AddI32Array(std::string key, const std::vector<int32_t>& v);
  void AddF32Array(std::string key, const std::vector<float>& v);

  using Fill = std::function<void(uint8_t* dst, uint64_t nbytes)>;
  // ne: up to 4 dims, ne[0] contiguous. nbytes derived from type and shape.
  void AddTensor(std::string name, std::vector<int64_t> ne, GgmlType type, Fill fill);
  // Convenience: copy the given bytes (size must match).
  void AddTensorBytes(std::string name, std::vector<int64_t> ne, GgmlType type,
                      std::vector<uint8_t> bytes);

  absl::Status WriteFile(const std::string& path) const;
  absl::StatusOr<std::vector<uint8_t>> WriteToMemory() const;  // for tests / small files

 private:
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> ne;
    GgmlType type;
    uint64_t nbytes;
    Fill fill;
    int64_t given_bytes = -1;  // AddTensorBytes: size of the supplied bytes, checked at write time
  };
  struct Layout;
  absl::StatusOr<Layout> Plan() const;
  // Streams the file through `sink` (called with large chunks, in file order).
  absl::Status WriteTo(const Layout& layout,
                       const std::function<absl::Status(const uint8_t*, size_t)>& sink) const;
  uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace ds::gguf
