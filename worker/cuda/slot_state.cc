// CudaDevice (cuda_device.h): a slot's state — its page table (MapPages), reset, save to the
// host, load from it. The slot's KV pages are wherever the runner's pool put them (issue #23):
// save and load gather / scatter them per attention layer through a temporary device buffer
// (one CopyPages launch and one host copy per layer), or, when that buffer cannot be had, walk
// the page table with a copy per page.
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
  const RecurrentBytes rb = SlotRecurrentBytes(gdn_shape_);
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
                      " gdn=", gdn_shape_.k_heads, "x", gdn_shape_.v_heads, " kv_heads=",
                      attn_shape_.n_kv, " layers=", layers_.size());
}

absl::StatusOr<std::vector<uint8_t>> CudaDevice::SaveState(int slot, int32_t n_past) const {
  const RecurrentBytes rb = SlotRecurrentBytes(gdn_shape_);
  const size_t page_bytes = kv_token_bytes_ * copts_.kv_page_size;
  const int pages = (n_past + copts_.kv_page_size - 1) / copts_.kv_page_size;
  const size_t total = SlotStateBytes(layers_, rb, 2 * pages * page_bytes);
  std::vector<uint8_t> bytes(total);
  uint8_t* p = bytes.data();
  const PageStage stage(2 * static_cast<size_t>(pages) * page_bytes);
  for (const DLayer& L : layers_) {
    if (L.rec) {
      DS_RETURN_IF_ERROR(Copy(p, reinterpret_cast<uint8_t*>(L.ring) + slot * rb.ring, rb.ring));
      p += rb.ring;
      DS_RETURN_IF_ERROR(Copy(p, reinterpret_cast<uint8_t*>(L.state) + slot * rb.state, rb.state));
      p += rb.state;
    } else if (stage.p != nullptr) {
      DS_RETURN_IF_ERROR(LayerPagesThroughStage(L, SlotPageTable(slot), pages, page_bytes, stage.p,
                                                p, /*to_host=*/true, stream_));
      p += 2 * static_cast<size_t>(pages) * page_bytes;
    } else {
      for (const uint8_t* pool : {L.kc, L.vc})
        for (int i = 0; i < pages; ++i) {
          const size_t off = static_cast<size_t>(h_table_[static_cast<size_t>(slot) * max_pages_ + i]) * page_bytes;
          DS_RETURN_IF_ERROR(Copy(p, pool + off, page_bytes));
          p += page_bytes;
        }
    }
  }
  return bytes;
}

absl::Status CudaDevice::LoadState(int slot, int32_t n_past, std::span<const uint8_t> bytes) {
  const RecurrentBytes rb = SlotRecurrentBytes(gdn_shape_);
  const size_t page_bytes = kv_token_bytes_ * copts_.kv_page_size;
  const int pages = (n_past + copts_.kv_page_size - 1) / copts_.kv_page_size;
  const size_t total = SlotStateBytes(layers_, rb, 2 * pages * page_bytes);
  if (bytes.size() != total)
    return absl::InvalidArgumentError(
        absl::StrCat("Restore: state of ", bytes.size(), " bytes, expected ", total));
  const uint8_t* p = bytes.data();
  // Snapshots hold no MTP rows (the drafts after a restore start from an empty MTP cache).
  DropSpeculation(slot);
  const PageStage stage(2 * static_cast<size_t>(pages) * page_bytes);
  for (DLayer& L : layers_) {
    if (L.rec) {
      DS_RETURN_IF_ERROR(Copy(reinterpret_cast<uint8_t*>(L.ring) + slot * rb.ring, p, rb.ring));
      p += rb.ring;
      DS_RETURN_IF_ERROR(Copy(reinterpret_cast<uint8_t*>(L.state) + slot * rb.state, p, rb.state));
      p += rb.state;
    } else if (stage.p != nullptr) {
      DS_RETURN_IF_ERROR(LayerPagesThroughStage(L, SlotPageTable(slot), pages, page_bytes, stage.p,
                                                const_cast<uint8_t*>(p), /*to_host=*/false, stream_));
      p += 2 * static_cast<size_t>(pages) * page_bytes;
    } else {
      for (uint8_t* pool : {L.kc, L.vc})
        for (int i = 0; i < pages; ++i) {
          const size_t off = static_cast<size_t>(h_table_[static_cast<size_t>(slot) * max_pages_ + i]) * page_bytes;
          DS_RETURN_IF_ERROR(Copy(pool + off, p, page_bytes));
          p += page_bytes;
        }
    }
  }
  return absl::OkStatus();
}

}  // namespace ds::cuda
