// ModelWeights::Load (see weights.h).
#include "worker/model/weights.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/quant.h"

namespace ds {
namespace {

std::string NeStr(const gguf::TensorInfo& t) {
  std::string s = "{";
  for (int i = 0; i < t.n_dims; ++i) absl::StrAppend(&s, i ? ", " : "", t.ne[i]);
  return s + "}";
}
std::string NeStr(const std::vector<int64_t>& ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) absl::StrAppend(&s, i ? ", " : "", ne[i]);
  return s + "}";
}

absl::StatusOr<const gguf::TensorInfo*> Tensor(const gguf::File& f, const std::string& name,
                                               const std::vector<int64_t>& ne) {
  const gguf::TensorInfo* t = f.FindTensor(name);
  if (!t) return absl::InvalidArgumentError(absl::StrCat("missing tensor ", name, " (expected ne ", NeStr(ne), ")"));
  bool ok = t->n_dims == static_cast<int>(ne.size());
  for (size_t i = 0; ok && i < ne.size(); ++i) ok = t->ne[i] == ne[i];
  if (!ok)
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " has ne ", NeStr(*t), ", expected ", NeStr(ne)));
  const GgmlTypeInfo* ti = FindGgmlType(static_cast<uint32_t>(t->type));
  if (!ti || !ti->supported)
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has unsupported type ",
                                                   ti ? std::string(ti->name) : std::string("?"), " (",
                                                   static_cast<uint32_t>(t->type), ")"));
  if (t->ne[0] % ti->block_elems != 0)
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " row length ", t->ne[0],
                                                   " is not a multiple of the ", std::string(ti->name),
                                                   " block size ", ti->block_elems));
  if (!t->data) return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has no data"));
  return t;
}

// 2-D matrix [rows, cols] (ggml ne {cols, rows}).
absl::StatusOr<cpu::WeightView> Matrix(const gguf::File& f, const std::string& name, int64_t cols,
                                       int64_t rows) {
  DS_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, Tensor(f, name, {cols, rows}));
  return cpu::WeightView{t->type, t->data, cols, rows};
}

// Any-type tensor of the given shape, dequantized to f32 (row by row).
absl::StatusOr<std::vector<float>> Floats(const gguf::File& f, const std::string& name,
                                          const std::vector<int64_t>& ne) {
  DS_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, Tensor(f, name, ne));
  std::vector<float> out(static_cast<size_t>(t->n_elements()));
  const uint64_t rb = t->row_bytes();
  for (int64_t r = 0; r < t->n_rows(); ++r)
    cpu::DequantizeRow(t->type, t->data + r * rb, out.data() + r * t->ne[0], t->ne[0]);
  return out;
}

// Applies a rank's cut (no plan: the full tensor) to every tensor as it is bound.
struct Sharder {
  const ModelConfig* c = nullptr;
  const tp::Plan* plan = nullptr;
  int rank = 0;
  ModelWeights* w = nullptr;
  absl::StatusOr<cpu::WeightView> M(const gguf::File& f, const std::string& pre,
                                    const std::string& suffix, int64_t cols, int64_t rows) const {
    DS_ASSIGN_OR_RETURN(cpu::WeightView v, Matrix(f, pre + suffix, cols, rows));
    if (!plan) return v;
    return tp::CutMatrix(v, tp::CutFor(*c, *plan, rank, suffix), pre + suffix, &w->shard_store,
                         &w->dequantized_bytes);
  }
  absl::StatusOr<std::vector<float>> F(const gguf::File& f, const std::string& pre,
                                       const std::string& suffix,
                                       const std::vector<int64_t>& ne) const {
    DS_ASSIGN_OR_RETURN(std::vector<float> v, Floats(f, pre + suffix, ne));
    if (!plan) return v;
    return tp::CutFloats(v, ne[0], tp::CutFor(*c, *plan, rank, suffix), pre + suffix);
  }
};

absl::Status LoadAttention(const gguf::File& f, const ModelConfig& c, const std::string& pre,
                           const Sharder& sh, AttnLayerWeights* w) {
  const int64_t H = c.n_embd, hd = c.head_dim;
  DS_ASSIGN_OR_RETURN(w->q, sh.M(f, pre, "attn_q.weight", H, 2 * c.n_head * hd));
  DS_ASSIGN_OR_RETURN(w->k, sh.M(f, pre, "attn_k.weight", H, c.n_head_kv * hd));
  DS_ASSIGN_OR_RETURN(w->v, sh.M(f, pre, "attn_v.weight", H, c.n_head_kv * hd));
  DS_ASSIGN_OR_RETURN(w->out, sh.M(f, pre, "attn_output.weight", c.n_head * hd, H));
  DS_ASSIGN_OR_RETURN(w->q_norm, sh.F(f, pre, "attn_q_norm.weight", {hd}));
  DS_ASSIGN_OR_RETURN(w->k_norm, sh.F(f, pre, "attn_k_norm.weight", {hd}));
  return absl::OkStatus();
}

absl::Status LoadGdn(const gguf::File& f, const ModelConfig& c, const std::string& pre,
                     const Sharder& sh, GdnLayerWeights* w) {
  const int64_t H = c.n_embd, C = c.gdn_conv_channels(), Vw = c.gdn_value_width(),
                Hv = c.gdn_v_heads;
  DS_ASSIGN_OR_RETURN(w->qkv, sh.M(f, pre, "attn_qkv.weight", H, C));
  DS_ASSIGN_OR_RETURN(w->gate, sh.M(f, pre, "attn_gate.weight", H, Vw));
  DS_ASSIGN_OR_RETURN(w->beta, sh.M(f, pre, "ssm_beta.weight", H, Hv));
  DS_ASSIGN_OR_RETURN(w->alpha, sh.M(f, pre, "ssm_alpha.weight", H, Hv));
  DS_ASSIGN_OR_RETURN(w->out, sh.M(f, pre, "ssm_out.weight", Vw, H));
  DS_ASSIGN_OR_RETURN(w->conv, sh.F(f, pre, "ssm_conv1d.weight", {c.conv_kernel, C}));
  DS_ASSIGN_OR_RETURN(w->ssm_a, sh.F(f, pre, "ssm_a", {Hv}));
  DS_ASSIGN_OR_RETURN(w->dt_bias, sh.F(f, pre, "ssm_dt.bias", {Hv}));
  DS_ASSIGN_OR_RETURN(w->norm, sh.F(f, pre, "ssm_norm.weight", {c.gdn_v_dim}));
  return absl::OkStatus();
}

absl::Status LoadLayer(const gguf::File& f, const ModelConfig& c, int i, bool recurrent,
                       const Sharder& sh, LayerWeights* w) {
  const std::string pre = absl::StrCat("blk.", i, ".");
  const int64_t H = c.n_embd;
  w->recurrent = recurrent;
  DS_ASSIGN_OR_RETURN(w->attn_norm, Floats(f, pre + "attn_norm.weight", {H}));
  DS_ASSIGN_OR_RETURN(w->post_norm, Floats(f, pre + "post_attention_norm.weight", {H}));
  if (recurrent) {
    DS_RETURN_IF_ERROR(LoadGdn(f, c, pre, sh, &w->gdn));
  } else {
    DS_RETURN_IF_ERROR(LoadAttention(f, c, pre, sh, &w->attn));
  }
  DS_ASSIGN_OR_RETURN(w->ffn_gate, sh.M(f, pre, "ffn_gate.weight", H, c.n_ff));
  DS_ASSIGN_OR_RETURN(w->ffn_up, sh.M(f, pre, "ffn_up.weight", H, c.n_ff));
  DS_ASSIGN_OR_RETURN(w->ffn_down, sh.M(f, pre, "ffn_down.weight", c.n_ff, H));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> ModelWeights::Load(const gguf::File& f, const ModelConfig& c,
                                                const tp::Plan* plan, int tp_rank) {
  ModelWeights w;
  if (plan && (tp_rank < 0 || tp_rank >= plan->world))
    return absl::InvalidArgumentError(
        absl::StrCat("TP rank ", tp_rank, " not in a world of ", plan->world));
  const Sharder sh{&c, plan, tp_rank, &w};
  const int64_t H = c.n_embd, V = c.n_vocab;
  DS_ASSIGN_OR_RETURN(w.token_embd, Matrix(f, "token_embd.weight", H, V));
  DS_ASSIGN_OR_RETURN(w.output_norm, Floats(f, "output_norm.weight", {H}));
  if (f.FindTensor("output.weight")) {
    DS_ASSIGN_OR_RETURN(w.output, Matrix(f, "output.weight", H, V));
  } else {
    w.output = w.token_embd;  // tied embeddings (small Qwen3.5 models)
    w.tied_output = true;
  }
  if (plan) {  // lm_head and embedding shards: the rank's vocabulary rows (docs/tp.md §3)
    DS_ASSIGN_OR_RETURN(w.output, tp::CutMatrix(w.output, tp::CutFor(c, *plan, tp_rank, "output.weight"),
                                                "output.weight", &w.shard_store));
    DS_ASSIGN_OR_RETURN(w.token_embd,
                        tp::CutMatrix(w.token_embd, tp::CutFor(c, *plan, tp_rank, "token_embd.weight"),
                                      "token_embd.weight", &w.shard_store));
  }
  w.layers.resize(c.n_layer);
  for (int i = 0; i < c.n_layer; ++i)
    DS_RETURN_IF_ERROR(LoadLayer(f, c, i, c.is_recurrent[i], sh, &w.layers[i]));
  if (c.n_nextn == 1) {
    // Under TP (docs/tp.md §10) the MTP block is placed like the trunk: its attention layer and
    // FFN cut exactly as a trunk attention layer's (the same CutFor suffixes), eh_proj and the
    // three norms whole on every rank, its embedding and head the rank's vocabulary rows.
    const int i = c.n_layer;
    const std::string pre = absl::StrCat("blk.", i, ".");
    DS_RETURN_IF_ERROR(LoadLayer(f, c, i, /*recurrent=*/false, sh, &w.mtp.layer));
    DS_ASSIGN_OR_RETURN(w.mtp.eh_proj, Matrix(f, pre + "nextn.eh_proj.weight", 2 * H, H));
    DS_ASSIGN_OR_RETURN(w.mtp.enorm, Floats(f, pre + "nextn.enorm.weight", {H}));
    DS_ASSIGN_OR_RETURN(w.mtp.hnorm, Floats(f, pre + "nextn.hnorm.weight", {H}));
    DS_ASSIGN_OR_RETURN(w.mtp.shared_head_norm, Floats(f, pre + "nextn.shared_head_norm.weight", {H}));
    w.mtp.embed = w.token_embd;  // already the rank's rows under TP
    if (f.FindTensor(pre + "nextn.embed_tokens.weight")) {
      DS_ASSIGN_OR_RETURN(w.mtp.embed, sh.M(f, pre, "nextn.embed_tokens.weight", H, V));
    }
    w.mtp.head = w.output;
    if (f.FindTensor(pre + "nextn.shared_head_head.weight")) {
      DS_ASSIGN_OR_RETURN(w.mtp.head, sh.M(f, pre, "nextn.shared_head_head.weight", H, V));
    }
    w.has_mtp = true;
  }
  return w;
}

int ExpectedTensorCount(const ModelConfig& c, bool tied_output) {
  int n = tied_output ? 2 : 3;
  for (int i = 0; i < c.n_layer; ++i) n += c.is_recurrent[i] ? 14 : 11;
  if (c.n_nextn == 1) n += 15;
  return n;
}

}  // namespace ds
