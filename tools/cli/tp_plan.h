// `deltaserve tp-plan` (issue #19): the tensor-parallel split and the memory plan of every rank
// for given card sizes, without a GPU and, with --synth, without the model file. It runs the
// code the workers run — tp::Plan::Make (the TP --split, head/FFN granules), tp::PlanMemory
// (each rank's weight bytes as the shard loader cuts them) and the memory planner
// (worker/runner/memory_planner.h: slots, context, KV pool) — on CUDA workspace figures that are
// estimates (TpPlanWorkspace below), since only the device knows its exact workspace.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "common/gguf/gguf.h"
#include "common/util/status.h"
#include "worker/model/config.h"

namespace ds::cli {

// The tensor table (names, shapes, types, bytes) and configuration of a 27B-shaped model whose
// matrices follow llama.cpp's Q4_K_M rules as we read them (llama_tensor_get_type): Q4_K, with
// output.weight Q6_K, attn_qkv Q5_K, and attn_v / ffn_down Q6_K on the "more bits" layers (the
// first and last eighth, and every third in between); norms, ssm_a/dt/conv and ssm_alpha/beta F32.
// `mix` "q4_k_m", or a single type name ("Q6_K", "Q4_K", ...) for every matrix.
struct DescribedModel {
  ModelConfig config;
  std::vector<gguf::TensorInfo> tensors;
  uint64_t bytes = 0;  // sum of tensor bytes
};
absl::StatusOr<DescribedModel> Describe27B(const std::string& mix);

struct TpPlanOptions {
  std::vector<double> card_mib;  // [world] total memory of each card, MiB (nvidia-smi's figure)
  std::vector<double> split;     // TP share weights; empty = by free memory (--split mem)
  GgmlType kv_type = GgmlType::Q4_0;
  int64_t ctx = 204800;          // per-slot context (the scheduler's --ctx)
  int slots = 1;                 // 0 = the planner picks
  int max_step_tokens = 1024;    // CUDA micro-step rows (workspace scales with it)
  bool mtp = false;              // not under TP: refused by the worker; kept for one-card plans
  bool gdn_state_bf16 = false;   // the workers' --gdn-state bf16: half the delta-rule state bytes
};

// The report: the split, each rank's heads / FFN columns / vocabulary rows, weight bytes, and
// the memory plan (or the planner's refusal with its nearest fitting setting) per rank.
absl::StatusOr<std::string> TpPlanReport(const ModelConfig& c,
                                         const std::vector<gguf::TensorInfo>& tensors,
                                         const TpPlanOptions& o);

}  // namespace ds::cli
