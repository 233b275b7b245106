#include "worker/runner/kv_page_pool.h"

#include "absl/strings/str_cat.h"

namespace ds {

absl::StatusOr<KvPagePool> KvPagePool::Create(int64_t n_pages, int page_size, int n_slots,
                                              int max_pages_per_slot) {
  if (n_pages < 1 || n_pages > INT32_MAX || page_size < 1 || n_slots < 1 || max_pages_per_slot < 1)
    return absl::InvalidArgumentError(absl::StrCat("KV page pool: n_pages ", n_pages, ", page_size ",
                                                   page_size, ", n_slots ", n_slots,
                                                   ", max_pages_per_slot ", max_pages_per_slot,
                                                   " must all be >= 1"));
  KvPagePool p;
  p.n_pages_ = n_pages;
  p.page_size_ = page_size;
  p.max_pages_per_slot_ = max_pages_per_slot;
  p.tables_.resize(n_slots);
  for (int64_t i = 0; i < n_pages; ++i) p.free_.insert(p.free_.end(), static_cast<int32_t>(i));
  return p;
}

int64_t KvPagePool::PagesToGrow(int slot, int64_t n_tokens) const {
  const int64_t have = static_cast<int64_t>(tables_[slot].size());
  return std::max<int64_t>(0, PagesFor(n_tokens) - have);
}

absl::StatusOr<int> KvPagePool::Grow(int slot, int64_t n_tokens) {
  const int64_t want = PagesFor(n_tokens);
  if (want > max_pages_per_slot_)
    return absl::OutOfRangeError(absl::StrCat("KV page pool: slot ", slot, " would hold ", n_tokens,
                                              " tokens = ", want, " pages > ", max_pages_per_slot_,
                                              " pages per slot"));
  std::vector<int32_t>& t = tables_[slot];
  const int first = static_cast<int>(t.size());
  const int64_t more = want - first;
  if (more <= 0) return first;
  if (more > free_pages())
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV page pool: slot ", slot, " needs ", more, " more pages (", n_tokens, " tokens), ",
        free_pages(), " of ", n_pages_, " free"));
  for (int64_t i = 0; i < more; ++i) {
    t.push_back(*free_.begin());
    free_.erase(free_.begin());
  }
  return first;
}

void KvPagePool::Release(int slot) {
  for (int32_t p : tables_[slot]) free_.insert(p);
  tables_[slot].clear();
}

absl::Status KvPagePool::CheckConsistent() const {
  std::vector<int> owner(n_pages_, -2);  // -2 nowhere, -1 free, else the slot
  for (int32_t p : free_) {
    if (p < 0 || p >= n_pages_) return absl::InternalError(absl::StrCat("free page ", p, " out of range"));
    owner[p] = -1;
  }
  for (size_t s = 0; s < tables_.size(); ++s) {
    if (static_cast<int>(tables_[s].size()) > max_pages_per_slot_)
      return absl::InternalError(absl::StrCat("slot ", s, " holds ", tables_[s].size(), " pages"));
    for (int32_t p : tables_[s]) {
      if (p < 0 || p >= n_pages_) return absl::InternalError(absl::StrCat("page ", p, " out of range"));
      if (owner[p] != -2)
        return absl::InternalError(absl::StrCat("page ", p, " of slot ", s, " is also ",
                                                owner[p] == -1 ? std::string("free")
                                                               : absl::StrCat("in slot ", owner[p])));
      owner[p] = static_cast<int>(s);
    }
  }
  for (int64_t p = 0; p < n_pages_; ++p)
    if (owner[p] == -2) return absl::InternalError(absl::StrCat("page ", p, " leaked"));
  return absl::OkStatus();
}

}  // namespace ds
