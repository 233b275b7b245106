// CheckpointStore: the worker's half of the prefix cache (issue #17).
//
// A checkpoint is one slot's whole state at an exact position: the attention KV rows [0, n_past)
// plus every DeltaNet layer's conv ring and delta-rule state after token n_past - 1. A recurrent
// state cannot be cut at an earlier token, so a checkpoint is taken exactly where a later request
// may resume (the scheduler's prefix tree decides where: scheduler/core/prefix_tree.h) and a
// resume restores it into an empty slot, after which the slot prefills only the tokens past it.
//
// Two tiers:
//   device  Backend::SaveCheckpoint / LoadCheckpoint (the CUDA backend: a copy in device memory,
//           device-to-device copies both ways, so a 16k-token resume costs milliseconds);
//   host    Backend::Snapshot / Restore bytes in RAM (every backend: the CPU one in CI, the CUDA
//           one when asked for it). The bytes are the failover snapshot format.
// A device save that finds no device memory after dropping the least recently used device
// checkpoints fails (reported, counted in stats().failures): the device tier's memory is outside
// the KV pool, so the operator leaves room for it (--kv-pool-tokens, --memory-fraction).
// Either way the store keeps at most `budget_bytes` and drops the least recently used
// checkpoints (saved or restored) to make room, never one that is pinned (a checkpoint the
// same step restores). Ids are the scheduler's; the store reports what it saved, dropped and
// could not save, so the scheduler's tree names only checkpoints the store holds.
//
// Not thread-safe: the worker's step thread drives it (worker/README.md, Threads).
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <unordered_map>
#include "common/util/status.h"
#include "worker/model/backend.h"

namespace ds {

struct CheckpointStoreOptions {
  uint64_t budget_bytes = 0;  // 0 = no prefix cache
  // Keep checkpoints on the device when the backend can (Backend::SupportsDeviceCheckpoints);
  // false: always host RAM.
  bool prefer_device = true;
};

struct CheckpointStoreStats {
  uint64_t budget_bytes = 0;
  uint64_t used_bytes = 0;
  int64_t checkpoints = 0;
  uint64_t saves = 0;
  uint64_t restores = 0;
  uint64_t evictions = 0;  // dropped to make room
  uint64_t failures = 0;   // saves refused (larger than the budget) or failed
};

class CheckpointStore {
 public:
  // `backend` must outlive the store.
  CheckpointStore(Backend* backend, const CheckpointStoreOptions& opts);

  bool enabled() const { return opts_.budget_bytes > 0; }
  bool on_device() const { return device_; }
  const char* tier() const { return device_ ? "device" : "host"; }  // preferred tier

  // Saves `slot` (which must hold a sequence) as checkpoint `id` and returns its bytes; drops
  // least recently used checkpoints not in `pinned` until it fits (their ids appended to
  // *evicted). ResourceExhausted when it cannot fit even then (nothing kept); AlreadyExists for a
  // known id; the backend's error otherwise.
  absl::StatusOr<uint64_t> Save(uint64_t id, int slot, std::span<const uint64_t> pinned,
                                std::vector<uint64_t>* evicted);
  // Loads checkpoint `id` into `slot` (reset first by the backend): the slot then holds its
  // n_past positions. NotFound for an unknown id.
  absl::Status Restore(uint64_t id, int slot);
  // Positions checkpoint `id` holds; -1 when unknown.
  int32_t Length(uint64_t id) const;
  bool Contains(uint64_t id) const { return entries_.contains(id); }
  void Drop(uint64_t id);
  void Clear();

  const CheckpointStoreStats& stats() const { return stats_; }

 private:
  struct Entry {
    int32_t n_past = 0;
    uint64_t bytes = 0;
    SlotSnapshot host;                        // host tier
    std::unique_ptr<StateCheckpoint> device;  // device tier
    std::list<uint64_t>::iterator lru;        // position in lru_
  };
  // Drops least recently used entries not in `pinned` (nor `keep`) until used + need <= budget.
  bool MakeRoom(uint64_t need, uint64_t keep, std::span<const uint64_t> pinned,
                std::vector<uint64_t>* evicted);
  void Erase(uint64_t id);

  Backend* backend_;
  CheckpointStoreOptions opts_;
  bool device_ = false;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // least recently used first
  CheckpointStoreStats stats_;
};

}  // namespace ds
