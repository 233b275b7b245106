// Chooses and creates a compute backend: "cpu", "cuda" or "auto" (CUDA when this build has it and
// a device is present, else CPU).
#pragma once
#include <memory>
#include <string>

#include "common/gguf/gguf.h"
#include "worker/model/backend.h"

namespace ds {

bool CudaAvailable();  // compiled with CUDA and at least one device visible
int CudaDeviceCount();  // visible CUDA devices; 0 without CUDA in this build

// "cpu" or "cuda" for a --backend value: "auto" resolves to what CreateBackend would create;
// errors as CreateBackend's (unknown kind, no CUDA in this build or no device visible).
absl::StatusOr<std::string> ResolveBackendKind(const std::string& kind);

// The device a backend of `kind` runs on: "cpu" or "cuda:<opts.device>".
absl::StatusOr<std::string> BackendDeviceName(const std::string& kind, const BackendOptions& opts);

// Over a file that is already open (the backend keeps a reference: CPU weights are views into it).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& kind,
                                                       std::shared_ptr<const gguf::File> file,
                                                       const BackendOptions& opts);
// Opens model_path first.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& kind,
                                                       const std::string& model_path,
                                                       const BackendOptions& opts);

// Room for speculative verify steps (MTP, issue #15; SeqStep::speculative): up to `tokens` tokens
// per sequence (k drafts + 1; --mtp K gives K + 1) for `seqs` sequences of one Forward (0 = the
// device's default). The CPU backend always has room for 16 tokens per slot (its state entries
// are taken when first used) and ignores this; the CUDA backend reserves GDN state entries for
// tokens x seqs tokens (~150 MiB each on the 27B, out of the KV pool) and uploads the MTP block
// (CudaBackendOptions::spec_tokens / spec_seqs). tokens 0: no speculative steps on CUDA.
struct SpeculativeRoom {
  int tokens = 0;
  int seqs = 0;
};
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& kind,
                                                       std::shared_ptr<const gguf::File> file,
                                                       const BackendOptions& opts,
                                                       const SpeculativeRoom& spec);
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& kind,
                                                       const std::string& model_path,
                                                       const BackendOptions& opts,
                                                       const SpeculativeRoom& spec);

}  // namespace ds
