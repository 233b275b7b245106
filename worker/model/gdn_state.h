// Storage of the Gated DeltaNet recurrent state between steps (`--gdn-state f32|bf16`, issue #22;
// BackendOptions::gdn_state_bf16): f32 (default), or bf16 rounded to nearest even with every
// step's arithmetic still f32. The CUDA backend stores it so (CudaBackendOptions::gdn_state_bf16:
// half the state bytes per slot and per batched decode step); the CPU backend keeps f32 storage
// and rounds the values the same way (the emulation docs/quality.md measured).
// Header-only so tools that merely forward the flag (serve) can validate it without linking.
#pragma once
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ds {

// true = bf16.
inline absl::StatusOr<bool> ParseGdnState(std::string_view name) {
  if (name == "f32") return false;
  if (name == "bf16") return true;
  return absl::InvalidArgumentError("--gdn-state expects f32 or bf16, got '" + std::string(name) +
                                    "'");
}

constexpr const char* GdnStateName(bool bf16) { return bf16 ? "bf16" : "f32"; }

}  // namespace ds
