// KvPagePool: the host-side allocator of a worker's paged KV cache (issue #23). The device holds
// n_pages pages of page_size token rows per attention layer (K and V) shared by every slot; this
// class decides which page holds which rows of which slot. A slot takes pages as its sequence
// grows (Grow) and gives all of them back when it ends or is preempted (Release). Page tables
// are per slot, in position order: token `pos` of slot s lives in page pages(s)[pos / page_size],
// row pos % page_size — the layout every attention kernel (kernels/cpu/attention.h,
// kernels/cuda/attention.cuh) reads.
//
// Free pages are handed out lowest index first (a sorted free set), so a run is deterministic and
// a short-lived slot's pages are reused at once. Owned by the StepRunner; not thread-safe.
#pragma once
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/util/status.h"
#include "worker/model/backend.h"

namespace ds {

class KvPagePool {
 public:
  KvPagePool() = default;
  // n_pages pages of page_size tokens shared by n_slots slots of at most max_pages_per_slot pages.
  static absl::StatusOr<KvPagePool> Create(int64_t n_pages, int page_size, int n_slots,
                                           int max_pages_per_slot);

  int page_size() const { return page_size_; }
  int64_t total_pages() const { return n_pages_; }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  KvPoolStats stats() const { return {page_size_, n_pages_, free_pages()}; }
  // Pages a slot needs to hold n_tokens rows, and how many more than it has now.
  int64_t PagesFor(int64_t n_tokens) const { return (n_tokens + page_size_ - 1) / page_size_; }
  int64_t PagesToGrow(int slot, int64_t n_tokens) const;
  // The slot's pages in position order.
  std::span<const int32_t> pages(int slot) const { return tables_[slot]; }

  // Gives `slot` pages until it can hold n_tokens rows. Returns the index (in its table) of the
  // first new page, so the caller maps only those. ResourceExhausted (nothing taken) when the
  // free pages do not suffice; OutOfRange when n_tokens exceeds the per-slot maximum.
  absl::StatusOr<int> Grow(int slot, int64_t n_tokens);
  // Returns every page of the slot to the pool.
  void Release(int slot);

  // Every page is either free or in exactly one slot's table, no table exceeds its maximum:
  // Internal error naming the first violation (tests; cheap enough to assert in debug runs).
  absl::Status CheckConsistent() const;

 private:
  int64_t n_pages_ = 0;
  int page_size_ = 0;
  int max_pages_per_slot_ = 0;
  std::vector<std::vector<int32_t>> tables_;  // [n_slots] pages in position order
  std::set<int32_t> free_;
};

}  // namespace ds
