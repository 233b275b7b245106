#include "worker/model/cpu_backend.h"

#include "absl/strings/str_cat.h"
#include "worker/model/kv_type.h"

namespace ds {

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const std::string& model_path,
                                                          const BackendOptions& opts) {
  DS_ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> b, CpuBackend::Create(model_path, opts));
  return std::unique_ptr<Backend>(std::move(b));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(std::shared_ptr<const gguf::File> file,
                                                          const BackendOptions& opts) {
  DS_ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> b, CpuBackend::Create(std::move(file), opts));
  return std::unique_ptr<Backend>(std::move(b));
}

CpuBackend::CpuBackend(std::unique_ptr<CpuDevice> device, std::shared_ptr<const gguf::File> file,
                       const ModelConfig& cfg, const BackendOptions& opts, TpPlacement tp)
    : StepRunner(std::move(device), std::move(file), cfg, opts.n_slots, opts.slot_ctx,
                 std::move(tp), DeviceSlots(opts)),
      cpu_(static_cast<CpuDevice*>(&StepRunner::device())) {}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const std::string& path,
                                                               const BackendOptions& opts) {
  DS_ASSIGN_OR_RETURN(std::unique_ptr<gguf::File> f, gguf::File::Open(path));
  return Create(std::shared_ptr<const gguf::File>(std::move(f)), opts);
}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(
    std::shared_ptr<const gguf::File> file, const BackendOptions& opts) {
  if (opts.kv_type != GgmlType::F16)
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-type ", KvTypeName(opts.kv_type),
        ": the CPU backend keeps its KV cache in f32 and has no quantized KV; use --backend cuda "
        "for q8_0 / q4_0 KV, or the default f16"));
  DS_ASSIGN_OR_RETURN(const ModelConfig cfg, ModelConfig::FromGguf(*file));
  DS_ASSIGN_OR_RETURN(TpPlacement tp, PlaceInGroup(*file, cfg, opts));
  DS_ASSIGN_OR_RETURN(std::unique_ptr<CpuDevice> dev,
                      CpuDevice::Create(*file, cfg, tp, DeviceSlots(opts), opts.slot_ctx,
                                        opts.n_threads, opts.kv_page_size, opts.kv_pool_tokens));
  dev->set_gdn_state_bf16(opts.gdn_state_bf16);
  dev->set_prefill_fp8(opts.prefill_fp8, opts.fp8_decode_rows);
  return std::unique_ptr<CpuBackend>(
      new CpuBackend(std::move(dev), std::move(file), cfg, opts, std::move(tp)));
}

}  // namespace ds
