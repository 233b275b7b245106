// Weight binding for a qwen35 GGUF: per-layer pointers into the mapped file for the matrices
// (any supported ggml type, used in place) and f32 copies of the small 1-D tensors.
// Every tensor's shape is validated against the ModelConfig (spec/model.md §5.1, §6.1, §7, §8.4).
#pragma once
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/util/status.h"
#include "kernels/cpu/ops.h"
#include "worker/model/config.h"
#include "worker/tp/shard.h"

namespace ds {

struct GdnLayerWeights {
  cpu::WeightView qkv;       // [C, H]
  cpu::WeightView gate;      // [Hv*dv, H]  (z)
  cpu::WeightView beta;      // [Hv, H]
  cpu::WeightView alpha;     // [Hv, H]
  cpu::WeightView out;       // [H, Hv*dv]
  std::vector<float> conv;   // [C, K]
  std::vector<float> ssm_a;  // [Hv]  = -exp(A_log)
  std::vector<float> dt_bias;  // [Hv]
  std::vector<float> norm;   // [dv]
};

struct AttnLayerWeights {
  cpu::WeightView q;         // [n_head*2*hd, H]  per head [query | gate]
  cpu::WeightView k;         // [n_kv*hd, H]
  cpu::WeightView v;         // [n_kv*hd, H]
  cpu::WeightView out;       // [H, n_head*hd]
  std::vector<float> q_norm;  // [hd]
  std::vector<float> k_norm;  // [hd]
};

struct LayerWeights {
  bool recurrent = false;
  std::vector<float> attn_norm;  // [H]
  std::vector<float> post_norm;  // [H]
  GdnLayerWeights gdn;           // when recurrent
  AttnLayerWeights attn;         // when !recurrent
  cpu::WeightView ffn_gate;      // [n_ff, H]
  cpu::WeightView ffn_up;        // [n_ff, H]
  cpu::WeightView ffn_down;      // [H, n_ff]
};

struct MtpWeights {
  LayerWeights layer;               // a full-attention layer
  cpu::WeightView eh_proj;          // [H, 2H]; input = concat(enorm(e), hnorm(h))
  std::vector<float> enorm, hnorm, shared_head_norm;  // [H]
  cpu::WeightView embed;            // nextn.embed_tokens or token_embd
  cpu::WeightView head;             // nextn.shared_head_head or the main lm head
};

struct ModelWeights {
  cpu::WeightView token_embd;       // [n_vocab, H]
  cpu::WeightView output;           // [n_vocab, H]; token_embd when the file is tied
  bool tied_output = false;
  std::vector<float> output_norm;   // [H]
  std::vector<LayerWeights> layers;  // [n_layer]
  bool has_mtp = false;
  MtpWeights mtp;

  // Tensor-parallel shard (Load with a plan): the views above hold only rank `tp_rank`'s rows /
  // columns (worker/tp/plan.h CutFor), so their rows/cols are the local sizes; bytes that could
  // not stay in the mapping live in shard_store. The MTP block is cut like the trunk (weights.cc).
  tp::ShardStore shard_store;
  uint64_t dequantized_bytes = 0;   // f32 copies of unaligned column slices (worker/tp/shard.h)

  // Binds every tensor. Errors name the tensor and give expected vs actual ne / the bad type.
  // With `plan` (TP), binds only rank `tp_rank`'s shard of every tensor.
  static absl::StatusOr<ModelWeights> Load(const gguf::File& f, const ModelConfig& c,
                                           const tp::Plan* plan = nullptr, int tp_rank = 0);
};

// Number of tensors a complete file of this config holds (§9.4): 3 (+ output) globals,
// 14 per GDN layer, 11 per attention layer, 15 for the MTP block.
int ExpectedTensorCount(const ModelConfig& c, bool tied_output);

}  // namespace ds
