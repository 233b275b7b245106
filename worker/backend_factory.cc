#include "worker/backend_factory.h"

#ifdef DS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "worker/cuda/cuda_backend.h"
#endif

namespace ds {

#ifdef DS_HAVE_CUDA
static int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}
#endif

bool CudaAvailable() {
#ifdef DS_HAVE_CUDA
  return CudaDeviceCount() > 0;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& kind,
                                                       const std::string& model_path,
                                                       const BackendOptions& opts) {
  if (kind == "cpu") return CreateCpuBackend(model_path, opts);
  if (kind == "cuda" || kind == "auto") {
#ifdef DS_HAVE_CUDA
    if (CudaDeviceCount() > 0) return CreateCudaBackend(model_path, opts);
    if (kind == "cuda") return absl::UnavailableError("no CUDA device is visible");
#else
    if (kind == "cuda")
      return absl::UnimplementedError("this build has no CUDA backend (built without nvcc)");
#endif
    return CreateCpuBackend(model_path, opts);
  }
  return absl::InvalidArgumentError("unknown backend '" + kind + "' (expected cpu, cuda or auto)");
}

}  // namespace ds
