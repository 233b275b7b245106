// CudaDevice (cuda_device.h): a slot's state — its page table (MapPages), reset, save to the
// host, load from it (slot_bytes.h: the layers, then the MTP layer's rows). The slot's KV pages are wherever the runner's pool put them (issue #23):
// save and load gather / scatter them per attention layer through a temporary device buffer
// (one CopyPages launch and one host copy per layer), or, when that buffer cannot be had, walk
// the page table with a copy per page.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "worker/cuda/cuda_device.h"
#include "worker/cuda/slot_bytes.h"
#include "worker/model/kv_type.h"

namespace ds::cuda {
namespace {

// A device buffer for one attention layer's K and V pages of a slot; empty when the device has
// no memory for it (the callers then copy page by page).
struct PageStage {
  uint8_t* p = nullptr;
  explicit PageStage(size_t bytes) {
    if (bytes > 0 && cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the allocation error: the device stays usable
      p = nullptr;
    }
  }
  ~PageStage() { cudaFree(p); }
  PageStage(const PageStage&) = delete;
  PageStage& operator=(const PageStage&) = delete;
};

// One attention layer's K then V pages of a slot <-> `host`, through `stage`; synchronous.
absl::Status LayerPagesThroughStage(const DLayer& L, const int32_t* d_pages, int pages,
                                    size_t page_bytes, uint8_t* stage, uint8_t* host, bool to_host,
                                    cudaStream_t stream) {
  const PageCopyArgs a = LayerPageCopy(L, d_pages, pages, page_bytes, stage, to_host);
  const size_t bytes = 2 * static_cast<size_t>(pages) * page_bytes;
  if (to_host) {
    DS_RETURN_IF_ERROR(CopyPages(a, stream));
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, stage, bytes, cudaMemcpyDefault, stream));
  } else {
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(stage, host, bytes, cudaMemcpyDefault, stream));
    DS_RETURN_IF_ERROR(CopyPages(a, stream));
  }
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaDevice::MapPages(int slot, int first, std::span<const int32_t> pages) {
  if (slot < 0 || slot >= n_slots_ || first < 0 || first + static_cast<int64_t>(pages.size()) > max_pages_)
    return absl::OutOfRangeError(absl::StrCat("MapPages: slot ", slot, " entries [", first, ", ",
                                              first + pages.size(), ") of ", max_pages_));
  int32_t* row = h_table_.data() + static_cast<size_t>(slot) * max_pages_;
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0 || pages[i] >= n_pages_)
      return absl::OutOfRangeError(absl::StrCat("MapPages: page ", pages[i], " not in [0, ",
                                                n_pages_, ")"));
    row[first + i] = pages[i];
  }
  // Between micro-steps (the stream is idle after Finish), so a blocking copy costs one small
  // transfer per page boundary a slot crosses.
  if (!pages.empty())
    DS_RETURN_IF_ERROR(Copy(d_table_ + static_cast<size_t>(slot) * max_pages_ + first, row + first,
                            pages.size() * sizeof(int32_t)));
  return absl::OkStatus();
}

void CudaDevice::ResetSlot(int slot) {
  const RecurrentBytes rb = SlotRecurrentBytes(gdn_shape_, copts_.gdn_state_bf16);
  for (DLayer& L : layers_) {
    if (!L.rec) continue;
    cudaMemsetAsync(reinterpret_cast<uint8_t*>(L.ring) + slot * rb.ring, 0, rb.ring, stream_);
    cudaMemsetAsync(reinterpret_cast<uint8_t*>(L.state) + slot * rb.state, 0, rb.state, stream_);
  }
  DropSpeculation(slot);
  cudaStreamSynchronize(stream_);
}

void CudaDevice::DropSpeculation(int slot) {
  spec_last_[slot] = -1;
  spec_last_pos_[slot] = -1;
  // No MTP row of the slot is valid any more (its pages may go to other slots).
  if (has_mtp_ && mtp_len_[slot] > 0)
    cudaMemsetAsync(mtp_valid_ + static_cast<size_t>(slot) * slot_ctx_, 0, mtp_len_[slot], stream_);
  mtp_len_[slot] = 0;
}

std::string CudaDevice::state_layout() const {
  return absl::StrCat("cuda kv=", KvTypeName(copts_.kv_type), " page=", copts_.kv_page_size,
                      " gdn=", gdn_shape_.k_heads, "x", gdn_shape_.v_heads,
                      " kv_heads=", attn_shape_.n_kv, " layers=", layers_.size(),
                      " mtp=", mtp_page_bytes_ > 0 ? 1 : 0,
                      // Only when bf16: the f32 layout's name (and its saved snapshots) unchanged.
                      copts_.gdn_state_bf16 ? " gdn_state=bf16" : "");
}

size_t CudaDevice::SavedStateBytes(int32_t n_past) const {
  const int pages = SlotPages(n_past);
  return SlotStateBytes(layers_, SlotRecurrentBytes(gdn_shape_, copts_.gdn_state_bf16),
                        2 * pages * kv_token_bytes_ * copts_.kv_page_size) +
         MtpStateBytes(pages, mtp_page_bytes_, n_past);
}

absl::Status CudaDevice::HostLayerPages(const DLayer& L, int slot, int pages, size_t page_bytes,
                                        uint8_t* stage, uint8_t* host, bool to_host) const {
  if (stage != nullptr)
    return LayerPagesThroughStage(L, SlotPageTable(slot), pages, page_bytes, stage, host, to_host,
                                  stream_);
  for (uint8_t* pool : {L.kc, L.vc})
    for (int i = 0; i < pages; ++i) {
      uint8_t* dev = pool + static_cast<size_t>(h_table_[static_cast<size_t>(slot) * max_pages_ + i]) * page_bytes;
      DS_RETURN_IF_ERROR(to_host ? Copy(host, dev, page_bytes) : Copy(dev, host, page_bytes));
      host += page_bytes;
    }
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyMtpPart(int slot, int32_t n_past, uint8_t* saved, bool on_host,
                                     uint8_t* stage, bool to_saved) const {
  if (mtp_page_bytes_ == 0) return absl::OkStatus();
  const int pages = SlotPages(n_past);
  uint8_t* mask_saved = saved + 2 * static_cast<size_t>(pages) * mtp_page_bytes_;
  uint8_t* mask = mtp_valid_ + static_cast<size_t>(slot) * slot_ctx_;
  if (on_host) {
    DS_RETURN_IF_ERROR(
        HostLayerPages(mtp_layer_, slot, pages, mtp_page_bytes_, stage, saved, to_saved));
  } else {
    DS_RETURN_IF_ERROR(CopyPages(
        LayerPageCopy(mtp_layer_, SlotPageTable(slot), pages, mtp_page_bytes_, saved, to_saved),
        stream_));
  }
  if (!to_saved) {
    DS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(mask, mask_saved, n_past, cudaMemcpyDefault, stream_));
    return absl::OkStatus();
  }
  const int32_t kept = MtpRowsKept(mtp_len_[slot], n_past);
  if (kept > 0)
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mask_saved, mask, kept, cudaMemcpyDefault, stream_));
  if (on_host) {
    std::memset(mask_saved + kept, 0, n_past - kept);  // the async copy writes [0, kept) only
  } else {
    DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(mask_saved + kept, 0, n_past - kept, stream_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> CudaDevice::SaveState(int slot, int32_t n_past) const {
  const RecurrentBytes rb = SlotRecurrentBytes(gdn_shape_, copts_.gdn_state_bf16);
  const size_t page_bytes = kv_token_bytes_ * copts_.kv_page_size;
  const int pages = SlotPages(n_past);
  std::vector<uint8_t> bytes(SavedStateBytes(n_past));
  uint8_t* p = bytes.data();
  const PageStage stage(2 * static_cast<size_t>(pages) * std::max(page_bytes, mtp_page_bytes_));
  for (const DLayer& L : layers_) {
    if (L.rec) {
      DS_RETURN_IF_ERROR(Copy(p, reinterpret_cast<uint8_t*>(L.ring) + slot * rb.ring, rb.ring));
      p += rb.ring;
      DS_RETURN_IF_ERROR(Copy(p, reinterpret_cast<uint8_t*>(L.state) + slot * rb.state, rb.state));
      p += rb.state;
    } else {
      DS_RETURN_IF_ERROR(HostLayerPages(L, slot, pages, page_bytes, stage.p, p, /*to_host=*/true));
      p += 2 * static_cast<size_t>(pages) * page_bytes;
    }
  }
  DS_RETURN_IF_ERROR(CopyMtpPart(slot, n_past, p, /*on_host=*/true, stage.p, /*to_saved=*/true));
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return bytes;
}

absl::Status CudaDevice::LoadState(int slot, int32_t n_past, std::span<const uint8_t> bytes) {
  const RecurrentBytes rb = SlotRecurrentBytes(gdn_shape_, copts_.gdn_state_bf16);
  const size_t page_bytes = kv_token_bytes_ * copts_.kv_page_size;
  const int pages = SlotPages(n_past);
  const size_t total = SavedStateBytes(n_past);
  if (bytes.size() != total)
    return absl::InvalidArgumentError(
        absl::StrCat("Restore: state of ", bytes.size(), " bytes, expected ", total));
  uint8_t* p = const_cast<uint8_t*>(bytes.data());  // only read: the copies go to the device
  DropSpeculation(slot);
  const PageStage stage(2 * static_cast<size_t>(pages) * std::max(page_bytes, mtp_page_bytes_));
  for (DLayer& L : layers_) {
    if (L.rec) {
      DS_RETURN_IF_ERROR(Copy(reinterpret_cast<uint8_t*>(L.ring) + slot * rb.ring, p, rb.ring));
      p += rb.ring;
      DS_RETURN_IF_ERROR(Copy(reinterpret_cast<uint8_t*>(L.state) + slot * rb.state, p, rb.state));
      p += rb.state;
    } else {
      DS_RETURN_IF_ERROR(HostLayerPages(L, slot, pages, page_bytes, stage.p, p, /*to_host=*/false));
      p += 2 * static_cast<size_t>(pages) * page_bytes;
    }
  }
  DS_RETURN_IF_ERROR(CopyMtpPart(slot, n_past, p, /*on_host=*/true, stage.p, /*to_saved=*/false));
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (mtp_page_bytes_ > 0) mtp_len_[slot] = n_past;
  return absl::OkStatus();
}

}  // namespace ds::cuda
