#include "worker/runner/slot_snapshot.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ds {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'S', 'L', 'O', 'T', '0', '1'};

template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + sizeof(T));
}

}  // namespace

std::vector<uint8_t> EncodeSlotSnapshot(const std::string& layout, int32_t n_past,
                                        std::span<const uint8_t> payload) {
  std::vector<uint8_t> out;
  out.reserve(sizeof(kMagic) + 20 + layout.size() + payload.size());
  out.insert(out.end(), kMagic, kMagic + sizeof(kMagic));
  Put<uint32_t>(&out, kSlotSnapshotVersion);
  Put<uint32_t>(&out, static_cast<uint32_t>(layout.size()));
  out.insert(out.end(), layout.begin(), layout.end());
  Put<int32_t>(&out, n_past);
  Put<uint64_t>(&out, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

absl::StatusOr<DecodedSlotSnapshot> DecodeSlotSnapshot(std::span<const uint8_t> bytes) {
  size_t at = 0;
  auto take = [&](void* dst, size_t n) {
    if (bytes.size() - at < n) return false;
    std::memcpy(dst, bytes.data() + at, n);
    at += n;
    return true;
  };
  char magic[sizeof(kMagic)];
  if (!take(magic, sizeof(magic)) || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0)
    return absl::InvalidArgumentError("slot snapshot: not a deltaserve slot snapshot (bad magic)");
  uint32_t version = 0, layout_len = 0;
  if (!take(&version, 4)) return absl::InvalidArgumentError("slot snapshot: truncated header");
  if (version != kSlotSnapshotVersion)
    return absl::InvalidArgumentError(absl::StrCat("slot snapshot: version ", version,
                                                   ", this build reads version ",
                                                   kSlotSnapshotVersion));
  if (!take(&layout_len, 4) || bytes.size() - at < layout_len)
    return absl::InvalidArgumentError("slot snapshot: truncated header");
  DecodedSlotSnapshot d;
  d.layout.assign(reinterpret_cast<const char*>(bytes.data() + at), layout_len);
  at += layout_len;
  uint64_t payload_len = 0;
  if (!take(&d.n_past, 4) || !take(&payload_len, 8))
    return absl::InvalidArgumentError("slot snapshot: truncated header");
  if (bytes.size() - at != payload_len)
    return absl::InvalidArgumentError(absl::StrCat("slot snapshot: payload of ",
                                                   bytes.size() - at, " bytes, header says ",
                                                   payload_len));
  d.payload = bytes.subspan(at);
  return d;
}

}  // namespace ds
