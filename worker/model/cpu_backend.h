// The CPU reference backend: the step runner (worker/runner/step_runner.h) over the CPU device
// (worker/model/cpu_device.h). Slow but exact; every other backend is tested against it.
#pragma once
#include <memory>
#include <string>

#include "common/gguf/gguf.h"
#include "worker/model/backend.h"
#include "worker/model/cpu_device.h"
#include "worker/runner/step_runner.h"

namespace ds {

class CpuBackend final : public StepRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const std::string& path,
                                                            const BackendOptions& opts);
  // Over a file that is already open; the backend keeps it (its weights are views into it).
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(std::shared_ptr<const gguf::File> file,
                                                            const BackendOptions& opts);

  // Chunk size of the chunked GDN form used for multi-token steps (default 64). 0 = use the
  // per-token recurrence for prefill too (tests compare the two).
  void set_gdn_chunk(int chunk) { cpu_->set_gdn_chunk(chunk); }
  // Micro-step limits of the CPU device (default: a whole step at once); tests of the runner.
  void set_micro_step_limits(int max_rows, int max_logit_rows) {
    DeviceLimits limits = cpu_->limits();  // by name: the struct grows (max_decode_rows)
    limits.max_rows = max_rows;
    limits.max_logit_rows = max_logit_rows;
    cpu_->set_limits(limits);
  }
  // The CPU twin of device sampling (CpuDevice::Sample), off by default; tests of the paths that
  // need it (StepOptions::device_sample, chain_after).
  void set_device_sampling(bool on) {
    DeviceLimits limits = cpu_->limits();
    limits.device_sampling = on;
    cpu_->set_limits(limits);
  }
  const ModelWeights& weights() const { return cpu_->weights(); }

 private:
  CpuBackend(std::unique_ptr<CpuDevice> device, std::shared_ptr<const gguf::File> file,
             const ModelConfig& cfg, const BackendOptions& opts, TpPlacement tp);
  CpuDevice* cpu_;  // owned by the runner
};

}  // namespace ds
