#include "worker/backend_factory.h"

#ifdef DS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "worker/cuda/cuda_backend.h"
#endif

namespace ds {

int CudaDeviceCount() {
#ifdef DS_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

bool CudaAvailable() { return CudaDeviceCount() > 0; }

absl::StatusOr<std::string> ResolveBackendKind(const std::string& kind) {
  if (kind == "cpu") return std::string("cpu");
  if (kind == "cuda" || kind == "auto") {
#ifdef DS_HAVE_CUDA
    if (CudaDeviceCount() > 0) return std::string("cuda");
    if (kind == "cuda") return absl::UnavailableError("no CUDA device is visible");
#else
    if (kind == "cuda")
      return absl::UnimplementedError("this build has no CUDA backend (built without nvcc)");
#endif
    return std::string("cpu");
  }
  return absl::InvalidArgumentError("unknown backend '" + kind + "' (expected cpu, cuda or auto)");
}

absl::StatusOr<std::string> BackendDeviceName(const std::string& kind, const BackendOptions& opts) {
  absl::StatusOr<std::string> k = ResolveBackendKind(kind);
  if (!k.ok()) return k.status();
  return *k == "cuda" ? "cuda:" + std::to_string(opts.device) : *k;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& kind,
                                                       std::shared_ptr<const gguf::File> file,
                                                       const BackendOptions& opts) {
  return CreateBackend(kind, std::move(file), opts, SpeculativeRoom{});
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& kind,
                                                       std::shared_ptr<const gguf::File> file,
                                                       const BackendOptions& opts,
                                                       const SpeculativeRoom& spec) {
  absl::StatusOr<std::string> k = ResolveBackendKind(kind);
  if (!k.ok()) return k.status();
  if (spec.tokens < 0 || spec.seqs < 0)
    return absl::InvalidArgumentError("speculative room: tokens " + std::to_string(spec.tokens) +
                                      ", sequences " + std::to_string(spec.seqs) +
                                      " (expected >= 0)");
#ifdef DS_HAVE_CUDA
  if (*k == "cuda") {
    CudaBackendOptions copts;
    copts.kv_type = opts.kv_type;
    copts.spec_tokens = spec.tokens;
    copts.spec_seqs = spec.seqs;
    return CreateCudaBackend(std::move(file), opts, copts);
  }
#endif
  return CreateCpuBackend(std::move(file), opts);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& kind,
                                                       const std::string& model_path,
                                                       const BackendOptions& opts) {
  return CreateBackend(kind, model_path, opts, SpeculativeRoom{});
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& kind,
                                                       const std::string& model_path,
                                                       const BackendOptions& opts,
                                                       const SpeculativeRoom& spec) {
  DS_RETURN_IF_ERROR(ResolveBackendKind(kind).status());  // a bad kind before opening the file
  DS_ASSIGN_OR_RETURN(std::unique_ptr<gguf::File> f, gguf::File::Open(model_path));
  return CreateBackend(kind, std::shared_ptr<const gguf::File>(std::move(f)), opts, spec);
}

}  // namespace ds
