// The size of one slot's state on the CUDA device, shared by the host snapshots
// (slot_state.cc) and the prefix cache's device checkpoints (slot_checkpoint.cc), which lay it
// out the same way: every GDN layer's conv ring + delta-rule state, every attention layer's K
// and V pages of the slot in position order.
#pragma once
#include <cstddef>
#include <vector>

#include "kernels/cuda/gdn.cuh"
#include "worker/cuda/cuda_device.h"

namespace ds::cuda {

// Bytes of one slot's recurrent state per GDN layer: its conv ring and its delta-rule state.
struct RecurrentBytes {
  size_t ring = 0, state = 0;
};
inline RecurrentBytes SlotRecurrentBytes(const GdnShape& s) {
  return {4ull * s.channels() * sizeof(float),
          static_cast<size_t>(s.v_heads) * s.k_dim * s.v_dim * sizeof(float)};
}

// Bytes of a slot's saved state: every GDN layer's ring + state, every attention layer's used
// K and V pages (kv_bytes of them together).
inline size_t SlotStateBytes(const std::vector<DLayer>& layers, const RecurrentBytes& rb,
                             size_t kv_bytes) {
  size_t total = 0;
  for (const DLayer& L : layers) total += L.rec ? rb.ring + rb.state : kv_bytes;
  return total;
}

}  // namespace ds::cuda
