// libFuzzer target for the GGUF reader: parse arbitrary bytes, touch everything a loader would
// read, and for accepted inputs check that Writer -> Parse reproduces the same file contents.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/gguf/gguf.h"

namespace {

using ds::gguf::Array;
using ds::gguf::File;
using ds::gguf::TensorInfo;
using ds::gguf::Value;
using ds::gguf::ValueType;

void Check(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "gguf_fuzz invariant failed: %s\n", what);
    std::abort();
  }
}

// Reads every byte of every value so ASan sees any dangling/out-of-range storage.
uint64_t Touch(const Value& v, int depth) {  // depth = number of enclosing arrays
  uint64_t h = static_cast<uint32_t>(v.type);
  if (const auto* s = std::get_if<std::string>(&v.v)) {
    for (char c : *s) h = h * 31 + static_cast<unsigned char>(c);
  } else if (const auto* a = std::get_if<Array>(&v.v)) {
    Check(depth < ds::gguf::kMaxArrayDepth, "nesting depth");
    for (const Value& item : a->items) {
      Check(item.type == a->elem_type, "array element type");
      h = h * 31 + Touch(item, depth + 1);
    }
  } else if (const auto* d = std::get_if<double>(&v.v)) {
    uint64_t bits;
    std::memcpy(&bits, d, 8);
    h ^= bits;
  } else if (const auto* u = std::get_if<uint64_t>(&v.v)) {
    h ^= *u;
  } else if (const auto* i = std::get_if<int64_t>(&v.v)) {
    h ^= static_cast<uint64_t>(*i);
  }
  return h;
}

void ExerciseGetters(const File& f, const std::string& key) {
  (void)f.GetUInt(key);
  (void)f.GetInt(key);
  (void)f.GetFloat(key);
  (void)f.GetBool(key);
  (void)f.GetString(key);
  (void)f.GetIntArray(key);
  (void)f.GetFloatArray(key);
  (void)f.GetStringArray(key);
  (void)f.GetUIntOr(key, 1);
  (void)f.GetFloatOr(key, 1.0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = File::Parse(data, size);
  if (!parsed.ok()) {
    Check(!parsed.status().message().empty(), "error message");
    return 0;
  }
  const File& f = **parsed;
  Check(f.version() == 2 || f.version() == 3, "version");
  Check(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0, "alignment");

  volatile uint64_t sink = 0;
  for (const auto& [key, v] : f.metadata()) {
    Check(f.Find(key) == &v, "key index");
    sink = sink + Touch(v, 0);
    ExerciseGetters(f, key);
  }
  (void)f.GetUInt("qwen35.block_count");  // typical loader lookups, usually absent

  ds::gguf::Writer w;
  w.SetAlignment(static_cast<uint32_t>(f.alignment()));
  for (const auto& [key, v] : f.metadata()) w.AddValue(key, v);
  for (const TensorInfo& t : f.tensors()) {
    Check(f.FindTensor(t.name) == &t, "tensor index");
    Check(t.n_dims >= 1 && t.n_dims <= 4, "n_dims");
    Check(t.n_elements() > 0, "n_elements");
    Check(t.nbytes == t.row_bytes() * static_cast<uint64_t>(t.n_rows()), "nbytes");
    Check(t.data >= data && t.data + t.nbytes <= data + size, "tensor data in range");
    if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
    w.AddTensorBytes(t.name, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims), t.type,
                     std::vector<uint8_t>(t.data, t.data + t.nbytes));
  }

  // Whatever the reader accepts the writer must be able to reproduce, and the copy must read back
  // identically (catches reader/writer disagreements on limits and encodings).
  auto image = w.WriteToMemory();
  Check(image.ok(), "writer accepts parsed file");
  auto again = File::Parse(image->data(), image->size());
  Check(again.ok(), "re-parse of written file");
  const File& g = **again;
  Check(g.metadata().size() == f.metadata().size(), "metadata count");
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    Check(g.metadata()[i].first == f.metadata()[i].first, "key order");
    Check(ds::gguf::SameValue(g.metadata()[i].second, f.metadata()[i].second), "value");
  }
  Check(g.tensors().size() == f.tensors().size(), "tensor count");
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const TensorInfo& a = f.tensors()[i];
    const TensorInfo& b = g.tensors()[i];
    Check(a.name == b.name && a.type == b.type && a.ne == b.ne && a.n_dims == b.n_dims &&
              a.nbytes == b.nbytes,
          "tensor info");
    Check(std::memcmp(a.data, b.data, a.nbytes) == 0, "tensor bytes");
  }
  return 0;
}
