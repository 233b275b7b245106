// CpuBackend (see cpu_backend.h): stacked-batch forward pass of the qwen35 hybrid model.
#include "worker/model/cpu_backend.h"

#include <chrono>
#include <cstring>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/collective/collective.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/ops.h"
#include "worker/model/kv_type.h"

namespace ds {

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const std::string& model_path,
                                                          const BackendOptions& opts) {
  DS_ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> b, CpuBackend::Create(model_path, opts));
  return std::unique_ptr<Backend>(std::move(b));
}

absl::StatusOr<tp::Plan> MakeTpPlan(const gguf::File& f, const ModelConfig& c,
                                    const BackendOptions& opts) {
  std::vector<double> split = opts.tp_split;
  if (split.empty()) split.assign(opts.tp_world, 1.0);
  if (static_cast<int>(split.size()) != opts.tp_world)
    return absl::InvalidArgumentError(absl::StrCat("BackendOptions.tp_split has ", split.size(),
                                                   " weights for tp_world ", opts.tp_world));
  DS_ASSIGN_OR_RETURN(const int64_t granule, tp::FfnGranule(f, c));
  tp::HeadGranules hg;
  if (opts.tp_align_heads) {
    DS_ASSIGN_OR_RETURN(hg, tp::AlignedHeadGranules(f, c));
  }
  return tp::Plan::Make(c, split, granule,
                        opts.tp_lm_head_rank0 ? tp::LmHead::kRank0 : tp::LmHead::kVocabParallel,
                        hg.attn, hg.gdn);
}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const std::string& path,
                                                               const BackendOptions& opts) {
  DS_ASSIGN_OR_RETURN(std::unique_ptr<gguf::File> f, gguf::File::Open(path));
  return Create(std::move(f), opts);
}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(std::unique_ptr<gguf::File> file,
                                                               const BackendOptions& opts) {
  if (opts.n_slots < 1 || opts.n_slots > 4096)
    return absl::InvalidArgumentError(absl::StrCat("BackendOptions.n_slots = ", opts.n_slots,
                                                   " must be in [1, 4096]"));
  if (opts.slot_ctx < 1)
    return absl::InvalidArgumentError(absl::StrCat("BackendOptions.slot_ctx = ", opts.slot_ctx,
                                                   " must be >= 1"));
  if (opts.tp_world < 1 || opts.tp_rank < 0 || opts.tp_rank >= opts.tp_world)
    return absl::InvalidArgumentError(absl::StrCat("BackendOptions: tp_rank ", opts.tp_rank,
                                                   " not in a tp_world of ", opts.tp_world));
  if (opts.kv_type != GgmlType::F16)
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-type ", KvTypeName(opts.kv_type),
        ": the CPU backend keeps its KV cache in f32 and has no quantized KV; use --backend cuda "
        "for q8_0 / q4_0 KV, or the default f16"));
  std::unique_ptr<CpuBackend> b(new CpuBackend());
  b->file_ = std::move(file);
  DS_ASSIGN_OR_RETURN(b->cfg_, ModelConfig::FromGguf(*b->file_));
  const ModelConfig& c = b->cfg_;
  b->lc_ = {c.n_head, c.n_head_kv, c.gdn_k_heads, c.gdn_v_heads, c.n_ff, c.n_vocab};
  if (opts.tp_world > 1) {
    if (!opts.collective || opts.collective->world() != opts.tp_world ||
        opts.collective->rank() != opts.tp_rank)
      return absl::InvalidArgumentError(absl::StrCat(
          "BackendOptions: tp_world ", opts.tp_world, " needs a collective of that world with rank ",
          opts.tp_rank, opts.collective ? "" : " (collective is null)"));
    DS_ASSIGN_OR_RETURN(b->plan_, MakeTpPlan(*b->file_, c, opts));
    b->tp_rank_ = opts.tp_rank;
    b->tp_world_ = opts.tp_world;
    b->coll_ = opts.collective;
    b->lm_head_rank0_ = opts.tp_lm_head_rank0;
    const tp::Plan& p = b->plan_;
    const int r = opts.tp_rank;
    b->lc_ = {p.q_heads(r), p.kv_heads(r), p.gdn_k(r), p.gdn_v(r), p.ranks[r].ffn.size(),
              p.ranks[r].vocab.size()};
    DS_ASSIGN_OR_RETURN(b->w_, ModelWeights::Load(*b->file_, c, &b->plan_, r));
  } else {
    DS_ASSIGN_OR_RETURN(b->w_, ModelWeights::Load(*b->file_, c));
  }
  b->slot_ctx_ = opts.slot_ctx;
  b->gdn_index_.assign(c.n_layer, -1);
  b->attn_index_.assign(c.n_layer, -1);
  for (int i = 0; i < c.n_layer; ++i) {
    if (c.is_recurrent[i])
      b->gdn_index_[i] = b->n_gdn_++;
    else
      b->attn_index_[i] = b->n_attn_++;
  }
  // State and KV of this rank's heads only (all heads without TP).
  const Local& lc = b->lc_;
  b->conv_elems_ = static_cast<int64_t>(c.conv_kernel - 1) *
                   (2LL * lc.gdn_k_heads * c.gdn_k_dim + static_cast<int64_t>(lc.gdn_v_heads) * c.gdn_v_dim);
  b->ssm_elems_ = static_cast<int64_t>(lc.gdn_v_heads) * c.gdn_k_dim * c.gdn_v_dim;
  b->kv_width_ = static_cast<int64_t>(lc.n_head_kv) * c.head_dim;
  b->slots_.resize(opts.n_slots);
  for (Slot& s : b->slots_) {
    s.conv.assign(b->n_gdn_ * b->conv_elems_, 0.f);
    s.ssm.assign(b->n_gdn_ * b->ssm_elems_, 0.f);
    s.k.assign(static_cast<size_t>(b->n_attn_) * b->slot_ctx_ * b->kv_width_, 0.f);
    s.v.assign(s.k.size(), 0.f);
    if (b->w_.has_mtp) {
      s.mtp_k.assign(static_cast<size_t>(b->slot_ctx_) * b->kv_width_, 0.f);
      s.mtp_v.assign(s.mtp_k.size(), 0.f);
      s.mtp_valid.assign(b->slot_ctx_, 0);
    }
  }
  if (opts.n_threads > 0) {
    b->own_pool_ = std::make_unique<ThreadPool>(opts.n_threads);
    b->pool_ = b->own_pool_.get();
  } else {
    b->pool_ = &ThreadPool::Global();
  }
  return b;
}

void CpuBackend::ResetSlot(int slot) {
  if (slot < 0 || slot >= n_slots()) return;
  Slot& s = slots_[slot];
  s.n_past = 0;
  std::fill(s.conv.begin(), s.conv.end(), 0.f);  // new sequences start from zero state (§5.5)
  std::fill(s.ssm.begin(), s.ssm.end(), 0.f);
  s.mtp_len = 0;
  std::fill(s.mtp_valid.begin(), s.mtp_valid.end(), 0);
}

int32_t CpuBackend::SlotLength(int slot) const {
  if (slot < 0 || slot >= n_slots()) return 0;
  return slots_[slot].n_past;
}

void CpuBackend::AttnMixer(const AttnLayerWeights& w, const float* a, int64_t N,
                           const std::vector<SeqRun>& seqs, float* y) {
  const ModelConfig& c = cfg_;
  if (lc_.n_head_kv == 0) {  // TP rank without attention heads: contributes zeros
    std::fill(y, y + N * c.n_embd, 0.f);
    return;
  }
  const int64_t qgw = 2LL * lc_.n_head * c.head_dim, ow = static_cast<int64_t>(lc_.n_head) * c.head_dim;
  std::vector<float> qg(N * qgw), k(N * kv_width_), v(N * kv_width_), o(N * ow);  // [N, ·]
  cpu::MatMul(w.q, a, N, qg.data(), pool_);
  cpu::MatMul(w.k, a, N, k.data(), pool_);
  cpu::MatMul(w.v, a, N, v.data(), pool_);
  for (const SeqRun& s : seqs) {
    cpu::AttnArgs aa;
    aa.n_head = lc_.n_head;
    aa.n_head_kv = lc_.n_head_kv;
    aa.head_dim = c.head_dim;
    aa.n_rot = c.n_rot;
    aa.rope_base = c.rope_base;
    aa.eps = c.rms_eps;
    aa.T = s.n;
    aa.pos0 = s.pos0;
    aa.qg = qg.data() + s.row0 * qgw;
    aa.k = k.data() + s.row0 * kv_width_;
    aa.v = v.data() + s.row0 * kv_width_;
    aa.q_norm = w.q_norm.data();
    aa.k_norm = w.k_norm.data();
    aa.k_cache = s.k_cache;
    aa.v_cache = s.v_cache;
    aa.valid = s.valid;
    aa.out = o.data() + s.row0 * ow;
    aa.pool = pool_;
    cpu::GatedAttention(aa);
  }
  cpu::MatMul(w.out, o.data(), N, y, pool_);
}

void CpuBackend::Mlp(const LayerWeights& w, const float* f, int64_t N, float* y) {
  const int64_t ff = lc_.n_ff;
  if (ff == 0) {  // TP rank without FFN columns
    std::fill(y, y + N * cfg_.n_embd, 0.f);
    return;
  }
  std::vector<float> g(N * ff), u(N * ff);  // [N, n_ff]
  cpu::MatMul(w.ffn_gate, f, N, g.data(), pool_);
  cpu::MatMul(w.ffn_up, f, N, u.data(), pool_);
  for (int64_t i = 0; i < N * ff; ++i) g[i] = cpu::Silu(g[i]) * u[i];
  cpu::MatMul(w.ffn_down, g.data(), N, y, pool_);
}

absl::Status CpuBackend::AllReduce(float* y, int64_t n) {
  if (tp_world_ == 1) return absl::OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = coll_->AllReduceSum(y, static_cast<size_t>(n));
  step_comm_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

absl::Status CpuBackend::Forward(std::span<const SeqStep> batch, const StepOptions& opts,
                                 StepOutput* out) {
  const auto t_start = std::chrono::steady_clock::now();
  const ModelConfig& c = cfg_;
  // ---- Validate everything before touching any state.
  if (!out) return absl::InvalidArgumentError("Forward: out is null");
  if (batch.empty()) return absl::InvalidArgumentError("Forward: empty batch");
  std::unordered_set<int> seen;
  int64_t N = 0, n_rows = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqStep& s = batch[i];
    if (s.slot < 0 || s.slot >= n_slots())
      return absl::InvalidArgumentError(
          absl::StrCat("batch[", i, "]: slot ", s.slot, " out of range [0, ", n_slots(), ")"));
    if (!seen.insert(s.slot).second)
      return absl::InvalidArgumentError(
          absl::StrCat("batch[", i, "]: slot ", s.slot, " appears more than once in the step"));
    if (s.tokens.empty())
      return absl::InvalidArgumentError(absl::StrCat("batch[", i, "]: slot ", s.slot, " has no tokens"));
    if (s.pos0 != slots_[s.slot].n_past)
      return absl::InvalidArgumentError(absl::StrCat("batch[", i, "]: pos0 ", s.pos0,
                                                     " != current length ", slots_[s.slot].n_past,
                                                     " of slot ", s.slot));
    for (size_t j = 0; j < s.tokens.size(); ++j)
      if (s.tokens[j] < 0 || s.tokens[j] >= c.n_vocab)
        return absl::InvalidArgumentError(absl::StrCat("batch[", i, "]: token id ", s.tokens[j],
                                                       " at index ", j, " out of range [0, ",
                                                       c.n_vocab, ")"));
    if (static_cast<int64_t>(s.pos0) + static_cast<int64_t>(s.tokens.size()) > slot_ctx_)
      return absl::OutOfRangeError(absl::StrCat("batch[", i, "]: slot ", s.slot, " would hold ",
                                                static_cast<int64_t>(s.pos0) + s.tokens.size(),
                                                " tokens > slot_ctx ", slot_ctx_));
    N += static_cast<int64_t>(s.tokens.size());
    n_rows += s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
  }

  // ---- Stack all tokens of the step: one matmul per weight for the whole batch.
  const int64_t H = c.n_embd;
  std::vector<SeqRun> runs(batch.size());
  {
    int64_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      runs[i].row0 = row;
      runs[i].n = static_cast<int64_t>(batch[i].tokens.size());
      runs[i].pos0 = batch[i].pos0;
      row += runs[i].n;
    }
  }
  std::vector<float> h(N * H), a(N * H), y(N * H);  // [N, H]
  for (size_t i = 0; i < batch.size(); ++i)
    for (int64_t t = 0; t < runs[i].n; ++t)
      cpu::GetRow(w_.token_embd, batch[i].tokens[t], h.data() + (runs[i].row0 + t) * H);

  // This rank's GDN heads (all of them without TP): local value head j reads local key head
  // j mod Hk' — the tiled rule survives the sharding (worker/tp/plan.h).
  const int Hv = lc_.gdn_v_heads, Vw = Hv * c.gdn_v_dim,
            C = 2 * lc_.gdn_k_heads * c.gdn_k_dim + Vw;
  const cpu::GdnDims dims{lc_.gdn_k_heads, lc_.gdn_v_heads, c.gdn_k_dim, c.gdn_v_dim, c.conv_kernel};
  step_comm_ = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = w_.layers[l];
    cpu::RmsNormRows(h.data(), L.attn_norm.data(), N, H, c.rms_eps, a.data());
    if (L.recurrent && Hv == 0) {
      std::fill(y.begin(), y.end(), 0.f);  // TP rank without GDN heads
    } else if (L.recurrent) {
      const int gi = gdn_index_[l];
      std::vector<float> mixed(N * C), z(N * Vw), b(N * Hv), al(N * Hv), o(N * Vw);
      cpu::MatMul(L.gdn.qkv, a.data(), N, mixed.data(), pool_);   // [N, C]
      cpu::MatMul(L.gdn.gate, a.data(), N, z.data(), pool_);      // [N, Vw]
      cpu::MatMul(L.gdn.beta, a.data(), N, b.data(), pool_);      // [N, Hv]
      cpu::MatMul(L.gdn.alpha, a.data(), N, al.data(), pool_);    // [N, Hv]
      for (size_t i = 0; i < batch.size(); ++i) {
        Slot& s = slots_[batch[i].slot];
        const SeqRun& r = runs[i];
        cpu::GdnSeqArgs g;
        g.dims = dims;
        g.T = r.n;
        g.eps = c.rms_eps;
        g.mixed = mixed.data() + r.row0 * C;
        g.z = z.data() + r.row0 * Vw;
        g.b = b.data() + r.row0 * Hv;
        g.alpha = al.data() + r.row0 * Hv;
        g.conv_w = L.gdn.conv.data();
        g.ssm_a = L.gdn.ssm_a.data();
        g.dt_bias = L.gdn.dt_bias.data();
        g.norm_w = L.gdn.norm.data();
        g.conv_state = s.conv.data() + gi * conv_elems_;
        g.state = s.ssm.data() + gi * ssm_elems_;
        g.out = o.data() + r.row0 * Vw;
        g.chunk = r.n > 1 ? gdn_chunk_ : 0;  // prefill chunks: WY form; decode: recurrence
        g.pool = pool_;
        cpu::GdnSequence(g);
      }
      cpu::MatMul(L.gdn.out, o.data(), N, y.data(), pool_);
    } else {
      const int ai = attn_index_[l];
      for (size_t i = 0; i < batch.size(); ++i) {
        Slot& s = slots_[batch[i].slot];
        runs[i].k_cache = s.k.data() + static_cast<size_t>(ai) * slot_ctx_ * kv_width_;
        runs[i].v_cache = s.v.data() + static_cast<size_t>(ai) * slot_ctx_ * kv_width_;
        runs[i].valid = nullptr;
      }
      AttnMixer(L.attn, a.data(), N, runs, y.data());
    }
    DS_RETURN_IF_ERROR(AllReduce(y.data(), N * H));  // row-parallel mixer output: Σ over ranks
    for (int64_t i = 0; i < N * H; ++i) h[i] += y[i];
    cpu::RmsNormRows(h.data(), L.post_norm.data(), N, H, c.rms_eps, a.data());
    Mlp(L, a.data(), N, y.data());
    DS_RETURN_IF_ERROR(AllReduce(y.data(), N * H));  // row-parallel ffn_down: Σ over ranks
    for (int64_t i = 0; i < N * H; ++i) h[i] += y[i];
  }

  // ---- Output rows: every token of all_logits sequences, else the last one; final norm + head.
  std::vector<float> hn(n_rows * H);  // [n_rows, H]
  {
    int64_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t first = batch[i].all_logits ? 0 : runs[i].n - 1;
      for (int64_t t = first; t < runs[i].n; ++t, ++row)
        cpu::RmsNorm(h.data() + (runs[i].row0 + t) * H, w_.output_norm.data(), H, c.rms_eps,
                     hn.data() + row * H);
    }
  }
  out->n_rows = static_cast<int>(n_rows);
  if (tp_world_ == 1) {
    out->logits.assign(n_rows * static_cast<int64_t>(c.n_vocab), 0.f);
    cpu::MatMul(w_.output, hn.data(), n_rows, out->logits.data(), pool_);
  } else if (lm_head_rank0_) {
    // Whole lm_head on rank 0; the others produce no logits (sampling happens on rank 0).
    out->logits.clear();
    if (tp_rank_ == 0) {
      out->logits.assign(n_rows * static_cast<int64_t>(c.n_vocab), 0.f);
      cpu::MatMul(w_.output, hn.data(), n_rows, out->logits.data(), pool_);
    }
  } else {
    // Vocab-parallel lm_head: local logits [n_rows, V_r] of rows [v0_r, v1_r), all-gathered
    // rank-major ([r][n_rows][V_r]) and interleaved back into [n_rows, V].
    std::vector<float> part(n_rows * lc_.n_vocab);  // [n_rows, V_r]
    cpu::MatMul(w_.output, hn.data(), n_rows, part.data(), pool_);
    std::vector<size_t> counts(tp_world_);
    for (int r = 0; r < tp_world_; ++r) counts[r] = n_rows * plan_.ranks[r].vocab.size();
    std::vector<float> all(n_rows * static_cast<int64_t>(c.n_vocab));  // [world][n_rows][V_r]
    const auto t0 = std::chrono::steady_clock::now();
    DS_RETURN_IF_ERROR(coll_->AllGatherV(part.data(), counts, all.data()));
    step_comm_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out->logits.assign(n_rows * static_cast<int64_t>(c.n_vocab), 0.f);
    const float* src = all.data();
    for (int r = 0; r < tp_world_; ++r) {
      const tp::Range v = plan_.ranks[r].vocab;
      for (int64_t row = 0; row < n_rows; ++row, src += v.size())
        std::copy(src, src + v.size(), out->logits.data() + row * c.n_vocab + v.begin);
    }
  }
  if (opts.want_hidden)
    out->hidden = std::move(hn);
  else
    out->hidden.clear();
  for (const SeqStep& s : batch) slots_[s.slot].n_past += static_cast<int32_t>(s.tokens.size());
  out->forward_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  out->comm_seconds = step_comm_;
  return absl::OkStatus();
}

absl::Status CpuBackend::MtpStep(int slot, int32_t token, int32_t pos, std::span<const float> hidden,
                                 std::vector<float>* logits, std::vector<float>* hidden_out) {
  const ModelConfig& c = cfg_;
  if (tp_world_ > 1)
    return absl::UnimplementedError("MtpStep: the MTP block is not sharded under tensor parallelism");
  if (!w_.has_mtp)
    return absl::UnimplementedError("MtpStep: the model file has no MTP block (nextn_predict_layers = 0)");
  if (slot < 0 || slot >= n_slots())
    return absl::InvalidArgumentError(absl::StrCat("MtpStep: slot ", slot, " out of range [0, ", n_slots(), ")"));
  if (token < 0 || token >= c.n_vocab)
    return absl::InvalidArgumentError(absl::StrCat("MtpStep: token id ", token, " out of range [0, ", c.n_vocab, ")"));
  if (pos < 0 || pos >= slot_ctx_)
    return absl::OutOfRangeError(absl::StrCat("MtpStep: pos ", pos, " out of range [0, ", slot_ctx_, ")"));
  if (static_cast<int64_t>(hidden.size()) != c.n_embd)
    return absl::InvalidArgumentError(absl::StrCat("MtpStep: hidden has ", hidden.size(),
                                                   " elements, expected n_embd = ", c.n_embd));
  if (!logits || !hidden_out) return absl::InvalidArgumentError("MtpStep: null output");
  const int64_t H = c.n_embd;
  const MtpWeights& m = w_.mtp;
  std::vector<float> cat(2 * H), u(H), a(H), y(H);
  cpu::GetRow(m.embed, token, cat.data());
  cpu::RmsNorm(cat.data(), m.enorm.data(), H, c.rms_eps, cat.data());            // e (first half)
  cpu::RmsNorm(hidden.data(), m.hnorm.data(), H, c.rms_eps, cat.data() + H);     // hh
  cpu::MatMul(m.eh_proj, cat.data(), 1, u.data(), pool_);

  Slot& s = slots_[slot];
  // Row pos replaces whatever was there and drops every later row (rejected drafts).
  for (int32_t j = pos; j < s.mtp_len; ++j) s.mtp_valid[j] = 0;
  s.mtp_valid[pos] = 1;
  s.mtp_len = pos + 1;
  cpu::RmsNorm(u.data(), m.layer.attn_norm.data(), H, c.rms_eps, a.data());
  std::vector<SeqRun> run(1);
  run[0].row0 = 0;
  run[0].n = 1;
  run[0].pos0 = pos;
  run[0].k_cache = s.mtp_k.data();
  run[0].v_cache = s.mtp_v.data();
  run[0].valid = s.mtp_valid.data();
  AttnMixer(m.layer.attn, a.data(), 1, run, y.data());
  for (int64_t i = 0; i < H; ++i) u[i] += y[i];
  cpu::RmsNorm(u.data(), m.layer.post_norm.data(), H, c.rms_eps, a.data());
  Mlp(m.layer, a.data(), 1, y.data());
  for (int64_t i = 0; i < H; ++i) u[i] += y[i];
  hidden_out->assign(H, 0.f);
  cpu::RmsNorm(u.data(), m.shared_head_norm.data(), H, c.rms_eps, hidden_out->data());
  logits->assign(c.n_vocab, 0.f);
  cpu::MatMul(m.head, hidden_out->data(), 1, logits->data(), pool_);
  return absl::OkStatus();
}

// Snapshot layout: [n_past i32][mtp_len i32][conv f32...][ssm f32...]
//   [per attention layer: K rows [0,n_past), V rows [0,n_past)][MTP K, V rows [0,mtp_len)]
//   [MTP valid bytes [0,mtp_len)]
size_t CpuBackend::SnapshotBytes(int32_t n_past, int32_t mtp_len) const {
  size_t n = 8;
  n += sizeof(float) * static_cast<size_t>(n_gdn_) * (conv_elems_ + ssm_elems_);
  n += sizeof(float) * 2 * static_cast<size_t>(n_attn_) * n_past * kv_width_;
  if (w_.has_mtp) n += sizeof(float) * 2 * static_cast<size_t>(mtp_len) * kv_width_ + mtp_len;
  return n;
}

absl::StatusOr<SlotSnapshot> CpuBackend::Snapshot(int slot) const {
  if (slot < 0 || slot >= n_slots())
    return absl::InvalidArgumentError(absl::StrCat("Snapshot: slot ", slot, " out of range [0, ", n_slots(), ")"));
  const Slot& s = slots_[slot];
  SlotSnapshot snap;
  snap.n_past = s.n_past;
  snap.bytes.resize(SnapshotBytes(s.n_past, s.mtp_len));
  uint8_t* p = snap.bytes.data();
  auto put = [&p](const void* src, size_t n) {
    if (n) std::memcpy(p, src, n);
    p += n;
  };
  put(&s.n_past, 4);
  put(&s.mtp_len, 4);
  put(s.conv.data(), s.conv.size() * 4);
  put(s.ssm.data(), s.ssm.size() * 4);
  const size_t rows = static_cast<size_t>(s.n_past) * kv_width_;
  for (int l = 0; l < n_attn_; ++l) {
    const size_t base = static_cast<size_t>(l) * slot_ctx_ * kv_width_;
    put(s.k.data() + base, rows * 4);
    put(s.v.data() + base, rows * 4);
  }
  if (w_.has_mtp) {
    const size_t mrows = static_cast<size_t>(s.mtp_len) * kv_width_;
    put(s.mtp_k.data(), mrows * 4);
    put(s.mtp_v.data(), mrows * 4);
    put(s.mtp_valid.data(), s.mtp_len);
  }
  return snap;
}

absl::Status CpuBackend::Restore(int slot, const SlotSnapshot& snap) {
  if (slot < 0 || slot >= n_slots())
    return absl::InvalidArgumentError(absl::StrCat("Restore: slot ", slot, " out of range [0, ", n_slots(), ")"));
  if (snap.bytes.size() < 8) return absl::InvalidArgumentError("Restore: snapshot too short");
  int32_t n_past, mtp_len;
  std::memcpy(&n_past, snap.bytes.data(), 4);
  std::memcpy(&mtp_len, snap.bytes.data() + 4, 4);
  if (n_past != snap.n_past || n_past < 0 || n_past > slot_ctx_ || mtp_len < 0 ||
      mtp_len > slot_ctx_ || (!w_.has_mtp && mtp_len != 0))
    return absl::InvalidArgumentError(absl::StrCat("Restore: snapshot header (n_past ", n_past,
                                                   ", mtp_len ", mtp_len,
                                                   ") does not fit this backend (slot_ctx ",
                                                   slot_ctx_, ")"));
  if (snap.bytes.size() != SnapshotBytes(n_past, mtp_len))
    return absl::InvalidArgumentError(absl::StrCat("Restore: snapshot has ", snap.bytes.size(),
                                                   " bytes, expected ", SnapshotBytes(n_past, mtp_len),
                                                   " (taken from a different model?)"));
  Slot& s = slots_[slot];
  const uint8_t* p = snap.bytes.data() + 8;
  auto get = [&p](void* dst, size_t n) {
    if (n) std::memcpy(dst, p, n);
    p += n;
  };
  get(s.conv.data(), s.conv.size() * 4);
  get(s.ssm.data(), s.ssm.size() * 4);
  const size_t rows = static_cast<size_t>(n_past) * kv_width_;
  for (int l = 0; l < n_attn_; ++l) {
    const size_t base = static_cast<size_t>(l) * slot_ctx_ * kv_width_;
    get(s.k.data() + base, rows * 4);
    get(s.v.data() + base, rows * 4);
  }
  if (w_.has_mtp) {
    const size_t mrows = static_cast<size_t>(mtp_len) * kv_width_;
    get(s.mtp_k.data(), mrows * 4);
    get(s.mtp_v.data(), mrows * 4);
    std::fill(s.mtp_valid.begin(), s.mtp_valid.end(), 0);
    get(s.mtp_valid.data(), mtp_len);
  }
  s.n_past = n_past;
  s.mtp_len = mtp_len;
  return absl::OkStatus();
}

}  // namespace ds
