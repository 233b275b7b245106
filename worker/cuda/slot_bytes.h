// The layout of one slot's saved state on the CUDA device, shared by the host snapshots
// (slot_state.cc) and the prefix cache's device checkpoints (slot_checkpoint.cc): every GDN
// layer's conv ring + delta-rule state, every attention layer's K and V pages of the slot in
// position order.
#pragma once
#include <cstddef>
#include <vector>

#include "kernels/cuda/gdn.cuh"
#include "kernels/cuda/page_copy.cuh"
#include "worker/cuda/cuda_device.h"

namespace ds::cuda {

// Bytes of one slot's recurrent state per GDN layer: its conv ring (f32) and its delta-rule
// state (f32, or bf16 with CudaBackendOptions::gdn_state_bf16).
struct RecurrentBytes {
  size_t ring = 0, state = 0;
};
inline RecurrentBytes SlotRecurrentBytes(const GdnShape& s, bool state_bf16) {
  return {4ull * s.channels() * sizeof(float),
          static_cast<size_t>(s.v_heads) * s.k_dim * s.v_dim * GdnStateElemBytes(state_bf16)};
}

// Bytes of a slot's saved state: every GDN layer's ring + state, every attention layer's used
// K and V pages (kv_bytes of them together).
inline size_t SlotStateBytes(const std::vector<DLayer>& layers, const RecurrentBytes& rb,
                             size_t kv_bytes) {
  size_t total = 0;
  for (const DLayer& L : layers) total += L.rec ? rb.ring + rb.state : kv_bytes;
  return total;
}

// The MTP block's part of a slot's saved state (after the layers; devices with the block): its
// f16 K and V pages of the slot, then one mask byte per position [0, n_past) (set only below
// MtpRowsKept, worker/runner/device.h).
inline size_t MtpStateBytes(int pages, size_t mtp_page_bytes, int32_t n_past) {
  return mtp_page_bytes == 0 ? 0 : 2 * static_cast<size_t>(pages) * mtp_page_bytes + n_past;
}
// One attention layer's K then V pages of a slot (device page ids `d_pages`, `pages` of them)
// <-> `packed` (K pages, then V pages); `to_packed` copies pool -> packed.
inline PageCopyArgs LayerPageCopy(const DLayer& L, const int32_t* d_pages, int pages,
                                  size_t page_bytes, uint8_t* packed, bool to_packed) {
  PageCopyArgs a;
  a.pool[0] = L.kc;
  a.pool[1] = L.vc;
  a.packed[0] = packed;
  a.packed[1] = packed + static_cast<size_t>(pages) * page_bytes;
  a.n_pools = 2;
  a.pages = d_pages;
  a.n_pages = pages;
  a.page_bytes = page_bytes;
  a.to_packed = to_packed;
  return a;
}

}  // namespace ds::cuda
