// NVIDIA Management Library, loaded at run time: libnvidia-ml.so.1 ships with the driver, not with
// the CUDA toolkit, so deltaserve neither links it nor needs it to build. Where the library (or a
// GPU) is absent, Load() says why and the GPU metrics are simply not exported.
#pragma once
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/util/status.h"

namespace ds::metrics {

struct GpuSample {
  double utilization_ratio = 0;  // share of the last sample period a kernel was running, [0, 1]
  uint64_t memory_used_bytes = 0;
  uint64_t memory_total_bytes = 0;
};

class Nvml {
 public:
  // dlopen(`library`) + nvmlInit_v2. Fails (without side effects) when the library, a symbol, or
  // the driver is missing.
  static absl::StatusOr<std::unique_ptr<Nvml>> Load(
      const std::string& library = "libnvidia-ml.so.1");
  ~Nvml();  // nvmlShutdown + dlclose

  absl::StatusOr<int> DeviceCount();
  absl::StatusOr<std::string> DeviceName(int index);
  absl::StatusOr<GpuSample> Sample(int index);

 private:
  struct Api;
  explicit Nvml(void* handle, std::unique_ptr<Api> api);
  std::string Error(int code) const;

  void* handle_;
  std::unique_ptr<Api> api_;
};

// Samples the given GPUs every `period` on its own thread into
//   deltaserve_gpu_utilization_ratio{gpu}, deltaserve_gpu_memory_used_bytes{gpu},
//   deltaserve_gpu_memory_total_bytes{gpu}
// (plus the registry's constant labels given in `labels`). Start() registers nothing and returns
// the reason when NVML or one of the GPUs is unavailable.
class GpuSampler {
 public:
  static absl::StatusOr<std::unique_ptr<GpuSampler>> Start(
      prometheus::Registry& registry, const std::vector<int>& gpus,
      const prometheus::Labels& labels, std::chrono::milliseconds period,
      const std::string& library = "libnvidia-ml.so.1");
  ~GpuSampler();

  void SampleOnce();

 private:
  GpuSampler() = default;
  void Run();

  std::unique_ptr<Nvml> nvml_;
  struct Series {
    int index;
    prometheus::Gauge *util, *used, *total;
  };
  std::vector<Series> series_;
  std::chrono::milliseconds period_{1000};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ds::metrics
