#include "common/metrics/worker_metrics.h"

#include "common/metrics/buckets.h"

namespace ds::metrics {

const char* MemoryKindName(MemoryKind k) {
  switch (k) {
    case MemoryKind::kWeights:
      return "weights";
    case MemoryKind::kKv:
      return "kv";
    case MemoryKind::kRecurrentState:
      return "recurrent_state";
    case MemoryKind::kWorkspace:
      return "workspace";
  }
  return "workspace";
}

WorkerMetrics::WorkerMetrics(prometheus::Registry& r, const std::string& worker_id)
    : registry_(r), worker_id_(worker_id) {
  const prometheus::Labels w = {{"worker", worker_id}};
  ready_ = &prometheus::BuildGauge()
                .Name("deltaserve_worker_ready")
                .Help("1 once the worker finished warmup and serves steps")
                .Labels(w)
                .Register(r)
                .Add({});
  auto& mem = prometheus::BuildGauge()
                  .Name("deltaserve_worker_memory_bytes")
                  .Help("Device (or host, CPU backend) memory held by the worker, by kind")
                  .Labels(w)
                  .Register(r);
  for (int i = 0; i < kNumMemoryKinds; ++i)
    memory_[i] = &mem.Add({{"kind", MemoryKindName(static_cast<MemoryKind>(i))}});
  auto& warm = prometheus::BuildGauge()
                   .Name("deltaserve_worker_warmup_tokens_per_second")
                   .Help("Speed measured by the warmup generation")
                   .Labels(w)
                   .Register(r);
  warmup_prefill_ = &warm.Add({{"phase", "prefill"}});
  warmup_decode_ = &warm.Add({{"phase", "decode"}});
  forward_ = &prometheus::BuildHistogram()
                  .Name("deltaserve_worker_forward_seconds")
                  .Help("Backend forward pass of one step, measured on the worker")
                  .Labels(w)
                  .Register(r)
                  .Add({}, kStepBuckets);
  sample_ = &prometheus::BuildHistogram()
                 .Name("deltaserve_worker_sample_seconds")
                 .Help("Sampling of one step's tokens, measured on the worker")
                 .Labels(w)
                 .Register(r)
                 .Add({}, kStepBuckets);
  steps_ = &prometheus::BuildCounter()
                .Name("deltaserve_worker_steps_total")
                .Help("Steps run by the worker")
                .Labels(w)
                .Register(r)
                .Add({});
  step_errors_ = &prometheus::BuildCounter()
                      .Name("deltaserve_worker_step_errors_total")
                      .Help("Steps the worker failed")
                      .Labels(w)
                      .Register(r)
                      .Add({});
  mtp_offered_ = &prometheus::BuildCounter()
                      .Name("deltaserve_worker_mtp_drafts_total")
                      .Help("MTP drafts verified, by draft position (1 = the first draft)")
                      .Labels(w)
                      .Register(r);
  mtp_accepted_ = &prometheus::BuildCounter()
                       .Name("deltaserve_worker_mtp_drafts_accepted_total")
                       .Help("MTP drafts accepted, by draft position")
                       .Labels(w)
                       .Register(r);
  mtp_tokens_ = &prometheus::BuildHistogram()
                     .Name("deltaserve_worker_mtp_verify_tokens")
                     .Help("Tokens one MTP verify step kept for a sequence (1 + accepted drafts)")
                     .Labels(w)
                     .Register(r)
                     .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 3, 4, 5, 6, 8, 12, 16});
  tokens_ = &prometheus::BuildCounter()
                 .Name("deltaserve_worker_tokens_total")
                 .Help("Tokens run through the model by the worker (prefill + decode)")
                 .Labels(w)
                 .Register(r)
                 .Add({});
}

void WorkerMetrics::OnMtp(std::span<const int64_t> offered, std::span<const int64_t> accepted,
                          std::span<const int> tokens_per_verify) {
  const prometheus::Labels w = {{"worker", worker_id_}};
  for (size_t i = 0; i < offered.size() && i < accepted.size(); ++i) {
    if (offered[i] == 0 && accepted[i] == 0) continue;
    const prometheus::Labels l = {{"position", std::to_string(i + 1)}};
    mtp_offered_->Add(l).Increment(static_cast<double>(offered[i]));
    mtp_accepted_->Add(l).Increment(static_cast<double>(accepted[i]));
  }
  for (int n : tokens_per_verify) mtp_tokens_->Observe(n);
}

void WorkerMetrics::OnStep(double forward_seconds, double sample_seconds, int tokens, bool failed) {
  steps_->Increment();
  if (failed) {
    step_errors_->Increment();
    return;
  }
  forward_->Observe(forward_seconds);
  sample_->Observe(sample_seconds);
  tokens_->Increment(tokens);
}

absl::Status WorkerMetrics::StartGpuSampling(const std::vector<int>& gpus,
                                             std::chrono::milliseconds period,
                                             const std::string& library) {
  DS_ASSIGN_OR_RETURN(
      gpu_, GpuSampler::Start(registry_, gpus, {{"worker", worker_id_}}, period, library));
  return absl::OkStatus();
}

}  // namespace ds::metrics
