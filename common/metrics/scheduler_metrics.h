// Metrics of the scheduler daemon: the load signals inference-aware routers use (waiting requests,
// running requests, context usage), slots and the context budget (pooled and per slot), step time
// and batch size, and each worker's liveness as the scheduler sees it.
//
// The daemon's loop thread is the only writer: it fills a SchedulerGaugeState from the core's
// status after every batch of commands and step (cheap: a few dozen gauge stores).
#pragma once
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ds::metrics {

struct SlotGaugeState {
  int64_t used = 0;      // tokens computed in the slot
  int64_t reserved = 0;  // tokens reserved for its request (prompt + max tokens)
  int64_t capacity = 0;  // the most this slot may hold under the context policy
  bool busy = false;
};

// A plain mirror of ds::sched::SchedulerStatus (common/ must not depend on the scheduler).
struct SchedulerGaugeState {
  int waiting = 0;
  int running = 0;
  int queue_capacity = 0;
  int slots = 0;  // target slot count (SetSlots)
  int slots_busy = 0;
  std::vector<SlotGaugeState> per_slot;  // [every slot that exists]
  int64_t context_used = 0;
  int64_t context_reserved = 0;
  int64_t context_capacity = 0;
  bool draining = false;
  bool serving = false;
};

// Prefix cache of one replica (issue #17): cumulative counts since the replica joined and what
// it holds now (a mirror of ds::sched::PrefixCacheStats).
struct PrefixCacheGaugeState {
  uint64_t lookups = 0, hits = 0, prompt_tokens = 0, saved_tokens = 0;
  uint64_t saves = 0, evictions = 0, failures = 0;
  uint64_t bytes = 0, budget_bytes = 0;
  int64_t checkpoints = 0;
};

class SchedulerMetrics {
 public:
  explicit SchedulerMetrics(prometheus::Registry& registry);

  void Update(const SchedulerGaugeState& s);
  // One applied step: its wall time from Schedule() to the routed events, the tokens and
  // sequences it advanced, and the worker's share (forward + sample as the worker measured it).
  // `ahead`: the step was sent before the previous one's answer (lookahead).
  void OnStep(double step_seconds, int batch_tokens, int batch_sequences, double worker_seconds,
              bool ahead = false);
  // Liveness of a worker by id (up = attached). A lost worker stays exported with up=0 (worker ids are stable
  // under systemd: %H-gpu%i) so the WorkerDown alert sees it until it returns.
  void SetWorker(const std::string& worker_id, bool up, double heartbeat_age_seconds);
  // Prefix cache: `replicas` = every live replica's state by replica id. Counters advance by each
  // replica's growth since the previous call (a lost replica's counts stay counted); gauges are
  // the live replicas' sum.
  void SetPrefixCache(const std::map<int, PrefixCacheGaugeState>& replicas);

 private:
  prometheus::Gauge *waiting_, *running_, *queue_capacity_, *slots_, *slots_busy_;
  prometheus::Gauge *ctx_used_, *ctx_reserved_, *ctx_capacity_, *ctx_ratio_;
  prometheus::Gauge *draining_, *serving_;
  prometheus::Family<prometheus::Gauge>* slot_used_family_;
  prometheus::Family<prometheus::Gauge>* slot_reserved_family_;
  prometheus::Family<prometheus::Gauge>* slot_capacity_family_;
  struct SlotSeries {
    prometheus::Gauge *used, *reserved, *capacity;
  };
  std::vector<SlotSeries> slot_series_;
  prometheus::Histogram *step_, *worker_share_, *batch_tokens_, *batch_seqs_;
  prometheus::Counter *steps_, *step_tokens_, *steps_ahead_;
  prometheus::Family<prometheus::Gauge>* worker_up_family_;
  prometheus::Family<prometheus::Gauge>* worker_hb_family_;
  struct WorkerSeries {
    prometheus::Gauge *up, *heartbeat_age;
  };
  std::map<std::string, WorkerSeries> workers_;
  prometheus::Counter *pc_lookups_, *pc_hits_, *pc_prompt_tokens_, *pc_saved_tokens_, *pc_saves_,
      *pc_evictions_, *pc_failures_;
  prometheus::Gauge *pc_bytes_, *pc_budget_, *pc_checkpoints_;
  std::map<int, PrefixCacheGaugeState> pc_last_;  // by replica id
};

}  // namespace ds::metrics
