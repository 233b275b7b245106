// The memory planner (issue #23): from what a device has free and what the model needs, the slots,
// per-slot context and paged KV pool a worker can hold — before anything is allocated.
//
//   budget   = min(free now (after other processes), memory_fraction x total) - margin
//   fixed    = weights + workspace_fixed + workspace_per_ctx x slot_ctx
//              + recurrent_per_slot x (slots + 1)        (the worker's warmup scratch slot)
//              + recurrent_fixed                          (speculative entries)
//   cache    = prefix-cache checkpoints in device memory (issue #17): all of cache_bytes when
//              cache_required (--prefix-cache-tier device), else (auto) at most a quarter of
//              what the smallest plan leaves: budget - fixed(1 slot)
//   KV pool  = (budget - cache - fixed) / kv_per_token, in whole pages, at most slots x slot_ctx
//
// The pool is shared by the slots (pages handed out as sequences grow), so it only has to hold
// one full context (slot_ctx) to be usable; more slots cost only their recurrent state.
// Operator numbers (slots, slot_ctx, pool_tokens) are honoured when they fit; 0 lets the planner
// pick (slots: the most up to max_auto_slots that leave every slot min_tokens_per_slot of pool;
// pool: everything left). Otherwise: ResourceExhausted with the figures and the nearest setting
// that fits. Pure arithmetic: tested with tables for the 27B on 16/32/80/141 GB
// (tests/runner/memory_planner_test.cc), used by the CUDA device at start.
#pragma once
#include <cstdint>
#include <string>

#include "common/util/status.h"

namespace ds {

struct MemoryPlanInput {
  uint64_t device_free = 0;      // bytes free on the device now (cudaMemGetInfo)
  uint64_t device_total = 0;     // its size (for memory_fraction)
  double memory_fraction = 1.0;  // share of device_total this worker may take (2 replicas: 0.5)
  uint64_t margin = 256ull << 20;  // kept free (allocator rounding, driver, other small users)
  uint64_t weights = 0;
  uint64_t workspace_fixed = 0;    // activations etc. (independent of the context)
  uint64_t workspace_per_ctx = 0;  // per token of slot_ctx (prefill attention scratch)
  uint64_t recurrent_per_slot = 0;
  // Recurrent state that does not scale with the slots: the speculative entries (one sequence's
  // GDN state per verified token, CudaBackendOptions::spec_tokens x spec_seqs).
  uint64_t recurrent_fixed = 0;
  uint64_t kv_per_token = 0;       // K + V of every attention layer, in the KV type
  int page_size = 64;
  // The operator's numbers; 0 = the planner picks.
  int slots = 0;
  int64_t slot_ctx = 0;      // required (the scheduler's per-slot cap)
  int64_t pool_tokens = 0;
  int max_auto_slots = 64;
  // Device memory wanted beside the plan for prefix-cache checkpoints (0: none) and whether all
  // of it must fit (else the planner gives it at most a quarter of what is left, see above).
  uint64_t cache_bytes = 0;
  bool cache_required = false;
  int64_t min_tokens_per_slot = 1024;  // auto slots: each gets at least this much pool on average
};

struct MemoryPlan {
  int slots = 0;
  int64_t slot_ctx = 0;
  int64_t pool_pages = 0;
  int page_size = 0;
  uint64_t budget = 0, weights = 0, kv = 0, recurrent = 0, workspace = 0;
  uint64_t cache = 0;  // kept free for prefix-cache checkpoints (in total(), not in the KV pool)
  int64_t pool_tokens() const { return pool_pages * page_size; }
  uint64_t total() const { return weights + kv + recurrent + workspace + cache; }
  // "budget 131.2 GiB: weights 20.6 + KV pool 100.1 (1,638,400 tokens = 25,600 pages of 64)
  //  + recurrent 9.6 (64+1 slots) + workspace 0.9 + prefix cache 4.0 GiB; slot_ctx 32768"
  std::string ToString() const;
};

absl::StatusOr<MemoryPlan> PlanMemory(const MemoryPlanInput& in);

}  // namespace ds
