// ModelConfig::FromGguf: reads and validates the qwen35 hyper-parameters (spec/model.md §1, §9.3).
#include "worker/model/config.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace ds {

int ModelConfig::n_recurrent() const {
  int n = 0;
  for (bool r : is_recurrent) n += r ? 1 : 0;
  return n;
}
int ModelConfig::n_attention() const { return static_cast<int>(is_recurrent.size()) - n_recurrent(); }

namespace {

// Integer key of any width, in [lo, hi].
absl::StatusOr<int> GetIntKey(const gguf::File& f, const std::string& key, int64_t lo,
                              int64_t hi = std::numeric_limits<int>::max()) {
  const gguf::Value* v = f.Find(key);
  if (!v) return absl::InvalidArgumentError(absl::StrCat("missing metadata key ", key));
  if (!v->is_integer())
    return absl::InvalidArgumentError(absl::StrCat("metadata key ", key, " must be an integer, is ",
                                                   std::string(gguf::ValueTypeName(v->type))));
  absl::StatusOr<int64_t> x = f.GetInt(key);
  if (!x.ok()) return absl::InvalidArgumentError(absl::StrCat("metadata key ", key, ": ", x.status().message()));
  if (*x < lo || *x > hi)
    return absl::InvalidArgumentError(
        absl::StrCat("metadata key ", key, " = ", *x, " out of range [", lo, ", ", hi, "]"));
  return static_cast<int>(*x);
}

absl::StatusOr<int> GetIntKeyOr(const gguf::File& f, const std::string& key, int dflt, int64_t lo,
                                int64_t hi = std::numeric_limits<int>::max()) {
  if (!f.Find(key)) return dflt;
  return GetIntKey(f, key, lo, hi);
}

absl::StatusOr<float> GetFloatKey(const gguf::File& f, const std::string& key) {
  const gguf::Value* v = f.Find(key);
  if (!v) return absl::InvalidArgumentError(absl::StrCat("missing metadata key ", key));
  absl::StatusOr<double> x = f.GetFloat(key);
  if (!x.ok())
    return absl::InvalidArgumentError(absl::StrCat("metadata key ", key, ": ", x.status().message()));
  return static_cast<float>(*x);
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromGguf(const gguf::File& f) {
  ModelConfig c;
  {
    const gguf::Value* v = f.Find("general.architecture");
    if (!v) return absl::InvalidArgumentError("missing metadata key general.architecture");
    absl::StatusOr<std::string> arch = f.GetString("general.architecture");
    if (!arch.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("metadata key general.architecture: ", arch.status().message()));
    if (*arch != "qwen35")
      return absl::InvalidArgumentError(absl::StrCat(
          "unsupported architecture '", *arch, "' (general.architecture); only 'qwen35' is supported"));
    c.arch = *arch;
  }
  const std::string p = c.arch + ".";
  DS_ASSIGN_OR_RETURN(const int block_count, GetIntKey(f, p + "block_count", 1));
  DS_ASSIGN_OR_RETURN(c.n_nextn, GetIntKeyOr(f, p + "nextn_predict_layers", 0, 0, 1));
  if (block_count <= c.n_nextn)
    return absl::InvalidArgumentError(absl::StrCat(p, "block_count = ", block_count,
                                                   " leaves no trunk layers after ", p,
                                                   "nextn_predict_layers = ", c.n_nextn));
  c.n_layer = block_count - c.n_nextn;
  DS_ASSIGN_OR_RETURN(c.n_ctx_train, GetIntKey(f, p + "context_length", 1));
  DS_ASSIGN_OR_RETURN(c.n_embd, GetIntKey(f, p + "embedding_length", 1));
  DS_ASSIGN_OR_RETURN(c.n_ff, GetIntKey(f, p + "feed_forward_length", 1));
  DS_ASSIGN_OR_RETURN(c.n_head, GetIntKey(f, p + "attention.head_count", 1));
  DS_ASSIGN_OR_RETURN(c.n_head_kv, GetIntKey(f, p + "attention.head_count_kv", 1));
  DS_ASSIGN_OR_RETURN(const int key_len, GetIntKey(f, p + "attention.key_length", 1));
  DS_ASSIGN_OR_RETURN(const int val_len, GetIntKey(f, p + "attention.value_length", 1));
  if (key_len != val_len)
    return absl::InvalidArgumentError(absl::StrCat(p, "attention.key_length (", key_len, ") != ", p,
                                                   "attention.value_length (", val_len, ")"));
  c.head_dim = key_len;
  DS_ASSIGN_OR_RETURN(c.rms_eps, GetFloatKey(f, p + "attention.layer_norm_rms_epsilon"));
  if (!(c.rms_eps > 0 && c.rms_eps < 1))
    return absl::InvalidArgumentError(
        absl::StrCat(p, "attention.layer_norm_rms_epsilon = ", c.rms_eps, " must be in (0, 1)"));
  DS_ASSIGN_OR_RETURN(c.rope_base, GetFloatKey(f, p + "rope.freq_base"));
  if (!(c.rope_base > 1))
    return absl::InvalidArgumentError(absl::StrCat(p, "rope.freq_base = ", c.rope_base, " must be > 1"));
  DS_ASSIGN_OR_RETURN(c.n_rot, GetIntKey(f, p + "rope.dimension_count", 2, c.head_dim));
  if (c.n_rot % 2 != 0)
    return absl::InvalidArgumentError(absl::StrCat(p, "rope.dimension_count = ", c.n_rot, " must be even"));
  {
    // MRoPE sections: required by llama.cpp; for text they only need to be well-formed.
    const std::string key = p + "rope.dimension_sections";
    if (!f.Find(key)) return absl::InvalidArgumentError(absl::StrCat("missing metadata key ", key));
    absl::StatusOr<std::vector<int64_t>> s = f.GetIntArray(key);
    if (!s.ok())
      return absl::InvalidArgumentError(absl::StrCat("metadata key ", key, ": ", s.status().message()));
    int64_t sum = 0;
    for (int64_t x : *s) {
      if (x < 0) return absl::InvalidArgumentError(absl::StrCat("metadata key ", key, " has a negative section"));
      sum += x;
    }
    if (sum > c.n_rot / 2)
      return absl::InvalidArgumentError(absl::StrCat("metadata key ", key, " sums to ", sum,
                                                     " > rotary pairs ", c.n_rot / 2));
  }
  DS_ASSIGN_OR_RETURN(c.conv_kernel, GetIntKey(f, p + "ssm.conv_kernel", 1, 64));
  DS_ASSIGN_OR_RETURN(c.gdn_k_dim, GetIntKey(f, p + "ssm.state_size", 1));
  DS_ASSIGN_OR_RETURN(c.gdn_k_heads, GetIntKey(f, p + "ssm.group_count", 1));
  DS_ASSIGN_OR_RETURN(c.gdn_v_heads, GetIntKey(f, p + "ssm.time_step_rank", 1));
  DS_ASSIGN_OR_RETURN(const int inner, GetIntKey(f, p + "ssm.inner_size", 1));
  if (inner % c.gdn_v_heads != 0)
    return absl::InvalidArgumentError(absl::StrCat(p, "ssm.inner_size (", inner,
                                                   ") is not a multiple of ", p,
                                                   "ssm.time_step_rank (", c.gdn_v_heads, ")"));
  c.gdn_v_dim = inner / c.gdn_v_heads;
  if (c.gdn_v_heads % c.gdn_k_heads != 0)
    return absl::InvalidArgumentError(absl::StrCat(p, "ssm.time_step_rank (", c.gdn_v_heads,
                                                   ") is not a multiple of ", p,
                                                   "ssm.group_count (", c.gdn_k_heads, ")"));
  if (c.n_head % c.n_head_kv != 0)
    return absl::InvalidArgumentError(absl::StrCat(p, "attention.head_count (", c.n_head,
                                                   ") is not a multiple of ", p,
                                                   "attention.head_count_kv (", c.n_head_kv, ")"));
  DS_ASSIGN_OR_RETURN(const int interval, GetIntKeyOr(f, p + "full_attention_interval", 4, 1));

  // Layer types: explicit per-layer array wins over the interval rule.
  c.is_recurrent.assign(c.n_layer, false);
  const std::string rkey = p + "attention.recurrent_layers";
  if (const gguf::Value* rv = f.Find(rkey)) {
    const auto* arr = std::get_if<gguf::Array>(&rv->v);
    if (!arr) return absl::InvalidArgumentError(absl::StrCat("metadata key ", rkey, " must be an array"));
    if (static_cast<int>(arr->items.size()) != c.n_layer &&
        static_cast<int>(arr->items.size()) != block_count)
      return absl::InvalidArgumentError(absl::StrCat("metadata key ", rkey, " has ", arr->items.size(),
                                                     " entries, expected ", c.n_layer, " or ",
                                                     block_count));
    for (int i = 0; i < c.n_layer; ++i) {
      const gguf::Value& e = arr->items[i];
      if (const bool* b = std::get_if<bool>(&e.v)) {
        c.is_recurrent[i] = *b;
      } else if (const uint64_t* u = std::get_if<uint64_t>(&e.v)) {
        c.is_recurrent[i] = *u != 0;
      } else if (const int64_t* s = std::get_if<int64_t>(&e.v)) {
        c.is_recurrent[i] = *s != 0;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("metadata key ", rkey, " entry ", i, " is not a bool or integer"));
      }
    }
  } else {
    for (int i = 0; i < c.n_layer; ++i) c.is_recurrent[i] = (i + 1) % interval != 0;
  }

  // Vocabulary = rows of token_embd; the embedding width must match the hidden size.
  const gguf::TensorInfo* emb = f.FindTensor("token_embd.weight");
  if (!emb) return absl::InvalidArgumentError("missing tensor token_embd.weight");
  if (emb->n_dims != 2 || emb->ne[0] != c.n_embd)
    return absl::InvalidArgumentError(absl::StrCat("tensor token_embd.weight has ne {", emb->ne[0], ", ",
                                                   emb->ne[1], "}, expected {", c.n_embd,
                                                   ", n_vocab} (", p, "embedding_length)"));
  if (emb->ne[1] < 1 || emb->ne[1] > std::numeric_limits<int>::max())
    return absl::InvalidArgumentError("tensor token_embd.weight has an invalid row count");
  c.n_vocab = static_cast<int>(emb->ne[1]);
  if (f.Find(p + "vocab_size")) {
    DS_ASSIGN_OR_RETURN(const int vs, GetIntKey(f, p + "vocab_size", 1));
    if (vs != c.n_vocab)
      return absl::InvalidArgumentError(absl::StrCat(p, "vocab_size = ", vs,
                                                     " != rows of token_embd.weight (", c.n_vocab, ")"));
  }
  return c;
}

}  // namespace ds
