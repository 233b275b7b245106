// Shard views (see shard.h).
#include "worker/tp/shard.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/quant.h"

namespace ds::tp {
namespace {

absl::Status CheckRanges(const Cut& cut, int64_t limit, const std::string& name, const char* dim) {
  for (const Range& r : cut.ranges)
    if (r.begin < 0 || r.end < r.begin || r.end > limit)
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": shard ", dim, " [",
                                                     r.begin, ", ", r.end, ") outside [0, ",
                                                     limit, ")"));
  return absl::OkStatus();
}

int64_t Total(const Cut& cut) {
  int64_t n = 0;
  for (const Range& r : cut.ranges) n += r.size();
  return n;
}

}  // namespace

absl::StatusOr<cpu::WeightView> CutMatrix(const cpu::WeightView& w, const Cut& cut,
                                          const std::string& name, ShardStore* store,
                                          uint64_t* dequantized_bytes) {
  if (cut.kind == Cut::kAll) return w;
  const uint64_t rb = GgmlRowBytes(w.type, w.cols);
  const auto* base = static_cast<const uint8_t*>(w.data);
  if (cut.kind == Cut::kRows) {
    DS_RETURN_IF_ERROR(CheckRanges(cut, w.rows, name, "rows"));
    const int64_t n = Total(cut);
    if (cut.ranges.size() == 1)  // zero copy: a contiguous row range of the mapping
      return cpu::WeightView{w.type, base + cut.ranges[0].begin * rb, w.cols, n};
    std::vector<uint8_t> buf(static_cast<size_t>(n) * rb);
    uint8_t* dst = buf.data();
    for (const Range& r : cut.ranges) {
      if (r.size()) std::memcpy(dst, base + r.begin * rb, r.size() * rb);
      dst += r.size() * rb;
    }
    store->push_back(std::move(buf));
    return cpu::WeightView{w.type, store->back().data(), w.cols, n};
  }
  DS_RETURN_IF_ERROR(CheckRanges(cut, w.cols, name, "columns"));
  const int64_t n = Total(cut);
  const GgmlTypeInfo& ti = GgmlInfo(w.type);
  bool aligned = true;
  for (const Range& r : cut.ranges)
    aligned &= r.begin % ti.block_elems == 0 && r.end % ti.block_elems == 0;
  if (aligned) {
    // Whole blocks: each output row is the concatenation of the selected blocks of the input row.
    const uint64_t out_rb = GgmlRowBytes(w.type, n);
    std::vector<uint8_t> buf(static_cast<size_t>(w.rows) * out_rb);
    for (int64_t row = 0; row < w.rows; ++row) {
      uint8_t* dst = buf.data() + row * out_rb;
      for (const Range& r : cut.ranges) {
        const uint64_t off = GgmlRowBytes(w.type, r.begin), len = GgmlRowBytes(w.type, r.size());
        if (len) std::memcpy(dst, base + row * rb + off, len);
        dst += len;
      }
    }
    store->push_back(std::move(buf));
    return cpu::WeightView{w.type, store->back().data(), n, w.rows};
  }
  // Unaligned slice of a block format: dequantize the row once, keep the selected f32 values.
  std::vector<uint8_t> buf(static_cast<size_t>(w.rows) * n * sizeof(float));
  std::vector<float> full(w.cols);  // [cols]
  auto* out = reinterpret_cast<float*>(buf.data());
  for (int64_t row = 0; row < w.rows; ++row) {
    cpu::DequantizeRow(w.type, base + row * rb, full.data(), w.cols);
    float* dst = out + row * n;
    for (const Range& r : cut.ranges) {
      std::memcpy(dst, full.data() + r.begin, r.size() * sizeof(float));
      dst += r.size();
    }
  }
  if (dequantized_bytes) *dequantized_bytes += buf.size();
  store->push_back(std::move(buf));
  return cpu::WeightView{GgmlType::F32, store->back().data(), n, w.rows};
}

absl::StatusOr<std::vector<float>> CutFloats(const std::vector<float>& full, int64_t ne0,
                                             const Cut& cut, const std::string& name) {
  if (cut.kind == Cut::kAll) return full;
  const int64_t rows = ne0 ? static_cast<int64_t>(full.size()) / ne0 : 0;
  std::vector<float> out;
  if (cut.kind == Cut::kRows) {
    DS_RETURN_IF_ERROR(CheckRanges(cut, rows, name, "rows"));
    for (const Range& r : cut.ranges)
      out.insert(out.end(), full.begin() + r.begin * ne0, full.begin() + r.end * ne0);
    return out;
  }
  DS_RETURN_IF_ERROR(CheckRanges(cut, ne0, name, "columns"));
  for (int64_t row = 0; row < rows; ++row)
    for (const Range& r : cut.ranges)
      out.insert(out.end(), full.begin() + row * ne0 + r.begin, full.begin() + row * ne0 + r.end);
  return out;
}

}  // namespace ds::tp
