// Model hyper-parameters of a qwen35 GGUF (spec/model.md §1, §9.3), read from metadata.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/util/status.h"

namespace ds {

struct ModelConfig {
  std::string arch;            // "qwen35"
  int n_layer = 0;             // trunk layers (block_count - nextn_predict_layers)
  int n_nextn = 0;             // MTP layers stored after the trunk (0 or 1)
  int n_embd = 0;              // hidden size H
  int n_ff = 0;                // FFN size
  int n_vocab = 0;             // rows of token_embd
  int n_ctx_train = 0;         // context_length
  float rms_eps = 1e-6f;
  // Gated attention
  int n_head = 0;              // query heads
  int n_head_kv = 0;           // KV heads
  int head_dim = 0;            // key_length == value_length
  int n_rot = 0;               // rope.dimension_count (rotated dims per head, NeoX pairs i, i+n_rot/2)
  float rope_base = 1e7f;
  // Gated DeltaNet
  int conv_kernel = 0;         // ssm.conv_kernel (4)
  int gdn_k_heads = 0;         // ssm.group_count (Hk)
  int gdn_v_heads = 0;         // ssm.time_step_rank (Hv)
  int gdn_k_dim = 0;           // ssm.state_size (dk)
  int gdn_v_dim = 0;           // ssm.inner_size / Hv (dv)
  std::vector<bool> is_recurrent;  // [n_layer]: true = GDN layer, false = full attention

  int gdn_conv_channels() const { return 2 * gdn_k_heads * gdn_k_dim + gdn_v_heads * gdn_v_dim; }
  int gdn_value_width() const { return gdn_v_heads * gdn_v_dim; }
  int n_recurrent() const;     // number of GDN layers
  int n_attention() const;     // number of full-attention trunk layers

  // Reads and validates every key; errors name the key. Accepts any integer width.
  static absl::StatusOr<ModelConfig> FromGguf(const gguf::File& file);
};

}  // namespace ds
