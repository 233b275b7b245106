// The one snapshot format of a slot's state (Backend::Snapshot / Restore), for every device:
//
//   magic "DSSLOT01" (8 bytes) | u32 version | u32 layout length | layout (UTF-8) |
//   i32 n_past | u64 payload length | payload
//
// little-endian. `layout` names the device's state layout (Device::state_layout(): e.g. "cpu f32"
// or "cuda kv=f16 page=64", plus the local head counts), so a snapshot is restored only where its
// payload means the same thing, and a foreign one is refused with both layouts in the message.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/util/status.h"

namespace ds {

inline constexpr uint32_t kSlotSnapshotVersion = 1;

std::vector<uint8_t> EncodeSlotSnapshot(const std::string& layout, int32_t n_past,
                                        std::span<const uint8_t> payload);

struct DecodedSlotSnapshot {
  std::string layout;
  int32_t n_past = 0;
  std::span<const uint8_t> payload;  // a view into the encoded bytes
};

// InvalidArgument naming what is wrong (magic, version, truncation, trailing bytes).
absl::StatusOr<DecodedSlotSnapshot> DecodeSlotSnapshot(std::span<const uint8_t> bytes);

}  // namespace ds
