#include "worker/runner/checkpoint_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ds {

CheckpointStore::CheckpointStore(Backend* backend, const CheckpointStoreOptions& opts)
    : backend_(backend), opts_(opts) {
  device_ = opts_.prefer_device && backend_->SupportsDeviceCheckpoints();
  stats_.budget_bytes = opts_.budget_bytes;
}

int32_t CheckpointStore::Length(uint64_t id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? -1 : it->second.n_past;
}

void CheckpointStore::Erase(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  stats_.used_bytes -= it->second.bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
  stats_.checkpoints = static_cast<int64_t>(entries_.size());
}

void CheckpointStore::Drop(uint64_t id) { Erase(id); }

void CheckpointStore::Clear() {
  while (!lru_.empty()) Erase(lru_.front());
}

bool CheckpointStore::MakeRoom(uint64_t need, uint64_t keep, std::span<const uint64_t> pinned,
                               std::vector<uint64_t>* evicted) {
  auto it = lru_.begin();
  while (stats_.used_bytes + need > opts_.budget_bytes && it != lru_.end()) {
    const uint64_t id = *it++;
    if (id == keep || std::find(pinned.begin(), pinned.end(), id) != pinned.end()) continue;
    Erase(id);
    ++stats_.evictions;
    if (evicted) evicted->push_back(id);
  }
  return stats_.used_bytes + need <= opts_.budget_bytes;
}

absl::StatusOr<uint64_t> CheckpointStore::Save(uint64_t id, int slot,
                                               std::span<const uint64_t> pinned,
                                               std::vector<uint64_t>* evicted) {
  if (!enabled()) return absl::FailedPreconditionError("the prefix cache is off");
  if (id == 0) return absl::InvalidArgumentError("checkpoint id 0 is reserved");
  if (entries_.contains(id))
    return absl::AlreadyExistsError(absl::StrCat("checkpoint ", id, " exists"));
  Entry e;
  bool saved = false;
  if (device_) {
    absl::StatusOr<std::unique_ptr<StateCheckpoint>> c = backend_->SaveCheckpoint(slot);
    // Device memory is short (the memory planner keeps the budget free, or a share of it with
    // the auto tier; other allocations may have taken some): drop least recently used device
    // checkpoints until it fits. If it still does not, the save fails rather than fall back to
    // host RAM: a host copy walks the page table with a synchronous copy per page inside the step
    // (~0.3 s for 16k tokens of the 27B), a hidden cost on every request. --prefix-cache-tier
    // host asks for that tier.
    while (!c.ok() && absl::IsResourceExhausted(c.status())) {
      uint64_t victim = 0;
      for (uint64_t v : lru_)
        if (entries_.at(v).device && std::find(pinned.begin(), pinned.end(), v) == pinned.end()) {
          victim = v;
          break;
        }
      if (victim == 0) break;
      Erase(victim);
      ++stats_.evictions;
      if (evicted) evicted->push_back(victim);
      c = backend_->SaveCheckpoint(slot);
    }
    if (c.ok()) {
      e.n_past = (*c)->n_past;
      e.bytes = (*c)->bytes;
      e.device = std::move(*c);
      saved = true;
    } else {
      ++stats_.failures;
      return c.status();
    }
  }
  if (!saved) {
    absl::StatusOr<SlotSnapshot> snap = backend_->Snapshot(slot);
    if (!snap.ok()) {
      ++stats_.failures;
      return snap.status();
    }
    e.n_past = snap->n_past;
    e.bytes = snap->bytes.size();
    e.host = std::move(*snap);
  }
  if (e.bytes > opts_.budget_bytes || !MakeRoom(e.bytes, id, pinned, evicted)) {
    ++stats_.failures;
    return absl::ResourceExhaustedError(
        absl::StrCat("checkpoint of ", e.n_past, " positions takes ", e.bytes,
                     " bytes; the prefix cache holds ", opts_.budget_bytes, " (",
                     stats_.used_bytes, " in pinned checkpoints)"));
  }
  const uint64_t bytes = e.bytes;
  lru_.push_back(id);
  e.lru = std::prev(lru_.end());
  entries_.emplace(id, std::move(e));
  stats_.used_bytes += bytes;
  stats_.checkpoints = static_cast<int64_t>(entries_.size());
  ++stats_.saves;
  return bytes;
}

absl::Status CheckpointStore::Restore(uint64_t id, int slot) {
  auto it = entries_.find(id);
  if (it == entries_.end())
    return absl::NotFoundError(absl::StrCat("checkpoint ", id, " is not in the prefix cache"));
  Entry& e = it->second;
  absl::Status st = e.device ? backend_->LoadCheckpoint(slot, *e.device)
                             : backend_->Restore(slot, e.host);
  if (!st.ok()) return st;
  lru_.splice(lru_.end(), lru_, e.lru);  // most recently used
  ++stats_.restores;
  return absl::OkStatus();
}

}  // namespace ds
