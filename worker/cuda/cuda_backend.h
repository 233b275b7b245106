// CUDA backend: the qwen35 forward pass on one GPU, behind the ds::Backend interface.
//
// Weights stay in their GGUF block formats in one device allocation (under tensor parallelism only
// this rank's shard of them, cut by the CPU backend's plan: docs/tp.md "CUDA shards"). Decode rows (one token of a
// sequence) go through the quantized GEMV kernels (up to 8 activation columns per weight read),
// prefill rows through dequantize-to-bf16 + cuBLAS. Pure-decode steps are captured once per batch
// size as a CUDA graph and replayed. A memory plan (weights / KV / recurrent state / workspace) is
// computed before any allocation and a clear error names the shortfall.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/model/backend.h"
#include "worker/tp/plan.h"
#include "worker/model/kv_type.h"

namespace ds {

struct CudaBackendOptions {
  int max_step_tokens = 4096;  // token rows per internal micro-step (longer prefills are split)
  int kv_page_size = 64;       // tokens per KV page
  bool use_graphs = true;      // CUDA graphs for pure-decode steps
  int gemv_max_rows = 32;      // up to this many rows per matmul use GEMV (in groups of 8)
  // KV cache element type (worker/model/kv_type.h): F16, Q8_0 (8.5 bits) or Q4_0 (4.5 bits) per
  // element. Per token and attention layer: 2 x n_kv x GgmlRowBytes(kv_type, hd), i.e. at
  // n_kv 4, hd 256: 4096 / 2176 / 1152 bytes.
  GgmlType kv_type = GgmlType::F16;
};

// Bytes the backend needs, computed from the file and options before any cudaMalloc. Under
// tensor parallelism: this rank's share (its shard of the weights, the KV of its KV heads, the
// recurrent state of its GDN heads, workspace sized for its local widths).
struct CudaMemoryPlan {
  uint64_t weights = 0;
  uint64_t kv_cache = 0;
  uint64_t recurrent = 0;
  uint64_t workspace = 0;
  uint64_t total() const { return weights + kv_cache + recurrent + workspace; }
  std::string ToString() const;
};

// Takes the KV type from opts.kv_type (the generic flag path: worker, generate).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const std::string& path,
                                                           const BackendOptions& opts);

namespace cuda {

// The concrete backend, for tools that need more than the Backend interface (bench, server).
class CudaBackendApi : public Backend {
 public:
  // Forward that keeps logits on the GPU and returns the argmax token of every output row.
  virtual absl::Status ForwardGreedy(std::span<const SeqStep> batch, std::vector<int32_t>* tokens,
                                     double* seconds) = 0;
  virtual const CudaMemoryPlan& memory_plan() const = 0;
  // The TP plan this rank applied (null without tensor parallelism).
  virtual const tp::Plan* tp_plan() const = 0;
  // Bytes of weight matrices one forward step reads (every layer matrix + the LM head).
  virtual uint64_t StepWeightBytes() const = 0;
  // Profiling pass: when on, graphs are off and every op class is bracketed by CUDA events;
  // ProfileTotals() gives accumulated milliseconds per class since ResetProfile().
  virtual void SetProfiling(bool on) = 0;
  virtual void ResetProfile() = 0;
  virtual std::vector<std::pair<std::string, double>> ProfileTotals() const = 0;
};

// The KV type is copts.kv_type; opts.kv_type must be F16 (unset) or the same.
absl::StatusOr<std::unique_ptr<CudaBackendApi>> CreateCudaBackendApi(
    const std::string& path, const BackendOptions& opts, const CudaBackendOptions& copts = {});

}  // namespace cuda
}  // namespace ds
