// HostStagedCollective: a Collective for device buffers built on a host collective (Gloo).
// Every call that is handed device pointers copies them into host staging buffers, runs the host
// collective on those (the host library does the reduction; nothing is summed here) and copies
// the result back. Host pointers go to the host collective unchanged.
//
// Purpose: a testing and fallback path for the CUDA backend under tensor parallelism. NCCL
// refuses two ranks on the same GPU, so a TP group of several processes on ONE device (the
// device check, tools/device/tp_cuda_check.sh) needs this; a host without NCCL can also run a
// CUDA TP group over Gloo/TCP with it. NCCL is the fast path: this one synchronises the stream
// at every all-reduce (two per layer) and cannot be captured into a CUDA graph
// (graph_capturable() is false, so the CUDA backend runs its decode steps eagerly).
//
// The device side is behind StagingDevice (CUDA: NewCudaStagingDevice, built only with CUDA), so
// the staging logic itself is tested on a CPU-only build with a fake device.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/collective/collective.h"

namespace ds {

// The device memory operations the adapter needs.
class StagingDevice {
 public:
  virtual ~StagingDevice() = default;
  virtual std::string name() const = 0;  // "cuda:0"
  // Whether p is device memory (staged) or host memory (handed to the host collective as is).
  virtual absl::StatusOr<bool> IsDevice(const void* p) const = 0;
  // Copies ordered after the work already on `stream` (a cudaStream_t; null = the device's own
  // stream, i.e. the caller has finished producing the data) and complete on return.
  virtual absl::Status ToHost(void* host, const void* dev, size_t bytes, void* stream) = 0;
  virtual absl::Status ToDevice(void* dev, const void* host, size_t bytes, void* stream) = 0;
};

// The CUDA implementation on `device`. Only in builds with CUDA (ds_collective_cuda_staging,
// DS_HAVE_CUDA_STAGING); the definition lives in cuda_staging_device.cc.
absl::StatusOr<std::unique_ptr<StagingDevice>> NewCudaStagingDevice(int device);

class HostStagedCollective final : public Collective {
 public:
  HostStagedCollective(std::unique_ptr<Collective> host, std::unique_ptr<StagingDevice> device);

  int rank() const override { return host_->rank(); }
  int world() const override { return host_->world(); }
  std::string name() const override { return "staged-" + host_->name(); }
  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status AllGather(const float* in, size_t n, float* out) override;
  absl::Status AllGatherV(const float* in, std::span<const size_t> counts, float* out) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override { return host_->Barrier(); }
  // Implemented by synchronising `stream` (the device-to-host copy waits for the work already
  // enqueued), summing on the host and copying back on `stream`: correct in stream order, but
  // blocking, and not capturable.
  bool supports_stream_ordered() const override { return true; }
  absl::Status AllReduceSumOnStream(float* data, size_t n, void* stream) override;
  bool graph_capturable() const override { return false; }

  Collective& host() { return *host_; }

 private:
  // Host view of `bytes` at p: p itself for host memory, else `buf` filled from the device
  // (when `fill`) after the work on `stream`.
  absl::StatusOr<void*> Stage(const void* p, size_t bytes, std::vector<uint8_t>* buf, bool fill,
                              void* stream, bool* staged);
  std::unique_ptr<Collective> host_;
  std::unique_ptr<StagingDevice> dev_;
  std::vector<uint8_t> in_, out_;  // staging buffers, grown on demand
};

}  // namespace ds
