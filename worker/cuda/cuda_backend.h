// The CUDA backend: the step runner (worker/runner/step_runner.h) over the CUDA device
// (worker/cuda/cuda_device.h), plus what tools need beyond the Backend interface (the memory
// plan, the bytes a step reads, the profiling pass).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/gguf/gguf.h"
#include "worker/cuda/cuda_options.h"
#include "worker/model/backend.h"
#include "worker/runner/step_runner.h"

namespace ds {

// Takes the KV type from opts.kv_type (the generic flag path: worker, generate).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const std::string& path,
                                                           const BackendOptions& opts);
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(std::shared_ptr<const gguf::File> file,
                                                           const BackendOptions& opts,
                                                           const CudaBackendOptions& copts);

namespace cuda {

class CudaDevice;

class CudaBackend final : public StepRunner {
 public:
  // The KV type is copts.kv_type; opts.kv_type must be F16 (unset) or the same.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      std::shared_ptr<const gguf::File> file, const BackendOptions& opts,
      const CudaBackendOptions& copts);

  const CudaMemoryPlan& memory_plan() const;
  bool portable() const;  // the portable (sm_70) kernel path runs (CudaBackendOptions::portable)
  // Bytes of weight matrices one forward step reads (every layer matrix + the LM head).
  uint64_t StepWeightBytes() const;
  // Profiling pass: when on, graphs are off and every op class is bracketed by CUDA events;
  // ProfileTotals() gives accumulated milliseconds per class since ResetProfile().
  void SetProfiling(bool on);
  void ResetProfile();
  std::vector<std::pair<std::string, double>> ProfileTotals() const;
  // TP all-reduces that ran overlapped with the projection GEMMs (CudaBackendOptions::
  // overlap_allreduce), since start: lets tests see that the path ran.
  int64_t OverlappedAllReduces() const;
  // Greedy draft chains run by the fused kernel (CudaBackendOptions::fused_draft_chain).
  int64_t FusedDraftChains() const;
  // Batches of copies run beside the device stream (CudaBackendOptions::side_copies).
  int64_t SideCopyBatches() const;
  // Draft chains judged on the device behind a verify (CudaBackendOptions::judged_chains).
  int64_t JudgedDraftChains() const;
  // Whether the fused chain runs in its resident form (CudaBackendOptions::draft_chain_resident).
  bool FusedDraftChainResident() const;
  // The greedy draft chain's form, for the bench's MTP section: "per kernel", or "fused, global
  // form, B blocks" / "fused, resident form, B blocks, N KiB of shared memory each".
  std::string DraftChainForm() const;

 private:
  CudaBackend(std::unique_ptr<CudaDevice> device, std::shared_ptr<const gguf::File> file,
              const ModelConfig& cfg, const BackendOptions& opts, TpPlacement tp);
  CudaDevice* cuda_;  // owned by the runner
};

// The name the bench and the TP driver use.
using CudaBackendApi = CudaBackend;

absl::StatusOr<std::unique_ptr<CudaBackend>> CreateCudaBackendApi(
    const std::string& path, const BackendOptions& opts, const CudaBackendOptions& copts = {});

}  // namespace cuda
}  // namespace ds
