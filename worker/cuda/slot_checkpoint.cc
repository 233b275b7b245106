// CudaDevice (cuda_device.h): prefix-cache checkpoints in device memory (issue #17). The copy has
// SaveState's layout (every GDN layer's conv ring + delta-rule state, every attention layer's K
// and V pages of the slot in position order, then the MTP layer's rows: slot_bytes.h), but stays
// on the device: saving and loading are
// device-to-device copies queued on the stream with one synchronisation at the end, so a
// 16k-token checkpoint of the 27B (~1.2 GB) moves in milliseconds instead of the ~2.7 s its
// prefill takes: the recurrent layers are two copies each, an attention layer's K and V pages
// one CopyPages launch (one cudaMemcpy per page and layer was ~8,000 calls for a 16k
// checkpoint, tens of milliseconds of a resumed turn). The memory is the device's own
// allocation (cudaMalloc), beside the KV pool in the room the memory planner keeps for it; the
// worker's --prefix-cache-mb bounds it, and a failed allocation is ResourceExhausted (the store
// then evicts its least recently used device checkpoints, or does not save).
#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "worker/cuda/cuda_device.h"
#include "worker/cuda/slot_bytes.h"

namespace ds::cuda {

absl::StatusOr<std::shared_ptr<void>> CudaDevice::SaveStateOnDevice(int slot, int32_t n_past,
                                                                    uint64_t* bytes) const {
  const RecurrentBytes rb = SlotRecurrentBytes(gdn_shape_, copts_.gdn_state_bf16);
  const size_t page_bytes = kv_token_bytes_ * copts_.kv_page_size;
  const int pages = SlotPages(n_past);
  const size_t total = SavedStateBytes(n_past);
  // The memory planner leaves 512 MiB + 1% of the card free for graphs, sampler buffers and
  // library handles (runner/memory_planner.h); checkpoints never take that. Their own room is
  // the plan's `cache` (CudaBackendOptions::prefix_cache_bytes), which the planner keeps free
  // with that headroom on top.
  size_t free_bytes = 0, card_bytes = 0;
  DS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &card_bytes));
  const size_t keep = 2 * RuntimeHeadroom(card_bytes);
  if (free_bytes < total + keep)
    return absl::ResourceExhaustedError(absl::StrCat(
        "no device memory for a checkpoint of ", total, " bytes (", free_bytes, " free, ", keep,
        " kept for the runtime)"));
  void* raw = nullptr;
  if (cudaMalloc(&raw, total) != cudaSuccess) {
    cudaGetLastError();  // clear the allocation error: the device stays usable
    return absl::ResourceExhaustedError(
        absl::StrCat("no device memory for a checkpoint of ", total, " bytes"));
  }
  std::shared_ptr<void> mem(raw, [](void* p) { cudaFree(p); });
  uint8_t* p = static_cast<uint8_t*>(raw);
  for (const DLayer& L : layers_) {
    if (L.rec) {
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(p, reinterpret_cast<uint8_t*>(L.ring) + slot * rb.ring,
                                              rb.ring, cudaMemcpyDeviceToDevice, stream_));
      p += rb.ring;
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(p, reinterpret_cast<uint8_t*>(L.state) + slot * rb.state,
                                              rb.state, cudaMemcpyDeviceToDevice, stream_));
      p += rb.state;
    } else {
      DS_RETURN_IF_ERROR(CopyPages(LayerPageCopy(L, SlotPageTable(slot), pages, page_bytes, p,
                                                 /*to_packed=*/true), stream_));
      p += 2 * static_cast<size_t>(pages) * page_bytes;
    }
  }
  DS_RETURN_IF_ERROR(CopyMtpPart(slot, n_past, p, /*on_host=*/false, nullptr, /*to_saved=*/true));
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  *bytes = total;
  return mem;
}

absl::Status CudaDevice::LoadStateFromDevice(int slot, int32_t n_past, const void* src,
                                             uint64_t bytes) {
  const RecurrentBytes rb = SlotRecurrentBytes(gdn_shape_, copts_.gdn_state_bf16);
  const size_t page_bytes = kv_token_bytes_ * copts_.kv_page_size;
  const int pages = SlotPages(n_past);
  const size_t total = SavedStateBytes(n_past);
  if (bytes != total)
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint of ", bytes, " bytes, a slot of ", n_past, " positions takes ",
                     total));
  DropSpeculation(slot);
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (DLayer& L : layers_) {
    if (L.rec) {
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(reinterpret_cast<uint8_t*>(L.ring) + slot * rb.ring, p,
                                              rb.ring, cudaMemcpyDeviceToDevice, stream_));
      p += rb.ring;
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(reinterpret_cast<uint8_t*>(L.state) + slot * rb.state,
                                              p, rb.state, cudaMemcpyDeviceToDevice, stream_));
      p += rb.state;
    } else {
      DS_RETURN_IF_ERROR(CopyPages(LayerPageCopy(L, SlotPageTable(slot), pages, page_bytes,
                                                 const_cast<uint8_t*>(p), /*to_packed=*/false),
                                   stream_));
      p += 2 * static_cast<size_t>(pages) * page_bytes;
    }
  }
  DS_RETURN_IF_ERROR(CopyMtpPart(slot, n_past, const_cast<uint8_t*>(p), /*on_host=*/false, nullptr,
                                 /*to_saved=*/false));
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (mtp_page_bytes_ > 0) mtp_len_[slot] = n_past;
  return absl::OkStatus();
}

}  // namespace ds::cuda
