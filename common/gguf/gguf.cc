// GGUF v2/v3 reader (mmap + strict validation) and streaming writer. Layout: spec/model.md §9.
#include "common/gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ds::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kWriteVersion = 3;
constexpr size_t kWriteBufferBytes = 8u << 20;
constexpr uint32_t kMaxValueType = static_cast<uint32_t>(ValueType::F64);

// Smallest possible encodings; used to reject counts that cannot fit before allocating anything.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;  // key length, 1-byte key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes =
    8 + 1 + 4 + 8 + 4 + 8;  // name, n_dims, one ne, type, offset

// Debian's abseil is built with its own absl::string_view (not std::string_view): convert.
absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Names from files may hold arbitrary bytes; escape them so messages stay printable.
std::string Q(std::string_view s) { return absl::StrCat("'", absl::CHexEscape(AV(s)), "'"); }

absl::string_view TN(ValueType t) { return AV(ValueTypeName(t)); }

absl::Status Malformed(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

absl::Status Prefixed(const absl::Status& s, std::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(AV(prefix), s.message()));
}

uint64_t MinEncodedBytes(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
    case ValueType::STRING:  // length prefix
      return 8;
    case ValueType::ARRAY:  // element type + count
      return 12;
  }
  return 1;
}

bool IsUnsignedType(ValueType t) {
  return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}
bool IsSignedType(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}

std::string TypeDescription(const Value& v) {
  if (v.type == ValueType::ARRAY) {
    if (const auto* a = std::get_if<Array>(&v.v)) {
      return absl::StrCat("array of ", TN(a->elem_type));
    }
  }
  return std::string(ValueTypeName(v.type));
}

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
bool AddOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }  // callers keep x+a small

// Bounds-checked little-endian reads over the image.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }

  absl::Status Need(uint64_t bytes, std::string_view what) const {
    if (bytes > remaining()) {
      return Malformed(
          absl::StrFormat("truncated GGUF: %s needs %d bytes at offset %d but only %d remain", what,
                          bytes, pos_, remaining()));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(std::string_view what) {
    DS_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // GGUF string: u64 length + bytes. Lengths above max_len are rejected before copying.
  absl::StatusOr<std::string> ReadString(std::string_view what,
                                         uint64_t max_len = std::numeric_limits<uint64_t>::max()) {
    DS_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(absl::StrCat(AV(what), " length")));
    if (len > max_len) {
      return Malformed(
          absl::StrFormat("%s length %d exceeds the limit of %d bytes", what, len, max_len));
    }
    if (len > remaining()) {
      return Malformed(absl::StrFormat(
          "truncated GGUF: %s length %d exceeds the %d bytes remaining at offset %d", what, len,
          remaining(), pos_));
    }
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

// Reads one value of type `t`; `depth` = number of enclosing arrays. Messages are relative to the
// value; the caller prefixes the key.
absl::Status ReadValue(Cursor& c, ValueType t, int depth, Value* out) {
  out->type = t;
  switch (t) {
    case ValueType::U8: {
      DS_ASSIGN_OR_RETURN(uint8_t x, c.Read<uint8_t>("u8 value"));
      out->v = uint64_t{x};
      return absl::OkStatus();
    }
    case ValueType::I8: {
      DS_ASSIGN_OR_RETURN(int8_t x, c.Read<int8_t>("i8 value"));
      out->v = int64_t{x};
      return absl::OkStatus();
    }
    case ValueType::U16: {
      DS_ASSIGN_OR_RETURN(uint16_t x, c.Read<uint16_t>("u16 value"));
      out->v = uint64_t{x};
      return absl::OkStatus();
    }
    case ValueType::I16: {
      DS_ASSIGN_OR_RETURN(int16_t x, c.Read<int16_t>("i16 value"));
      out->v = int64_t{x};
      return absl::OkStatus();
    }
    case ValueType::U32: {
      DS_ASSIGN_OR_RETURN(uint32_t x, c.Read<uint32_t>("u32 value"));
      out->v = uint64_t{x};
      return absl::OkStatus();
    }
    case ValueType::I32: {
      DS_ASSIGN_OR_RETURN(int32_t x, c.Read<int32_t>("i32 value"));
      out->v = int64_t{x};
      return absl::OkStatus();
    }
    case ValueType::U64: {
      DS_ASSIGN_OR_RETURN(uint64_t x, c.Read<uint64_t>("u64 value"));
      out->v = x;
      return absl::OkStatus();
    }
    case ValueType::I64: {
      DS_ASSIGN_OR_RETURN(int64_t x, c.Read<int64_t>("i64 value"));
      out->v = x;
      return absl::OkStatus();
    }
    case ValueType::F32: {
      DS_ASSIGN_OR_RETURN(float x, c.Read<float>("f32 value"));
      out->v = static_cast<double>(x);
      return absl::OkStatus();
    }
    case ValueType::F64: {
      DS_ASSIGN_OR_RETURN(double x, c.Read<double>("f64 value"));
      out->v = x;
      return absl::OkStatus();
    }
    case ValueType::BOOL: {
      DS_ASSIGN_OR_RETURN(uint8_t x, c.Read<uint8_t>("bool value"));
      if (x > 1) return Malformed(absl::StrCat("bool value ", x, " is not 0 or 1"));
      out->v = x == 1;
      return absl::OkStatus();
    }
    case ValueType::STRING: {
      DS_ASSIGN_OR_RETURN(std::string s, c.ReadString("string value"));
      out->v = std::move(s);
      return absl::OkStatus();
    }
    case ValueType::ARRAY: {
      if (depth >= kMaxArrayDepth) {
        return Malformed(absl::StrCat("arrays nested more than ", kMaxArrayDepth, " levels deep"));
      }
      DS_ASSIGN_OR_RETURN(uint32_t et, c.Read<uint32_t>("array element type"));
      if (et > kMaxValueType) return Malformed(absl::StrCat("unknown array element type ", et));
      const auto elem_type = static_cast<ValueType>(et);
      DS_ASSIGN_OR_RETURN(uint64_t count, c.Read<uint64_t>("array count"));
      // Every element takes at least MinEncodedBytes, so this bounds the allocation below by the
      // file size (times sizeof(Value)).
      if (count > c.remaining() / MinEncodedBytes(elem_type)) {
        return Malformed(absl::StrFormat(
            "array of %d %s elements cannot fit in the %d bytes remaining at offset %d", count,
            TN(elem_type), c.remaining(), c.pos()));
      }
      Array arr;
      arr.elem_type = elem_type;
      arr.items.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        absl::Status s = ReadValue(c, elem_type, depth + 1, &arr.items[i]);
        if (!s.ok()) return Prefixed(s, absl::StrCat("array element ", i, ": "));
      }
      out->v = std::move(arr);
      return absl::OkStatus();
    }
  }
  return Malformed(absl::StrCat("unknown value type ", static_cast<uint32_t>(t)));
}

// Integer payload of a value as a 128-bit number; nullopt if it holds no integer alternative.
std::optional<__int128> IntegerPayload(const Value& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return static_cast<__int128>(*u);
  if (const auto* s = std::get_if<int64_t>(&v.v)) return static_cast<__int128>(*s);
  return std::nullopt;
}

std::string Int128Str(__int128 x) {
  if (x < 0) return absl::StrCat("-", static_cast<uint64_t>(-x));  // |x| < 2^64 here
  return absl::StrCat(static_cast<uint64_t>(x));
}

absl::StatusOr<uint64_t> AsUInt(const Value& v, std::string_view key) {
  std::optional<__int128> x = v.is_integer() ? IntegerPayload(v) : std::nullopt;
  if (!x) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF key ", Q(key), " has type ", TypeDescription(v), ", expected an unsigned integer"));
  }
  if (*x < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF key ", Q(key), " (", TN(v.type),
                                                   ") has negative value ", Int128Str(*x),
                                                   ", expected an unsigned integer"));
  }
  return static_cast<uint64_t>(*x);
}

absl::StatusOr<int64_t> AsInt(const Value& v, std::string_view key) {
  std::optional<__int128> x = v.is_integer() ? IntegerPayload(v) : std::nullopt;
  if (!x) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF key ", Q(key), " has type ",
                                                   TypeDescription(v), ", expected an integer"));
  }
  if (*x > std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF key ", Q(key), " (", TN(v.type),
                                                   ") value ", Int128Str(*x),
                                                   " does not fit in int64"));
  }
  return static_cast<int64_t>(*x);
}

absl::Status WrongType(std::string_view key, const Value& v, std::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat("GGUF key ", Q(key), " has type ",
                                                 TypeDescription(v), ", expected ", AV(expected)));
}

}  // namespace

std::string_view ValueTypeName(ValueType t) {
  switch (t) {
    case ValueType::U8:
      return "u8";
    case ValueType::I8:
      return "i8";
    case ValueType::U16:
      return "u16";
    case ValueType::I16:
      return "i16";
    case ValueType::U32:
      return "u32";
    case ValueType::I32:
      return "i32";
    case ValueType::F32:
      return "f32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::U64:
      return "u64";
    case ValueType::I64:
      return "i64";
    case ValueType::F64:
      return "f64";
  }
  return "unknown";
}

bool Value::is_integer() const { return IsUnsignedType(type) || IsSignedType(type); }
bool Value::is_float() const { return type == ValueType::F32 || type == ValueType::F64; }

bool SameValue(const Value& a, const Value& b) {
  if (a.type != b.type) return false;
  if (a.is_integer()) {
    auto x = IntegerPayload(a), y = IntegerPayload(b);
    return x && y && *x == *y;
  }
  if (a.v.index() != b.v.index()) return false;
  if (const auto* d = std::get_if<double>(&a.v)) {
    const double e = std::get<double>(b.v);
    return *d == e || (std::isnan(*d) && std::isnan(e));
  }
  if (const auto* arr = std::get_if<Array>(&a.v)) {
    const Array& brr = std::get<Array>(b.v);
    if (arr->elem_type != brr.elem_type || arr->items.size() != brr.items.size()) return false;
    for (size_t i = 0; i < arr->items.size(); ++i) {
      if (!SameValue(arr->items[i], brr.items[i])) return false;
    }
    return true;
  }
  if (const auto* x = std::get_if<bool>(&a.v)) return *x == std::get<bool>(b.v);
  if (const auto* x = std::get_if<std::string>(&a.v)) return *x == std::get<std::string>(b.v);
  return false;
}

// ------------------------------------------------------------------------------------------------
// Reader

File::~File() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

absl::StatusOr<std::unique_ptr<File>> File::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot open GGUF file"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": fstat failed"));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated GGUF: file is empty"));
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  close(fd);  // the mapping keeps the file referenced
  if (map == MAP_FAILED) {
    return absl::ErrnoToStatus(map_err, absl::StrCat(path, ": mmap of ", size, " bytes failed"));
  }
  std::unique_ptr<File> f(new File());
  f->mapping_ = map;
  f->mapping_size_ = size;
  f->base_ = static_cast<const uint8_t*>(map);
  f->size_ = size;
  absl::Status s = f->ParseImpl();
  if (!s.ok()) return Prefixed(s, absl::StrCat(path, ": "));
  return f;
}

absl::StatusOr<std::unique_ptr<File>> File::Parse(const uint8_t* data, size_t size) {
  std::unique_ptr<File> f(new File());
  f->base_ = data;
  f->size_ = data == nullptr ? 0 : size;
  DS_RETURN_IF_ERROR(f->ParseImpl());
  return f;
}

absl::Status File::ParseImpl() {
  Cursor c(base_, size_);

  // Header.
  DS_ASSIGN_OR_RETURN(uint32_t magic, c.Read<uint32_t>("header magic"));
  if (magic != kMagic) {
    return Malformed(
        absl::StrFormat("bad magic 0x%08x (expected 0x%08x, \"GGUF\")", magic, kMagic));
  }
  DS_ASSIGN_OR_RETURN(version_, c.Read<uint32_t>("header version"));
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    if (swapped == 2 || swapped == 3) {
      return Malformed(absl::StrCat("big-endian GGUF (version ", swapped, ") is not supported"));
    }
    return Malformed(absl::StrCat("unsupported GGUF version ", version_, " (supported: 2, 3)"));
  }
  DS_ASSIGN_OR_RETURN(uint64_t n_tensors, c.Read<uint64_t>("header tensor count"));
  DS_ASSIGN_OR_RETURN(uint64_t n_kv, c.Read<uint64_t>("header metadata count"));
  if (n_kv > c.remaining() / kMinKvBytes) {
    return Malformed(absl::StrFormat(
        "header metadata count %d cannot fit in the %d bytes remaining", n_kv, c.remaining()));
  }

  // Metadata.
  kv_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string entry = absl::StrCat("metadata entry #", i, " key");
    DS_ASSIGN_OR_RETURN(std::string key, c.ReadString(entry, kMaxKeyBytes));
    if (key.empty()) return Malformed(absl::StrCat("metadata entry #", i, " has an empty key"));
    if (kv_index_.count(key) != 0) return Malformed(absl::StrCat("duplicate GGUF key ", Q(key)));
    const std::string where = absl::StrCat("GGUF key ", Q(key), ": ");
    auto type_or = c.Read<uint32_t>("value type");
    if (!type_or.ok()) return Prefixed(type_or.status(), where);
    if (*type_or > kMaxValueType) {
      return Malformed(absl::StrCat(where, "unknown value type ", *type_or));
    }
    Value v;
    absl::Status s = ReadValue(c, static_cast<ValueType>(*type_or), 0, &v);
    if (!s.ok()) return Prefixed(s, where);
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }

  alignment_ = kDefaultAlignment;
  if (const Value* a = Find("general.alignment")) {
    if (a->type != ValueType::U32) {
      return Malformed(absl::StrCat("GGUF key 'general.alignment' has type ", TypeDescription(*a),
                                    ", expected u32"));
    }
    const uint64_t al = std::get<uint64_t>(a->v);
    if (al == 0 || (al & (al - 1)) != 0) {
      return Malformed(
          absl::StrCat("GGUF key 'general.alignment' = ", al, " is not a power of two"));
    }
    alignment_ = al;
  }

  // Tensor infos.
  if (n_tensors > c.remaining() / kMinTensorInfoBytes) {
    return Malformed(absl::StrFormat(
        "header tensor count %d cannot fit in the %d bytes remaining after the metadata", n_tensors,
        c.remaining()));
  }
  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    DS_ASSIGN_OR_RETURN(t.name,
                        c.ReadString(absl::StrCat("tensor #", i, " name"), kMaxTensorNameBytes));
    if (t.name.empty()) return Malformed(absl::StrCat("tensor #", i, " has an empty name"));
    if (tensor_index_.count(t.name) != 0) {
      return Malformed(absl::StrCat("duplicate tensor name ", Q(t.name)));
    }
    const std::string where = absl::StrCat("tensor ", Q(t.name), ": ");
    auto nd = c.Read<uint32_t>("n_dims");
    if (!nd.ok()) return Prefixed(nd.status(), where);
    if (*nd == 0 || *nd > 4) return Malformed(absl::StrCat(where, "n_dims ", *nd, " not in 1..4"));
    t.n_dims = static_cast<int>(*nd);
    uint64_t n_elements = 1;
    for (int d = 0; d < t.n_dims; ++d) {
      auto ne = c.Read<uint64_t>(absl::StrCat("ne[", d, "]"));
      if (!ne.ok()) return Prefixed(ne.status(), where);
      if (*ne == 0) return Malformed(absl::StrCat(where, "ne[", d, "] is 0"));
      if (*ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Malformed(
            absl::StrCat(where, "ne[", d, "] is negative (", static_cast<int64_t>(*ne), ")"));
      }
      if (MulOverflows(n_elements, *ne, &n_elements) ||
          n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Malformed(absl::StrCat(where, "element count overflows int64 at ne[", d, "]"));
      }
      t.ne[d] = static_cast<int64_t>(*ne);
    }
    auto type_id = c.Read<uint32_t>("ggml type");
    if (!type_id.ok()) return Prefixed(type_id.status(), where);
    const GgmlTypeInfo* info = FindGgmlType(*type_id);
    if (info == nullptr) return Malformed(absl::StrCat(where, "unknown ggml type id ", *type_id));
    t.type = info->type;
    if (t.ne[0] % info->block_elems != 0) {
      return Malformed(absl::StrCat(where, "ne[0] = ", t.ne[0], " is not a multiple of the ",
                                    AV(info->name), " block size ", info->block_elems));
    }
    uint64_t nbytes = static_cast<uint64_t>(t.ne[0] / info->block_elems);
    bool overflow = MulOverflows(nbytes, static_cast<uint64_t>(info->block_bytes), &nbytes);
    for (int d = 1; d < 4 && !overflow; ++d) {
      overflow = MulOverflows(nbytes, static_cast<uint64_t>(t.ne[d]), &nbytes);
    }
    if (overflow) return Malformed(absl::StrCat(where, "byte size overflows 64 bits"));
    t.nbytes = nbytes;
    auto off = c.Read<uint64_t>("data offset");
    if (!off.ok()) return Prefixed(off.status(), where);
    t.offset = *off;
    if (t.offset % alignment_ != 0) {
      return Malformed(absl::StrCat(where, "data offset ", t.offset,
                                    " is not a multiple of the alignment ", alignment_));
    }
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // Data section: starts at the next alignment boundary after the tensor infos.
  if (!tensors_.empty()) {
    const uint64_t data_start = AlignUp(c.pos(), alignment_);  // pos <= size, alignment < 2^32
    for (TensorInfo& t : tensors_) {
      uint64_t begin = 0, end = 0;
      if (AddOverflows(data_start, t.offset, &begin) || AddOverflows(begin, t.nbytes, &end) ||
          end > size_) {
        return Malformed(absl::StrFormat(
            "tensor %s: data (offset %d + %d bytes from data section start %d) lies outside the "
            "file of %d bytes",
            Q(t.name), t.offset, t.nbytes, data_start, size_));
      }
      t.data = base_ + begin;
    }
    std::vector<size_t> order(tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
      const TensorInfo& prev = tensors_[order[k - 1]];
      const TensorInfo& cur = tensors_[order[k]];
      if (cur.offset < prev.offset + prev.nbytes) {  // no overflow: both lie inside the file
        return Malformed(
            absl::StrFormat("tensors %s (offset %d, %d bytes) and %s (offset %d) overlap",
                            Q(prev.name), prev.offset, prev.nbytes, Q(cur.name), cur.offset));
      }
    }
  }
  return absl::OkStatus();
}

const Value* File::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<const TensorInfo*> File::GetTensor(std::string_view name) const {
  const TensorInfo* t = FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("missing tensor ", Q(name)));
  return t;
}

namespace {
absl::StatusOr<const Value*> Require(const File& f, std::string_view key) {
  const Value* v = f.Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("missing GGUF key ", Q(key)));
  return v;
}

absl::StatusOr<const Array*> RequireArray(const File& f, std::string_view key) {
  DS_ASSIGN_OR_RETURN(const Value* v, Require(f, key));
  const Array* a = std::get_if<Array>(&v->v);
  if (v->type != ValueType::ARRAY || a == nullptr) return WrongType(key, *v, "array");
  return a;
}
}  // namespace

absl::StatusOr<uint64_t> File::GetUInt(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const Value* v, Require(*this, key));
  return AsUInt(*v, key);
}

absl::StatusOr<int64_t> File::GetInt(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const Value* v, Require(*this, key));
  return AsInt(*v, key);
}

absl::StatusOr<double> File::GetFloat(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const Value* v, Require(*this, key));
  const double* d = std::get_if<double>(&v->v);
  if (!v->is_float() || d == nullptr) return WrongType(key, *v, "f32 or f64");
  return *d;
}

absl::StatusOr<bool> File::GetBool(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const Value* v, Require(*this, key));
  const bool* b = std::get_if<bool>(&v->v);
  if (v->type != ValueType::BOOL || b == nullptr) return WrongType(key, *v, "bool");
  return *b;
}

absl::StatusOr<std::string> File::GetString(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const Value* v, Require(*this, key));
  const std::string* s = std::get_if<std::string>(&v->v);
  if (v->type != ValueType::STRING || s == nullptr) return WrongType(key, *v, "string");
  return *s;
}

absl::StatusOr<std::vector<int64_t>> File::GetIntArray(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const Array* a, RequireArray(*this, key));
  if (!IsUnsignedType(a->elem_type) && !IsSignedType(a->elem_type)) {
    return WrongType(key, *Find(key), "array of integers");
  }
  std::vector<int64_t> out;
  out.reserve(a->items.size());
  for (size_t i = 0; i < a->items.size(); ++i) {
    auto x = AsInt(a->items[i], key);
    if (!x.ok()) return Prefixed(x.status(), absl::StrCat("element ", i, ": "));
    out.push_back(*x);
  }
  return out;
}

absl::StatusOr<std::vector<float>> File::GetFloatArray(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const Array* a, RequireArray(*this, key));
  if (a->elem_type != ValueType::F32 && a->elem_type != ValueType::F64) {
    return WrongType(key, *Find(key), "array of f32 or f64");
  }
  std::vector<float> out;
  out.reserve(a->items.size());
  for (const Value& item : a->items) {
    const double* d = std::get_if<double>(&item.v);
    if (d == nullptr) return WrongType(key, *Find(key), "array of f32 or f64");
    out.push_back(static_cast<float>(*d));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> File::GetStringArray(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const Array* a, RequireArray(*this, key));
  if (a->elem_type != ValueType::STRING) return WrongType(key, *Find(key), "array of string");
  std::vector<std::string> out;
  out.reserve(a->items.size());
  for (const Value& item : a->items) {
    const std::string* s = std::get_if<std::string>(&item.v);
    if (s == nullptr) return WrongType(key, *Find(key), "array of string");
    out.push_back(*s);
  }
  return out;
}

absl::StatusOr<uint64_t> File::GetUIntOr(std::string_view key, uint64_t dflt) const {
  if (Find(key) == nullptr) return dflt;
  return GetUInt(key);
}

absl::StatusOr<double> File::GetFloatOr(std::string_view key, double dflt) const {
  if (Find(key) == nullptr) return dflt;
  return GetFloat(key);
}

// ------------------------------------------------------------------------------------------------
// Writer

namespace {

// Accumulates small writes into one large buffer; bigger chunks go straight to the sink. The first
// error is sticky and reported by Finish().
class OutBuffer {
 public:
  explicit OutBuffer(const std::function<absl::Status(const uint8_t*, size_t)>& sink)
      : sink_(sink) {
    buf_.reserve(kWriteBufferBytes);
  }
  void Put(const void* p, size_t n) {
    if (!status_.ok() || n == 0) return;
    written_ += n;
    if (buf_.size() + n > kWriteBufferBytes) Flush();
    if (n >= kWriteBufferBytes) {
      if (status_.ok()) status_ = sink_(static_cast<const uint8_t*>(p), n);
      return;
    }
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  template <typename T>
  void PutScalar(T v) {
    Put(&v, sizeof(T));
  }
  void PutString(std::string_view s) {
    PutScalar<uint64_t>(s.size());
    Put(s.data(), s.size());
  }
  void PutZeros(size_t n) {
    static constexpr uint8_t kZeros[256] = {};
    while (n > 0) {
      const size_t k = std::min(n, sizeof(kZeros));
      Put(kZeros, k);
      n -= k;
    }
  }
  uint64_t written() const { return written_; }
  void Flush() {
    if (status_.ok() && !buf_.empty()) status_ = sink_(buf_.data(), buf_.size());
    buf_.clear();
  }
  absl::Status Finish() {
    Flush();
    return status_;
  }
  bool ok() const { return status_.ok(); }

 private:
  const std::function<absl::Status(const uint8_t*, size_t)>& sink_;
  std::vector<uint8_t> buf_;
  uint64_t written_ = 0;
  absl::Status status_;
};

// Checks that the payload matches the declared type and fits its width.
absl::Status ValidateValue(const Value& v, int depth) {
  const uint32_t t = static_cast<uint32_t>(v.type);
  if (t > kMaxValueType) return Malformed(absl::StrCat("unknown value type ", t));
  if (v.is_integer()) {
    std::optional<__int128> x = IntegerPayload(v);
    if (!x) return Malformed(absl::StrCat(TN(v.type), " value holds no integer"));
    __int128 lo = 0, hi = 0;
    switch (v.type) {
      case ValueType::U8:
        hi = 0xFF;
        break;
      case ValueType::U16:
        hi = 0xFFFF;
        break;
      case ValueType::U32:
        hi = 0xFFFFFFFFu;
        break;
      case ValueType::U64:
        hi = std::numeric_limits<uint64_t>::max();
        break;
      case ValueType::I8:
        lo = -128;
        hi = 127;
        break;
      case ValueType::I16:
        lo = -32768;
        hi = 32767;
        break;
      case ValueType::I32:
        lo = std::numeric_limits<int32_t>::min();
        hi = std::numeric_limits<int32_t>::max();
        break;
      case ValueType::I64:
        lo = std::numeric_limits<int64_t>::min();
        hi = std::numeric_limits<int64_t>::max();
        break;
      default:
        break;
    }
    if (*x < lo || *x > hi) {
      return Malformed(absl::StrCat("value ", Int128Str(*x), " does not fit in ", TN(v.type)));
    }
    return absl::OkStatus();
  }
  switch (v.type) {
    case ValueType::F32:
    case ValueType::F64:
      if (!std::holds_alternative<double>(v.v)) {
        return Malformed(absl::StrCat(TN(v.type), " value holds no double"));
      }
      return absl::OkStatus();
    case ValueType::BOOL:
      if (!std::holds_alternative<bool>(v.v)) return Malformed("bool value holds no bool");
      return absl::OkStatus();
    case ValueType::STRING:
      if (!std::holds_alternative<std::string>(v.v))
        return Malformed("string value holds no string");
      return absl::OkStatus();
    case ValueType::ARRAY: {
      const Array* a = std::get_if<Array>(&v.v);
      if (a == nullptr) return Malformed("array value holds no Array");
      if (depth >= kMaxArrayDepth) {
        return Malformed(absl::StrCat("arrays nested more than ", kMaxArrayDepth, " levels deep"));
      }
      if (static_cast<uint32_t>(a->elem_type) > kMaxValueType) {
        return Malformed(
            absl::StrCat("unknown array element type ", static_cast<uint32_t>(a->elem_type)));
      }
      for (size_t i = 0; i < a->items.size(); ++i) {
        const Value& item = a->items[i];
        if (item.type != a->elem_type) {
          return Malformed(absl::StrCat("array element ", i, " has type ", TN(item.type),
                                        " in an array of ", TN(a->elem_type)));
        }
        absl::Status s = ValidateValue(item, depth + 1);
        if (!s.ok()) return Prefixed(s, absl::StrCat("array element ", i, ": "));
      }
      return absl::OkStatus();
    }
    default:
      return absl::OkStatus();
  }
}

// Payload only (no type tag); the value has passed ValidateValue.
void PutPayload(OutBuffer& out, const Value& v) {
  const __int128 x = v.is_integer() ? *IntegerPayload(v) : 0;
  switch (v.type) {
    case ValueType::U8:
      out.PutScalar(static_cast<uint8_t>(x));
      return;
    case ValueType::I8:
      out.PutScalar(static_cast<int8_t>(x));
      return;
    case ValueType::U16:
      out.PutScalar(static_cast<uint16_t>(x));
      return;
    case ValueType::I16:
      out.PutScalar(static_cast<int16_t>(x));
      return;
    case ValueType::U32:
      out.PutScalar(static_cast<uint32_t>(x));
      return;
    case ValueType::I32:
      out.PutScalar(static_cast<int32_t>(x));
      return;
    case ValueType::U64:
      out.PutScalar(static_cast<uint64_t>(x));
      return;
    case ValueType::I64:
      out.PutScalar(static_cast<int64_t>(x));
      return;
    case ValueType::F32:
      out.PutScalar(static_cast<float>(std::get<double>(v.v)));
      return;
    case ValueType::F64:
      out.PutScalar(std::get<double>(v.v));
      return;
    case ValueType::BOOL:
      out.PutScalar<uint8_t>(std::get<bool>(v.v) ? 1 : 0);
      return;
    case ValueType::STRING:
      out.PutString(std::get<std::string>(v.v));
      return;
    case ValueType::ARRAY: {
      const Array& a = std::get<Array>(v.v);
      out.PutScalar(static_cast<uint32_t>(a.elem_type));
      out.PutScalar<uint64_t>(a.items.size());
      for (const Value& item : a.items) PutPayload(out, item);
      return;
    }
  }
}

Value ScalarU(ValueType t, uint64_t x) { return Value{t, x}; }

}  // namespace

struct Writer::Layout {
  bool append_alignment_key = false;
  std::vector<uint64_t> nbytes;   // per tensor
  std::vector<uint64_t> offsets;  // per tensor, relative to the data section
  uint64_t max_tensor_bytes = 0;
};

void Writer::SetAlignment(uint32_t a) { alignment_ = a; }
void Writer::AddU32(std::string key, uint32_t v) {
  kv_.emplace_back(std::move(key), ScalarU(ValueType::U32, v));
}
void Writer::AddI32(std::string key, int32_t v) {
  kv_.emplace_back(std::move(key), Value{ValueType::I32, int64_t{v}});
}
void Writer::AddU64(std::string key, uint64_t v) {
  kv_.emplace_back(std::move(key), ScalarU(ValueType::U64, v));
}
void Writer::AddF32(std::string key, float v) {
  kv_.emplace_back(std::move(key), Value{ValueType::F32, static_cast<double>(v)});
}
void Writer::AddBool(std::string key, bool v) {
  kv_.emplace_back(std::move(key), Value{ValueType::BOOL, v});
}
void Writer::AddString(std::string key, std::string v) {
  kv_.emplace_back(std::move(key), Value{ValueType::STRING, std::move(v)});
}
void Writer::AddValue(std::string key, Value v) { kv_.emplace_back(std::move(key), std::move(v)); }
void Writer::AddStringArray(std::string key, const std::vector<std::string>& v) {
  Array a;
  a.elem_type = ValueType::STRING;
  a.items.reserve(v.size());
  for (const auto& s : v) a.items.push_back(Value{ValueType::STRING, s});
  kv_.emplace_back(std::move(key), Value{ValueType::ARRAY, std::move(a)});
}
void Writer::AddI32Array(std::string key, const std::vector<int32_t>& v) {
  Array a;
  a.elem_type = ValueType::I32;
  a.items.reserve(v.size());
  for (int32_t x : v) a.items.push_back(Value{ValueType::I32, int64_t{x}});
  kv_.emplace_back(std::move(key), Value{ValueType::ARRAY, std::move(a)});
}
void Writer::AddF32Array(std::string key, const std::vector<float>& v) {
  Array a;
  a.elem_type = ValueType::F32;
  a.items.reserve(v.size());
  for (float x : v) a.items.push_back(Value{ValueType::F32, static_cast<double>(x)});
  kv_.emplace_back(std::move(key), Value{ValueType::ARRAY, std::move(a)});
}

void Writer::AddTensor(std::string name, std::vector<int64_t> ne, GgmlType type, Fill fill) {
  tensors_.push_back(PendingTensor{std::move(name), std::move(ne), type, 0, std::move(fill), -1});
}

void Writer::AddTensorBytes(std::string name, std::vector<int64_t> ne, GgmlType type,
                            std::vector<uint8_t> bytes) {
  auto shared = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  const int64_t given = static_cast<int64_t>(shared->size());
  Fill fill = [shared](uint8_t* dst, uint64_t nbytes) {
    std::memcpy(dst, shared->data(), std::min<uint64_t>(nbytes, shared->size()));
  };
  tensors_.push_back(
      PendingTensor{std::move(name), std::move(ne), type, 0, std::move(fill), given});
}

absl::StatusOr<Writer::Layout> Writer::Plan() const {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF alignment ", alignment_, " is not a power of two"));
  }
  Layout layout;
  std::map<std::string_view, size_t> seen;
  bool has_alignment_key = false;
  for (size_t i = 0; i < kv_.size(); ++i) {
    const auto& [key, v] = kv_[i];
    if (key.empty())
      return absl::InvalidArgumentError(absl::StrCat("metadata entry #", i, " has an empty key"));
    if (key.size() > kMaxKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF key ", Q(key.substr(0, 64)), "... is ",
                                                     key.size(), " bytes, limit ", kMaxKeyBytes));
    }
    if (!seen.emplace(key, i).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate GGUF key ", Q(key)));
    }
    absl::Status s = ValidateValue(v, 0);
    if (!s.ok()) return Prefixed(s, absl::StrCat("GGUF key ", Q(key), ": "));
    if (key == "general.alignment") {
      has_alignment_key = true;
      if (v.type != ValueType::U32 || *IntegerPayload(v) != alignment_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "GGUF key 'general.alignment' (", TypeDescription(v),
            ") must be u32 and equal the writer alignment ", alignment_, " (use SetAlignment)"));
      }
    }
  }
  layout.append_alignment_key = alignment_ != kDefaultAlignment && !has_alignment_key;

  std::map<std::string_view, size_t> names;
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    if (t.name.empty()) return absl::InvalidArgumentError("tensor with an empty name");
    const std::string where = absl::StrCat("tensor ", Q(t.name), ": ");
    if (t.name.size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "name is ", t.name.size(), " bytes, limit ", kMaxTensorNameBytes));
    }
    if (!names.emplace(t.name, 0).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", Q(t.name)));
    }
    if (t.ne.empty() || t.ne.size() > 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "n_dims ", t.ne.size(), " not in 1..4"));
    }
    const GgmlTypeInfo* info = FindGgmlType(static_cast<uint32_t>(t.type));
    if (info == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "unknown ggml type id ", static_cast<uint32_t>(t.type)));
    }
    uint64_t n_elements = 1;
    for (size_t d = 0; d < t.ne.size(); ++d) {
      if (t.ne[d] <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "ne[", d, "] = ", t.ne[d], " is not positive"));
      }
      if (MulOverflows(n_elements, static_cast<uint64_t>(t.ne[d]), &n_elements) ||
          n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat(where, "element count overflows int64"));
      }
    }
    if (t.ne[0] % info->block_elems != 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, "ne[0] = ", t.ne[0],
                                                     " is not a multiple of the ", AV(info->name),
                                                     " block size ", info->block_elems));
    }
    uint64_t nbytes = n_elements / info->block_elems;
    uint64_t end = 0;
    if (MulOverflows(nbytes, static_cast<uint64_t>(info->block_bytes), &nbytes) ||
        AddOverflows(offset, nbytes, &end) || end > std::numeric_limits<uint64_t>::max() / 2) {
      return absl::InvalidArgumentError(absl::StrCat(where, "byte size overflows"));
    }
    if (!t.fill) return absl::InvalidArgumentError(absl::StrCat(where, "no fill callback"));
    if (t.given_bytes >= 0 && static_cast<uint64_t>(t.given_bytes) != nbytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, t.given_bytes, " bytes supplied, shape ", absl::StrJoin(t.ne, "x"),
                       " of ", AV(info->name), " needs ", nbytes));
    }
    layout.nbytes.push_back(nbytes);
    layout.offsets.push_back(offset);
    layout.max_tensor_bytes = std::max(layout.max_tensor_bytes, nbytes);
    offset = AlignUp(end, alignment_);
  }
  return layout;
}

absl::Status Writer::WriteTo(
    const Layout& layout, const std::function<absl::Status(const uint8_t*, size_t)>& sink) const {
  OutBuffer out(sink);
  out.PutScalar(kMagic);
  out.PutScalar(kWriteVersion);
  out.PutScalar<uint64_t>(tensors_.size());
  out.PutScalar<uint64_t>(kv_.size() + (layout.append_alignment_key ? 1 : 0));
  for (const auto& [key, v] : kv_) {
    out.PutString(key);
    out.PutScalar(static_cast<uint32_t>(v.type));
    PutPayload(out, v);
  }
  if (layout.append_alignment_key) {
    out.PutString("general.alignment");
    out.PutScalar(static_cast<uint32_t>(ValueType::U32));
    out.PutScalar<uint32_t>(alignment_);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const PendingTensor& t = tensors_[i];
    out.PutString(t.name);
    out.PutScalar<uint32_t>(t.ne.size());
    for (int64_t n : t.ne) out.PutScalar<uint64_t>(n);
    out.PutScalar(static_cast<uint32_t>(t.type));
    out.PutScalar<uint64_t>(layout.offsets[i]);
  }
  if (!tensors_.empty()) {
    out.PutZeros(AlignUp(out.written(), alignment_) - out.written());
  }
  const uint64_t data_start = out.written();

  // One reusable buffer sized for the largest tensor: tensors are produced one at a time.
  std::unique_ptr<uint8_t[]> buf;
  if (layout.max_tensor_bytes > 0) {
    if (layout.max_tensor_bytes > std::numeric_limits<size_t>::max()) {
      return absl::ResourceExhaustedError("tensor too large for this platform");
    }
    buf.reset(new (std::nothrow) uint8_t[layout.max_tensor_bytes]);
    if (buf == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", layout.max_tensor_bytes, " bytes for a tensor"));
    }
  }
  for (size_t i = 0; i < tensors_.size() && out.ok(); ++i) {
    const uint64_t pos = data_start + layout.offsets[i];
    out.PutZeros(pos - out.written());  // alignment padding between tensors
    const uint64_t n = layout.nbytes[i];
    std::memset(buf.get(), 0, n);  // deterministic output even if a callback skips bytes
    tensors_[i].fill(buf.get(), n);
    out.Put(buf.get(), n);
  }
  return out.Finish();
}

absl::StatusOr<std::vector<uint8_t>> Writer::WriteToMemory() const {
  DS_ASSIGN_OR_RETURN(Layout layout, Plan());
  std::vector<uint8_t> bytes;
  DS_RETURN_IF_ERROR(WriteTo(layout, [&](const uint8_t* p, size_t n) {
    bytes.insert(bytes.end(), p, p + n);
    return absl::OkStatus();
  }));
  return bytes;
}

absl::Status Writer::WriteFile(const std::string& path) const {
  absl::StatusOr<Layout> layout = Plan();
  if (!layout.ok()) return Prefixed(layout.status(), absl::StrCat(path, ": "));
  // Write to a sibling temp file and rename, so a failed or interrupted write never leaves a
  // truncated file under the final name.
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot create ", tmp));
  }
  absl::Status s = WriteTo(*layout, [&](const uint8_t* p, size_t n) -> absl::Status {
    while (n > 0) {
      const ssize_t w = write(fd, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        return absl::ErrnoToStatus(err, absl::StrCat(path, ": write failed"));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return absl::OkStatus();
  });
  if (close(fd) != 0 && s.ok()) {
    const int err = errno;
    s = absl::ErrnoToStatus(err, absl::StrCat(path, ": close failed"));
  }
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    s = absl::ErrnoToStatus(err, absl::StrCat(path, ": rename from ", tmp, " failed"));
  }
  if (!s.ok()) unlink(tmp.c_str());
  return s;
}

}  // namespace ds::gguf
