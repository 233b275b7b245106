#include "worker/cuda/cuda_backend.h"

#include "absl/strings/str_cat.h"
#include "worker/cuda/cuda_device.h"
#include "worker/model/kv_type.h"

namespace ds {
namespace cuda {

CudaBackend::CudaBackend(std::unique_ptr<CudaDevice> device,
                         std::shared_ptr<const gguf::File> file, const ModelConfig& cfg,
                         const BackendOptions& opts, TpPlacement tp)
    : StepRunner(std::move(device), std::move(file), cfg, opts.n_slots, opts.slot_ctx,
                 std::move(tp), DeviceSlots(opts)),
      cuda_(static_cast<CudaDevice*>(&StepRunner::device())) {}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    std::shared_ptr<const gguf::File> file, const BackendOptions& opts,
    const CudaBackendOptions& copts) {
  if (opts.kv_type != GgmlType::F16 && opts.kv_type != copts.kv_type)
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA backend: BackendOptions.kv_type ", KvTypeName(opts.kv_type),
        " disagrees with CudaBackendOptions.kv_type ", KvTypeName(copts.kv_type)));
  DS_ASSIGN_OR_RETURN(const ModelConfig cfg, ModelConfig::FromGguf(*file));
  DS_ASSIGN_OR_RETURN(TpPlacement tp, PlaceInGroup(*file, cfg, opts));
  // The pool figures of the generic options win where they are set.
  CudaBackendOptions co = copts;
  if (opts.kv_pool_tokens > 0) co.kv_pool_tokens = opts.kv_pool_tokens;
  if (opts.kv_page_size > 0) co.kv_page_size = opts.kv_page_size;
  if (opts.memory_fraction < 1.0) co.memory_fraction = opts.memory_fraction;
  if (opts.max_step_tokens > 0) co.max_step_tokens = opts.max_step_tokens;
  if (opts.portable) co.portable = true;
  if (opts.dense_weights != DenseWeights::kAuto) co.dense_weights = opts.dense_weights;
  if (!opts.early_launch) co.early_launch = false;
  if (!opts.tiled_f16_formats) co.tiled_f16_formats = false;
  if (!opts.f16_wgmma) co.f16_wgmma = false;
  if (opts.prefill_fp8) co.prefill_fp8 = true;
  if (opts.fp8_decode_rows != BackendOptions{}.fp8_decode_rows) co.fp8_decode_rows = opts.fp8_decode_rows;
  if (!opts.coarse_draft_head) co.coarse_draft_head = false;
  if (!opts.fused_draft_chain) co.fused_draft_chain = false;
  if (!opts.judged_chains) co.judged_chains = false;
  if (opts.draft_chain_resident) co.draft_chain_resident = true;
  if (opts.draft_chain_fold_prep) co.draft_chain_fold_prep = true;
  if (opts.gdn_one_group_runs) co.gdn_one_group_runs = true;
  if (opts.draft_chain_prefetch) co.draft_chain_prefetch = true;
  if (opts.gdn_state_bf16) co.gdn_state_bf16 = true;
  if (opts.prefix_cache_bytes > 0) {
    co.prefix_cache_bytes = opts.prefix_cache_bytes;
    co.prefix_cache_required = opts.prefix_cache_required;
  }
  DS_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> dev,
                      CudaDevice::Create(*file, cfg, tp, opts.device, DeviceSlots(opts),
                                         opts.slot_ctx, co));
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(std::move(dev), std::move(file), cfg, opts, std::move(tp)));
}

const CudaMemoryPlan& CudaBackend::memory_plan() const { return cuda_->memory_plan(); }
bool CudaBackend::portable() const { return cuda_->portable(); }
uint64_t CudaBackend::StepWeightBytes() const { return cuda_->StepWeightBytes(); }
void CudaBackend::SetProfiling(bool on) { cuda_->SetProfiling(on); }
void CudaBackend::ResetProfile() { cuda_->ResetProfile(); }
int64_t CudaBackend::OverlappedAllReduces() const { return cuda_->overlapped_allreduces(); }
int64_t CudaBackend::FusedDraftChains() const { return cuda_->fused_draft_chains(); }
int64_t CudaBackend::SideCopyBatches() const { return cuda_->side_copy_batches(); }
int64_t CudaBackend::JudgedDraftChains() const { return cuda_->judged_draft_chains(); }
bool CudaBackend::FusedDraftChainResident() const { return cuda_->fused_draft_chain_resident(); }
std::string CudaBackend::DraftChainForm() const { return cuda_->draft_chain_form(); }
std::vector<std::pair<std::string, double>> CudaBackend::ProfileTotals() const {
  return cuda_->ProfileTotals();
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CreateCudaBackendApi(
    const std::string& path, const BackendOptions& opts, const CudaBackendOptions& copts) {
  DS_ASSIGN_OR_RETURN(std::unique_ptr<gguf::File> f, gguf::File::Open(path));
  return CudaBackend::Create(std::shared_ptr<const gguf::File>(std::move(f)), opts, copts);
}

}  // namespace cuda

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(std::shared_ptr<const gguf::File> file,
                                                           const BackendOptions& opts,
                                                           const CudaBackendOptions& copts) {
  DS_ASSIGN_OR_RETURN(auto b, cuda::CudaBackend::Create(std::move(file), opts, copts));
  return std::unique_ptr<Backend>(std::move(b));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const std::string& path,
                                                           const BackendOptions& opts) {
  CudaBackendOptions copts;
  copts.kv_type = opts.kv_type;
  DS_ASSIGN_OR_RETURN(auto b, cuda::CreateCudaBackendApi(path, opts, copts));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace ds
