// Chooses and creates a compute backend: "cpu", "cuda" or "auto" (CUDA when this build has it and
// a device is present, else CPU).
#pragma once
#include <memory>
#include <string>

#include "worker/model/backend.h"

namespace ds {

bool CudaAvailable();  // compiled with CUDA and at least one device visible

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& kind,
                                                       const std::string& model_path,
                                                       const BackendOptions& opts);

}  // namespace ds
