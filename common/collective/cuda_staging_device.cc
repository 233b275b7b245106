// StagingDevice over the CUDA runtime, for HostStagedCollective (built only with CUDA).
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "common/collective/host_staged_collective.h"

namespace ds {
namespace {

absl::Status CudaErr(const char* what, cudaError_t e) {
  return absl::InternalError(absl::StrCat("CUDA ", what, " (staged collective): ",
                                          cudaGetErrorString(e)));
}

class CudaStagingDevice final : public StagingDevice {
 public:
  ~CudaStagingDevice() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  absl::Status Init(int device) {
    device_ = device;
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaErr("SetDevice", e);
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess)
      return CudaErr("StreamCreate", e);
    return absl::OkStatus();
  }
  std::string name() const override { return absl::StrCat("cuda:", device_); }

  absl::StatusOr<bool> IsDevice(const void* p) const override {
    if (p == nullptr) return false;
    cudaPointerAttributes a;
    if (cudaError_t e = cudaPointerGetAttributes(&a, p); e != cudaSuccess) {
      cudaGetLastError();  // older runtimes flag plain host memory as an error; clear it
      return false;
    }
    // Managed memory is device memory the host may read, but the host collective must not race
    // the device on it: stage it too.
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  absl::Status ToHost(void* host, const void* dev, size_t bytes, void* stream) override {
    return CopySync(host, dev, bytes, cudaMemcpyDeviceToHost, stream, "MemcpyAsync D2H");
  }
  absl::Status ToDevice(void* dev, const void* host, size_t bytes, void* stream) override {
    return CopySync(dev, host, bytes, cudaMemcpyHostToDevice, stream, "MemcpyAsync H2D");
  }

 private:
  // Async copy on the caller's stream (after its kernels), then a sync of that stream: the data
  // is complete on return and the host buffer may be reused at once.
  absl::Status CopySync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, void* stream,
                        const char* what) {
    cudaStream_t s = stream ? static_cast<cudaStream_t>(stream) : stream_;
    if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, s); e != cudaSuccess) return CudaErr(what, e);
    if (cudaError_t e = cudaStreamSynchronize(s); e != cudaSuccess) return CudaErr("StreamSynchronize", e);
    return absl::OkStatus();
  }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StagingDevice>> NewCudaStagingDevice(int device) {
  auto d = std::make_unique<CudaStagingDevice>();
  DS_RETURN_IF_ERROR(d->Init(device));
  return std::unique_ptr<StagingDevice>(std::move(d));
}

}  // namespace ds
