// Metrics of one worker process (one GPU, or the CPU reference): readiness, memory by kind,
// forward time per step, warmup speed, and, where NVML is available, the GPU's utilisation and
// memory (nvml.h). Every series carries `worker="<id>"`, the id the scheduler labels
// deltaserve_worker_up with, so the two sides join.
#pragma once
#include <span>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/metrics/nvml.h"

namespace ds::metrics {

// Label `kind` of deltaserve_worker_memory_bytes.
enum class MemoryKind : uint8_t { kWeights, kKv, kRecurrentState, kWorkspace };
inline constexpr int kNumMemoryKinds = 4;
const char* MemoryKindName(MemoryKind k);  // weights | kv | recurrent_state | workspace

class WorkerMetrics {
 public:
  WorkerMetrics(prometheus::Registry& registry, const std::string& worker_id);

  void SetReady(bool ready) { ready_->Set(ready ? 1 : 0); }
  void SetMemory(MemoryKind k, uint64_t bytes) {
    memory_[static_cast<int>(k)]->Set(static_cast<double>(bytes));
  }
  void SetWarmup(double prefill_tokens_per_second, double decode_tokens_per_second) {
    warmup_prefill_->Set(prefill_tokens_per_second);
    warmup_decode_->Set(decode_tokens_per_second);
  }
  // One step: the backend's forward time, the sampling time, tokens in, whether it failed.
  void OnStep(double forward_seconds, double sample_seconds, int tokens, bool failed);
  // MTP speculative decoding (issue #15): drafts offered / accepted at each draft position
  // (index 0 = the first draft) since the last call, and the tokens each verify step kept
  // (1 + accepted drafts).
  void OnMtp(std::span<const int64_t> offered, std::span<const int64_t> accepted,
             std::span<const int> tokens_per_verify);

  // Starts NVML sampling of `gpus` (NVML indices) into this worker's registry. Returns why not
  // when NVML is unavailable; the GPU metrics are then simply absent.
  absl::Status StartGpuSampling(const std::vector<int>& gpus, std::chrono::milliseconds period,
                                const std::string& library = "libnvidia-ml.so.1");

 private:
  prometheus::Registry& registry_;
  std::string worker_id_;
  prometheus::Gauge* ready_;
  prometheus::Gauge* memory_[kNumMemoryKinds];
  prometheus::Gauge *warmup_prefill_, *warmup_decode_;
  prometheus::Histogram *forward_, *sample_;
  prometheus::Counter *steps_, *step_errors_, *tokens_;
  prometheus::Family<prometheus::Counter> *mtp_offered_, *mtp_accepted_;
  prometheus::Histogram* mtp_tokens_;
  std::unique_ptr<GpuSampler> gpu_;
};

}  // namespace ds::metrics
