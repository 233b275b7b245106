#include "common/metrics/nvml.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace ds::metrics {
namespace {

// The few NVML declarations used here, from the documented C ABI (nvml.h): every call returns
// nvmlReturn_t (0 = NVML_SUCCESS); a device is an opaque pointer.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu;     // percent of time a kernel ran over the last sample period
  unsigned int memory;  // percent of time device memory was read or written
};
struct NvmlMemory {
  unsigned long long total, free, used;  // bytes
};

}  // namespace

struct Nvml::Api {
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  const char* (*error_string)(NvmlReturn);
  NvmlReturn (*device_count)(unsigned int*);
  NvmlReturn (*device_by_index)(unsigned int, NvmlDevice*);
  NvmlReturn (*device_name)(NvmlDevice, char*, unsigned int);
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*);
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*);
};

absl::StatusOr<std::unique_ptr<Nvml>> Nvml::Load(const std::string& library) {
  void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return absl::NotFoundError(absl::StrCat("cannot load ", library, ": ", e ? e : "unknown"));
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  auto sym = [&](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(h, name));
    if (!*fn) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  };
  sym(&api->init, "nvmlInit_v2");
  sym(&api->shutdown, "nvmlShutdown");
  sym(&api->error_string, "nvmlErrorString");
  sym(&api->device_count, "nvmlDeviceGetCount_v2");
  sym(&api->device_by_index, "nvmlDeviceGetHandleByIndex_v2");
  sym(&api->device_name, "nvmlDeviceGetName");
  sym(&api->utilization, "nvmlDeviceGetUtilizationRates");
  sym(&api->memory, "nvmlDeviceGetMemoryInfo");
  if (!missing.empty()) {
    dlclose(h);
    return absl::NotFoundError(absl::StrCat(library, " lacks ", missing));
  }
  if (NvmlReturn r = api->init(); r != 0) {
    const std::string why = api->error_string(r);
    dlclose(h);
    return absl::UnavailableError(absl::StrCat("nvmlInit_v2 failed: ", why, " (", r, ")"));
  }
  return std::unique_ptr<Nvml>(new Nvml(h, std::move(api)));
}

Nvml::Nvml(void* handle, std::unique_ptr<Api> api) : handle_(handle), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(handle_);
}

std::string Nvml::Error(int code) const {
  return absl::StrCat(api_->error_string(code), " (", code, ")");
}

absl::StatusOr<int> Nvml::DeviceCount() {
  unsigned int n = 0;
  if (NvmlReturn r = api_->device_count(&n); r != 0)
    return absl::UnavailableError("nvmlDeviceGetCount_v2: " + Error(r));
  return static_cast<int>(n);
}

absl::StatusOr<std::string> Nvml::DeviceName(int index) {
  NvmlDevice d = nullptr;
  if (NvmlReturn r = api_->device_by_index(static_cast<unsigned int>(index), &d); r != 0)
    return absl::NotFoundError(absl::StrCat("GPU ", index, ": ", Error(r)));
  char name[96] = {0};
  if (NvmlReturn r = api_->device_name(d, name, sizeof(name) - 1); r != 0)
    return absl::UnavailableError(absl::StrCat("GPU ", index, " name: ", Error(r)));
  return std::string(name);
}

absl::StatusOr<GpuSample> Nvml::Sample(int index) {
  NvmlDevice d = nullptr;
  if (NvmlReturn r = api_->device_by_index(static_cast<unsigned int>(index), &d); r != 0)
    return absl::NotFoundError(absl::StrCat("GPU ", index, ": ", Error(r)));
  NvmlUtilization u{};
  NvmlMemory m{};
  if (NvmlReturn r = api_->utilization(d, &u); r != 0)
    return absl::UnavailableError(absl::StrCat("GPU ", index, " utilization: ", Error(r)));
  if (NvmlReturn r = api_->memory(d, &m); r != 0)
    return absl::UnavailableError(absl::StrCat("GPU ", index, " memory: ", Error(r)));
  GpuSample s;
  s.utilization_ratio = u.gpu / 100.0;
  s.memory_used_bytes = m.used;
  s.memory_total_bytes = m.total;
  return s;
}

absl::StatusOr<std::unique_ptr<GpuSampler>> GpuSampler::Start(prometheus::Registry& registry,
                                                              const std::vector<int>& gpus,
                                                              const prometheus::Labels& labels,
                                                              std::chrono::milliseconds period,
                                                              const std::string& library) {
  if (gpus.empty()) return absl::InvalidArgumentError("no GPU to sample");
  DS_ASSIGN_OR_RETURN(std::unique_ptr<Nvml> nvml, Nvml::Load(library));
  // Every GPU must answer once before any family is registered: a half-exported set would make
  // dashboards show a GPU as idle when it is only unreadable.
  for (int g : gpus) DS_RETURN_IF_ERROR(nvml->Sample(g).status());
  std::unique_ptr<GpuSampler> s(new GpuSampler());
  s->nvml_ = std::move(nvml);
  s->period_ = period;
  auto& util = prometheus::BuildGauge()
                   .Name("deltaserve_gpu_utilization_ratio")
                   .Help("Share of time a kernel ran on the GPU over NVML's last sample period")
                   .Labels(labels)
                   .Register(registry);
  auto& used = prometheus::BuildGauge()
                   .Name("deltaserve_gpu_memory_used_bytes")
                   .Help("GPU memory in use (all processes), from NVML")
                   .Labels(labels)
                   .Register(registry);
  auto& total = prometheus::BuildGauge()
                    .Name("deltaserve_gpu_memory_total_bytes")
                    .Help("GPU memory installed, from NVML")
                    .Labels(labels)
                    .Register(registry);
  for (int g : gpus) {
    const prometheus::Labels l = {{"gpu", std::to_string(g)}};
    s->series_.push_back({g, &util.Add(l), &used.Add(l), &total.Add(l)});
  }
  s->SampleOnce();
  s->thread_ = std::thread([p = s.get()] { p->Run(); });
  return s;
}

GpuSampler::~GpuSampler() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GpuSampler::SampleOnce() {
  for (Series& s : series_) {
    absl::StatusOr<GpuSample> v = nvml_->Sample(s.index);
    if (!v.ok()) continue;  // transient (e.g. GPU reset): keep the last value
    s.util->Set(v->utilization_ratio);
    s.used->Set(static_cast<double>(v->memory_used_bytes));
    s.total->Set(static_cast<double>(v->memory_total_bytes));
  }
}

void GpuSampler::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, period_, [this] { return stop_; });
    if (stop_) break;
    l.unlock();
    SampleOnce();
    l.lock();
  }
}

}  // namespace ds::metrics
