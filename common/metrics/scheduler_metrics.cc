#include "common/metrics/scheduler_metrics.h"

#include "common/metrics/buckets.h"

namespace ds::metrics {
namespace {

prometheus::Gauge* Gauge(prometheus::Registry& r, const char* name, const char* help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

prometheus::Counter* Counter(prometheus::Registry& r, const char* name, const char* help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

}  // namespace

SchedulerMetrics::SchedulerMetrics(prometheus::Registry& r) {
  pc_lookups_ = Counter(r, "deltaserve_prefix_cache_lookups_total",
                        "Admissions that looked for a cached prefix (issue #17)");
  pc_hits_ = Counter(r, "deltaserve_prefix_cache_hits_total",
                     "Admissions that resumed from a prefix-cache checkpoint");
  pc_prompt_tokens_ = Counter(r, "deltaserve_prefix_cache_prompt_tokens_total",
                              "Prompt tokens of the admissions that looked for a cached prefix");
  pc_saved_tokens_ = Counter(r, "deltaserve_prefix_cache_saved_tokens_total",
                             "Prompt tokens not prefilled thanks to a prefix-cache hit");
  pc_saves_ = Counter(r, "deltaserve_prefix_cache_saves_total", "Checkpoints the workers saved");
  pc_evictions_ = Counter(r, "deltaserve_prefix_cache_evictions_total",
                          "Checkpoints the workers dropped to make room (LRU)");
  pc_failures_ = Counter(r, "deltaserve_prefix_cache_failures_total",
                         "Checkpoints asked for and not saved (too large, or the step failed)");
  pc_bytes_ = Gauge(r, "deltaserve_prefix_cache_bytes", "Bytes of checkpoints the workers hold");
  pc_budget_ = Gauge(r, "deltaserve_prefix_cache_budget_bytes",
                     "The workers' prefix-cache budgets (--prefix-cache-mb)");
  pc_checkpoints_ = Gauge(r, "deltaserve_prefix_cache_checkpoints", "Checkpoints the workers hold");
  waiting_ = Gauge(r, "deltaserve_requests_waiting", "Requests queued for a slot");
  running_ = Gauge(r, "deltaserve_requests_running", "Requests bound to a slot");
  queue_capacity_ = Gauge(r, "deltaserve_requests_waiting_capacity",
                          "Most requests the queue holds (--max-queue); more are rejected");
  slots_ = Gauge(r, "deltaserve_slots", "Parallel sequence slots (target of SetSlots)");
  slots_busy_ = Gauge(r, "deltaserve_slots_busy", "Slots bound to a request");
  ctx_used_ =
      Gauge(r, "deltaserve_context_used_tokens", "Context positions computed, summed over slots");
  ctx_reserved_ = Gauge(r, "deltaserve_context_reserved_tokens",
                        "Context positions reserved by running requests (prompt + max tokens)");
  ctx_capacity_ = Gauge(r, "deltaserve_context_capacity_tokens",
                        "Context positions of the pool (the policy's total context)");
  ctx_ratio_ = Gauge(r, "deltaserve_context_usage_ratio",
                     "Reserved / capacity of the context pool (the KV-usage routing signal)");
  draining_ = Gauge(r, "deltaserve_scheduler_draining", "1 while admission is closed (Drain)");
  serving_ = Gauge(r, "deltaserve_scheduler_serving", "1 while a warmed-up worker is attached");
  slot_used_family_ = &prometheus::BuildGauge()
                           .Name("deltaserve_slot_context_used_tokens")
                           .Help("Context positions computed in one slot")
                           .Register(r);
  slot_reserved_family_ = &prometheus::BuildGauge()
                               .Name("deltaserve_slot_context_reserved_tokens")
                               .Help("Context positions reserved by one slot's request")
                               .Register(r);
  slot_capacity_family_ = &prometheus::BuildGauge()
                               .Name("deltaserve_slot_context_capacity_tokens")
                               .Help("Most context positions one slot may hold")
                               .Register(r);
  step_ = &prometheus::BuildHistogram()
               .Name("deltaserve_step_duration_seconds")
               .Help("One scheduler step: schedule, worker forward + sample, apply, routing")
               .Register(r)
               .Add({}, kStepBuckets);
  worker_share_ = &prometheus::BuildHistogram()
                       .Name("deltaserve_step_worker_seconds")
                       .Help("The worker's forward + sample share of a step (as it measured it)")
                       .Register(r)
                       .Add({}, kStepBuckets);
  batch_tokens_ = &prometheus::BuildHistogram()
                       .Name("deltaserve_step_batch_tokens")
                       .Help("Tokens processed in one step (decode + prefill chunks)")
                       .Register(r)
                       .Add({}, kBatchTokenBuckets);
  batch_seqs_ = &prometheus::BuildHistogram()
                     .Name("deltaserve_step_batch_sequences")
                     .Help("Sequences advanced in one step")
                     .Register(r)
                     .Add({}, kBatchSequenceBuckets);
  steps_ = &prometheus::BuildCounter()
                .Name("deltaserve_steps_total")
                .Help("Steps applied")
                .Register(r)
                .Add({});
  steps_ahead_ = &prometheus::BuildCounter()
                      .Name("deltaserve_steps_ahead_total")
                      .Help("Steps sent before the previous step's answer (lookahead)")
                      .Register(r)
                      .Add({});
  step_tokens_ = &prometheus::BuildCounter()
                      .Name("deltaserve_step_tokens_total")
                      .Help("Tokens processed by applied steps (prompt prefill + decode)")
                      .Register(r)
                      .Add({});
  worker_up_family_ = &prometheus::BuildGauge()
                           .Name("deltaserve_worker_up")
                           .Help("1 while the worker is attached (warming up or serving), 0 once lost")
                           .Register(r);
  worker_hb_family_ = &prometheus::BuildGauge()
                           .Name("deltaserve_worker_heartbeat_age_seconds")
                           .Help("Seconds since the worker's last heartbeat")
                           .Register(r);
}

void SchedulerMetrics::Update(const SchedulerGaugeState& s) {
  waiting_->Set(s.waiting);
  running_->Set(s.running);
  queue_capacity_->Set(s.queue_capacity);
  slots_->Set(s.slots);
  slots_busy_->Set(s.slots_busy);
  ctx_used_->Set(static_cast<double>(s.context_used));
  ctx_reserved_->Set(static_cast<double>(s.context_reserved));
  ctx_capacity_->Set(static_cast<double>(s.context_capacity));
  ctx_ratio_->Set(
      s.context_capacity > 0 ? static_cast<double>(s.context_reserved) / s.context_capacity : 0.0);
  draining_->Set(s.draining ? 1 : 0);
  serving_->Set(s.serving ? 1 : 0);
  // Slots come and go with SetSlots; their series follow (label `slot` stays below the
  // configured maximum, a small closed set).
  while (slot_series_.size() < s.per_slot.size()) {
    const prometheus::Labels l = {{"slot", std::to_string(slot_series_.size())}};
    slot_series_.push_back({&slot_used_family_->Add(l), &slot_reserved_family_->Add(l),
                            &slot_capacity_family_->Add(l)});
  }
  while (slot_series_.size() > s.per_slot.size()) {
    slot_used_family_->Remove(slot_series_.back().used);
    slot_reserved_family_->Remove(slot_series_.back().reserved);
    slot_capacity_family_->Remove(slot_series_.back().capacity);
    slot_series_.pop_back();
  }
  for (size_t i = 0; i < s.per_slot.size(); ++i) {
    slot_series_[i].used->Set(static_cast<double>(s.per_slot[i].used));
    slot_series_[i].reserved->Set(static_cast<double>(s.per_slot[i].reserved));
    slot_series_[i].capacity->Set(static_cast<double>(s.per_slot[i].capacity));
  }
}

void SchedulerMetrics::OnStep(double step_seconds, int batch_tokens, int batch_sequences,
                              double worker_seconds, bool ahead) {
  step_->Observe(step_seconds);
  if (ahead) steps_ahead_->Increment();
  worker_share_->Observe(worker_seconds);
  batch_tokens_->Observe(batch_tokens);
  batch_seqs_->Observe(batch_sequences);
  steps_->Increment();
  step_tokens_->Increment(batch_tokens);
}

void SchedulerMetrics::SetWorker(const std::string& id, bool up, double heartbeat_age_seconds) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    const prometheus::Labels l = {{"worker", id}};
    it = workers_.emplace(id, WorkerSeries{&worker_up_family_->Add(l), &worker_hb_family_->Add(l)})
             .first;
  }
  it->second.up->Set(up ? 1 : 0);
  it->second.heartbeat_age->Set(heartbeat_age_seconds);
}

void SchedulerMetrics::SetPrefixCache(const std::map<int, PrefixCacheGaugeState>& replicas) {
  PrefixCacheGaugeState sum;
  for (const auto& [id, now] : replicas) {
    PrefixCacheGaugeState& last = pc_last_[id];
    auto grow = [](prometheus::Counter* c, uint64_t now_v, uint64_t last_v) {
      if (now_v > last_v) c->Increment(static_cast<double>(now_v - last_v));
    };
    grow(pc_lookups_, now.lookups, last.lookups);
    grow(pc_hits_, now.hits, last.hits);
    grow(pc_prompt_tokens_, now.prompt_tokens, last.prompt_tokens);
    grow(pc_saved_tokens_, now.saved_tokens, last.saved_tokens);
    grow(pc_saves_, now.saves, last.saves);
    grow(pc_evictions_, now.evictions, last.evictions);
    grow(pc_failures_, now.failures, last.failures);
    last = now;
    sum.bytes += now.bytes;
    sum.budget_bytes += now.budget_bytes;
    sum.checkpoints += now.checkpoints;
  }
  pc_bytes_->Set(static_cast<double>(sum.bytes));
  pc_budget_->Set(static_cast<double>(sum.budget_bytes));
  pc_checkpoints_->Set(static_cast<double>(sum.checkpoints));
}

}  // namespace ds::metrics
