// CpuDevice (see cpu_device.h): the layers of the qwen35 hybrid model over a stacked micro-step.
#include "worker/model/cpu_device.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/sampling/sampler.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/ops.h"
#include "worker/tp/vocab_gather.h"

namespace ds {

absl::StatusOr<std::unique_ptr<CpuDevice>> CpuDevice::Create(const gguf::File& file,
                                                             const ModelConfig& cfg,
                                                             const TpPlacement& tp, int n_slots,
                                                             int slot_ctx, int n_threads,
                                                             int page_size, int64_t pool_tokens) {
  if (page_size < 0 || pool_tokens < 0)
    return absl::InvalidArgumentError(absl::StrCat("CPU backend: KV page size ", page_size,
                                                   " / pool tokens ", pool_tokens, " < 0"));
  std::unique_ptr<CpuDevice> d(new CpuDevice());
  d->cfg_ = cfg;
  d->tp_ = tp;
  d->lc_ = tp.Local(cfg);
  if (tp.world > 1) {
    DS_ASSIGN_OR_RETURN(d->w_, ModelWeights::Load(file, cfg, &d->tp_.plan, tp.rank));
  } else {
    DS_ASSIGN_OR_RETURN(d->w_, ModelWeights::Load(file, cfg));
  }
  const ModelConfig& c = d->cfg_;
  d->slot_ctx_ = slot_ctx;
  d->gdn_index_.assign(c.n_layer, -1);
  d->attn_index_.assign(c.n_layer, -1);
  for (int i = 0; i < c.n_layer; ++i) {
    if (c.is_recurrent[i])
      d->gdn_index_[i] = d->n_gdn_++;
    else
      d->attn_index_[i] = d->n_attn_++;
  }
  // State and KV of this rank's heads only (all heads without TP).
  const LocalShape& lc = d->lc_;
  d->conv_elems_ = static_cast<int64_t>(c.conv_kernel - 1) *
                   (2LL * lc.gdn_k_heads * c.gdn_k_dim +
                    static_cast<int64_t>(lc.gdn_v_heads) * c.gdn_v_dim);
  d->ssm_elems_ = static_cast<int64_t>(lc.gdn_v_heads) * c.gdn_k_dim * c.gdn_v_dim;
  d->kv_width_ = static_cast<int64_t>(lc.n_head_kv) * c.head_dim;
  // The paged KV pool shared by the slots (default: room for every slot's full context).
  KvPaging& kp = d->paging_;
  kp.page_size = page_size > 0 ? page_size : 16;
  kp.max_pages_per_slot = (slot_ctx + kp.page_size - 1) / kp.page_size;
  kp.n_pages = pool_tokens > 0 ? (pool_tokens + kp.page_size - 1) / kp.page_size
                               : static_cast<int64_t>(n_slots) * kp.max_pages_per_slot;
  d->k_pool_.assign(static_cast<size_t>(d->n_attn_) * d->PoolRows() * d->kv_width_, 0.f);
  d->v_pool_.assign(d->k_pool_.size(), 0.f);
  d->limits_.max_spec_tokens = kMaxSpecTokens;
  d->limits_.spec_entries = kMaxSpecTokens * n_slots;
  d->spec_.resize(d->limits_.spec_entries);
  d->slots_.resize(n_slots);
  for (Slot& s : d->slots_) {
    s.conv.assign(d->n_gdn_ * d->conv_elems_, 0.f);
    s.ssm.assign(d->n_gdn_ * d->ssm_elems_, 0.f);
    s.pages.assign(kp.max_pages_per_slot, 0);
    if (d->w_.has_mtp) {
      s.mtp_k.assign(static_cast<size_t>(slot_ctx) * d->kv_width_, 0.f);
      s.mtp_v.assign(s.mtp_k.size(), 0.f);
      s.mtp_valid.assign(slot_ctx, 0);
    }
  }
  if (n_threads > 0) {
    d->own_pool_ = std::make_unique<ThreadPool>(n_threads);
    d->pool_ = d->own_pool_.get();
  } else {
    d->pool_ = &ThreadPool::Global();
  }
  return d;
}

MemoryFootprint CpuDevice::memory() const {
  MemoryFootprint m;
  // Matrices stay in the mapping (page cache); what this process holds of its own is the f32
  // copies of the small tensors and of unaligned TP column slices.
  m.weights = w_.dequantized_bytes;
  for (const Slot& s : slots_) {
    m.recurrent += (s.conv.size() + s.ssm.size()) * sizeof(float);
    m.kv_cache += (s.mtp_k.size() + s.mtp_v.size()) * sizeof(float) + s.mtp_valid.size() +
                  s.pages.size() * sizeof(int32_t);
  }
  m.kv_cache += (k_pool_.size() + v_pool_.size()) * sizeof(float);
  m.workspace = (h_.capacity() + a_.capacity() + y_.capacity() + hn_.capacity() +
                 logits_.capacity() + local_logits_.capacity() + gathered_.capacity()) *
                sizeof(float);
  return m;
}

absl::Status CpuDevice::MapPages(int slot, int first, std::span<const int32_t> pages) {
  Slot& s = slots_[slot];
  if (first < 0 || first + pages.size() > s.pages.size())
    return absl::OutOfRangeError(absl::StrCat("MapPages: entries [", first, ", ",
                                              first + pages.size(), ") of a ", s.pages.size(),
                                              "-page table"));
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0 || pages[i] >= paging_.n_pages)
      return absl::OutOfRangeError(absl::StrCat("MapPages: page ", pages[i], " not in [0, ",
                                                paging_.n_pages, ")"));
    s.pages[first + i] = pages[i];
  }
  return absl::OkStatus();
}

absl::Status CpuDevice::CommitSpeculative(int slot, int entry) {
  Slot& s = slots_[slot];
  // (A TP rank without GDN heads keeps no recurrent state: its entries stay empty like its slots.)
  if (entry < 0 || entry >= static_cast<int>(spec_.size()) ||
      spec_[entry].conv.size() != s.conv.size() || spec_[entry].ssm.size() != s.ssm.size())
    return absl::InternalError(absl::StrCat("CommitSpeculative: speculative entry ", entry,
                                            " holds no state"));
  s.conv = spec_[entry].conv;
  s.ssm = spec_[entry].ssm;
  return absl::OkStatus();
}

void CpuDevice::ResetSlot(int slot) {
  Slot& s = slots_[slot];
  std::fill(s.conv.begin(), s.conv.end(), 0.f);  // new sequences start from zero state (§5.5)
  std::fill(s.ssm.begin(), s.ssm.end(), 0.f);
  s.mtp_len = 0;
  std::fill(s.mtp_valid.begin(), s.mtp_valid.end(), 0);
}

absl::Status CpuDevice::Prepare(const MicroStep& step) {
  step_ = &step;
  const int64_t N = step.rows(), H = cfg_.n_embd, nl = step.n_logit_rows();
  runs_.assign(step.runs.size(), SeqRun{});
  for (size_t i = 0; i < step.runs.size(); ++i) {
    runs_[i].row0 = step.runs[i].row0;
    runs_[i].n = step.runs[i].n;
    runs_[i].pos0 = step.runs[i].pos0;
  }
  h_.assign(N * H, 0.f);
  a_.assign(N * H, 0.f);
  y_.assign(N * H, 0.f);
  hn_.assign(nl * H, 0.f);
  return absl::OkStatus();
}

absl::Status CpuDevice::Embed() { return EmbedRows(w_.token_embd, step_->ids, h_.data()); }

absl::Status CpuDevice::EmbedRows(const cpu::WeightView& table, std::span<const int32_t> ids,
                                  float* out) {
  const int64_t H = cfg_.n_embd, n = static_cast<int64_t>(ids.size());
  if (tp_.world == 1) {
    for (int64_t r = 0; r < n; ++r) cpu::GetRow(table, ids[r], out + r * H);
    return absl::OkStatus();
  }
  // Vocab-parallel: this rank holds vocabulary rows [v0, v1) of the table; other tokens get zero
  // rows and the all-reduce adds the owner's row (x + 0 is exact, so every rank ends with the
  // same embedding as TP = 1).
  const tp::Range v = tp_.plan.ranks[tp_.rank].vocab;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t id = ids[r];
    float* row = out + r * H;
    if (id >= v.begin && id < v.end)
      cpu::GetRow(table, id - v.begin, row);
    else
      std::fill(row, row + H, 0.f);
  }
  return AllReduce(out, n * H);
}

absl::Status CpuDevice::AllReduce(float* y, int64_t n) {
  if (tp_.world == 1) return absl::OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = tp_.collective->AllReduceSum(y, static_cast<size_t>(n));
  comm_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

double CpuDevice::TakeCommSeconds() {
  const double s = comm_;
  comm_ = 0;
  return s;
}

void CpuDevice::LayerMatMul(const cpu::WeightView& w, const float* x, int64_t N, float* y) {
  if (fp8_ && fp8_->Applies(w, N))
    fp8_->MatMul(w, x, N, y, pool_);
  else
    cpu::MatMul(w, x, N, y, pool_);
}

void CpuDevice::AttnMixer(const AttnLayerWeights& w, const float* a, int64_t N,
                          const std::vector<SeqRun>& seqs, float* y) {
  const ModelConfig& c = cfg_;
  if (lc_.n_head_kv == 0) {  // TP rank without attention heads: contributes zeros
    std::fill(y, y + N * c.n_embd, 0.f);
    return;
  }
  const int64_t qgw = 2LL * lc_.n_head * c.head_dim,
                ow = static_cast<int64_t>(lc_.n_head) * c.head_dim;
  std::vector<float> qg(N * qgw), k(N * kv_width_), v(N * kv_width_), o(N * ow);  // [N, ·]
  LayerMatMul(w.q, a, N, qg.data());
  LayerMatMul(w.k, a, N, k.data());
  LayerMatMul(w.v, a, N, v.data());
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
    aa.page_table = s.page_table;
    aa.page_size = paging_.page_size;
    aa.valid = s.valid;
    aa.out = o.data() + s.row0 * ow;
    aa.pool = pool_;
    cpu::GatedAttention(aa);
  }
  LayerMatMul(w.out, o.data(), N, y);
}

void CpuDevice::Mlp(const LayerWeights& w, const float* f, int64_t N, float* y) {
  const int64_t ff = lc_.n_ff;
  if (ff == 0) {  // TP rank without FFN columns
    std::fill(y, y + N * cfg_.n_embd, 0.f);
    return;
  }
  std::vector<float> g(N * ff), u(N * ff);  // [N, n_ff]
  LayerMatMul(w.ffn_gate, f, N, g.data());
  LayerMatMul(w.ffn_up, f, N, u.data());
  for (int64_t i = 0; i < N * ff; ++i) g[i] = cpu::Silu(g[i]) * u[i];
  LayerMatMul(w.ffn_down, g.data(), N, y);
}

void CpuDevice::GdnMixer(const LayerWeights& L, int gi, float* y) {
  const ModelConfig& c = cfg_;
  const int64_t N = step_->rows();
  // This rank's GDN heads (all of them without TP): local value head j reads local key head
  // j mod Hk' — the tiled rule survives the sharding (worker/tp/plan.h).
  const int Hv = lc_.gdn_v_heads, Vw = Hv * c.gdn_v_dim, C = 2 * lc_.gdn_k_heads * c.gdn_k_dim + Vw;
  if (Hv == 0) {  // TP rank without GDN heads
    std::fill(y, y + N * c.n_embd, 0.f);
    return;
  }
  const cpu::GdnDims dims{lc_.gdn_k_heads, lc_.gdn_v_heads, c.gdn_k_dim, c.gdn_v_dim,
                          c.conv_kernel};
  std::vector<float> mixed(N * C), z(N * Vw), b(N * Hv), al(N * Hv), o(N * Vw);
  LayerMatMul(L.gdn.qkv, a_.data(), N, mixed.data());   // [N, C]
  LayerMatMul(L.gdn.gate, a_.data(), N, z.data());      // [N, Vw]
  LayerMatMul(L.gdn.beta, a_.data(), N, b.data());      // [N, Hv]
  LayerMatMul(L.gdn.alpha, a_.data(), N, al.data());    // [N, Hv]
  for (size_t i = 0; i < runs_.size(); ++i) {
    Slot& s = slots_[step_->runs[i].slot];
    const SeqRun& r = runs_[i];
    const int32_t spec_entry = step_->runs[i].spec_entry;
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
    g.chunk = r.n > 1 ? gdn_chunk_ : 0;  // prefill pieces: WY form; decode: recurrence
    g.pool = pool_;
    g.state_bf16 = gdn_state_bf16_;
    if (spec_entry < 0) {
      cpu::GdnSequence(g);
      continue;
    }
    // Speculative verify: one token at a time as decode steps run them, keeping the state after
    // each in its entry (CommitSpeculative returns to any of them).
    g.T = 1;
    g.chunk = 0;
    for (int64_t t = 0; t < r.n; ++t) {
      cpu::GdnSequence(g);
      SpecEntry& e = spec_[spec_entry + t];
      if (e.conv.empty()) {
        e.conv.assign(s.conv.size(), 0.f);
        e.ssm.assign(s.ssm.size(), 0.f);
      }
      std::copy_n(g.conv_state, conv_elems_, e.conv.data() + gi * conv_elems_);
      std::copy_n(g.state, ssm_elems_, e.ssm.data() + gi * ssm_elems_);
      g.mixed += C;
      g.z += Vw;
      g.b += Hv;
      g.alpha += Hv;
      g.out += Vw;
    }
  }
  LayerMatMul(L.gdn.out, o.data(), N, y);
}

absl::Status CpuDevice::Layer(int l) {
  const ModelConfig& c = cfg_;
  const LayerWeights& L = w_.layers[l];
  const int64_t N = step_->rows(), H = c.n_embd;
  cpu::RmsNormRows(h_.data(), L.attn_norm.data(), N, H, c.rms_eps, a_.data());
  if (L.recurrent) {
    GdnMixer(L, gdn_index_[l], y_.data());
  } else {
    const size_t base = static_cast<size_t>(attn_index_[l]) * PoolRows() * kv_width_;
    for (size_t i = 0; i < runs_.size(); ++i) {
      Slot& s = slots_[step_->runs[i].slot];
      runs_[i].k_cache = k_pool_.data() + base;
      runs_[i].v_cache = v_pool_.data() + base;
      runs_[i].page_table = s.pages.data();
      runs_[i].valid = nullptr;
    }
    AttnMixer(L.attn, a_.data(), N, runs_, y_.data());
  }
  DS_RETURN_IF_ERROR(AllReduce(y_.data(), N * H));  // row-parallel mixer output: Σ over ranks
  for (int64_t i = 0; i < N * H; ++i) h_[i] += y_[i];
  cpu::RmsNormRows(h_.data(), L.post_norm.data(), N, H, c.rms_eps, a_.data());
  Mlp(L, a_.data(), N, y_.data());
  DS_RETURN_IF_ERROR(AllReduce(y_.data(), N * H));  // row-parallel ffn_down: Σ over ranks
  for (int64_t i = 0; i < N * H; ++i) h_[i] += y_[i];
  return absl::OkStatus();
}

absl::Status CpuDevice::Head() {
  const ModelConfig& c = cfg_;
  const int64_t H = c.n_embd, nl = step_->n_logit_rows();
  for (int64_t i = 0; i < nl; ++i)
    cpu::RmsNorm(h_.data() + static_cast<int64_t>(step_->logit_rows[i]) * H,
                 w_.output_norm.data(), H, c.rms_eps, hn_.data() + i * H);
  logits_.assign(nl * static_cast<int64_t>(c.n_vocab), 0.f);
  const bool vocab_parallel = tp_.world > 1 && tp_.plan.lm_head == tp::LmHead::kVocabParallel;
  if (vocab_parallel) {
    // This rank's rows [v0_r, v1_r) of the lm_head; the runner gathers and interleaves them.
    local_logits_.assign(nl * lc_.n_vocab, 0.f);
    gathered_.assign(nl * static_cast<int64_t>(c.n_vocab), 0.f);
    cpu::MatMul(w_.output, hn_.data(), nl, local_logits_.data(), pool_);
  } else if (tp_.world == 1 || tp_.rank == 0) {
    // Whole lm_head here (with tp_lm_head_rank0 the other ranks hold none of it).
    cpu::MatMul(w_.output, hn_.data(), nl, logits_.data(), pool_);
  }
  return absl::OkStatus();
}

LogitBuffers CpuDevice::logit_buffers() {
  return {local_logits_.data(), gathered_.data(), logits_.data()};
}

absl::Status CpuDevice::CopyColumns(float* dst, int64_t ld_dst, const float* src, int64_t ld_src,
                                    int64_t width, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * ld_dst, src + r * ld_src, width * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuDevice::ReadLogits(int n, float* dst) {
  std::memcpy(dst, logits_.data(), static_cast<size_t>(n) * cfg_.n_vocab * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuDevice::ReadHidden(int n, float* dst) {
  std::memcpy(dst, hn_.data(), static_cast<size_t>(n) * cfg_.n_embd * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuDevice::Sample(std::span<const DeviceSampleRow> rows, int32_t* tokens) {
  const int64_t V = cfg_.n_vocab;
  for (size_t r = 0; r < rows.size(); ++r) {
    const DeviceSampleRow& d = rows[r];
    tokens[r] = -1;
    if (d.mode != DeviceSampleRow::Mode::kSample || d.params == nullptr) continue;
    sampling::Sampler sampler(*d.params);
    tokens[r] =
        sampler.TokenWith(std::span<const float>(logits_.data() + static_cast<int64_t>(r) * V, V),
                          d.history, d.uniform);
  }
  return absl::OkStatus();
}

absl::Status CpuDevice::Argmax(int n, int32_t* tokens) {
  const int64_t V = cfg_.n_vocab;
  for (int r = 0; r < n; ++r) {
    const float* row = logits_.data() + r * V;
    tokens[r] = static_cast<int32_t>(std::max_element(row, row + V) - row);
  }
  return absl::OkStatus();
}

absl::Status CpuDevice::MtpAttention(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                     const float* hidden, float* u, float* y) {
  const ModelConfig& c = cfg_;
  const int64_t H = c.n_embd, n = static_cast<int64_t>(tokens.size());
  const MtpWeights& m = w_.mtp;
  std::vector<float> e(n * H), cat(n * 2 * H), a(n * H);
  DS_RETURN_IF_ERROR(EmbedRows(m.embed, tokens, e.data()));  // vocab-parallel under TP, as Embed
  for (int64_t i = 0; i < n; ++i) {
    float* ci = cat.data() + i * 2 * H;
    cpu::RmsNorm(e.data() + i * H, m.enorm.data(), H, c.rms_eps, ci);  // e (first half)
    cpu::RmsNorm(hidden + i * H, m.hnorm.data(), H, c.rms_eps, ci + H);  // hh
  }
  cpu::MatMul(m.eh_proj, cat.data(), n, u, pool_);  // whole on every rank: u is replicated
  Slot& s = slots_[slot];
  // Rows [pos0, pos0 + n) replace whatever was there and drop every later row (rejected drafts).
  s.mtp_len = cpu::MtpMaskWrite(s.mtp_valid.data(), pos0, static_cast<int32_t>(n), s.mtp_len);
  for (int64_t i = 0; i < n; ++i)
    cpu::RmsNorm(u + i * H, m.layer.attn_norm.data(), H, c.rms_eps, a.data() + i * H);
  std::vector<SeqRun> run(1);
  run[0].n = n;
  run[0].pos0 = pos0;
  run[0].k_cache = s.mtp_k.data();
  run[0].v_cache = s.mtp_v.data();
  run[0].valid = s.mtp_valid.data();
  AttnMixer(m.layer.attn, a.data(), n, run, y);  // this rank's heads: y is a partial sum
  return absl::OkStatus();
}

absl::Status CpuDevice::MtpStep(int slot, int32_t token, int32_t pos,
                                std::span<const float> hidden, std::vector<float>* logits,
                                std::vector<float>* hidden_out) {
  return MtpRows(slot, pos, std::span<const int32_t>(&token, 1), hidden, cfg_.n_embd, logits,
                 hidden_out);
}

// n MtpStep rows in one pass: every row's K/V and attention (MtpAttention; a row attends only to
// rows up to its own, so each is what MtpStep would give), then the MLP, norm and head of the
// last row only, the one whose outputs are returned. Bit-identical to n MtpStep calls
// (cpu::MatMul's sums do not depend on the token count) with one weight pass instead of n.
absl::Status CpuDevice::MtpRows(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                std::span<const float> hidden, int64_t n_embd,
                                std::vector<float>* logits, std::vector<float>* hidden_out) {
  const ModelConfig& c = cfg_;
  if (!w_.has_mtp)
    return absl::UnimplementedError(
        "MtpStep: the model file has no MTP block (nextn_predict_layers = 0)");
  const int64_t H = c.n_embd, n = static_cast<int64_t>(tokens.size());
  const MtpWeights& m = w_.mtp;
  std::vector<float> u(n * H), y(n * H), a(H);
  DS_RETURN_IF_ERROR(MtpAttention(slot, pos0, tokens, hidden.data(), u.data(), y.data()));
  float* ul = u.data() + (n - 1) * H;  // the last row
  float* yl = y.data() + (n - 1) * H;
  DS_RETURN_IF_ERROR(AllReduce(yl, H));  // row-parallel attn_output: Σ over ranks
  for (int64_t i = 0; i < H; ++i) ul[i] += yl[i];
  cpu::RmsNorm(ul, m.layer.post_norm.data(), H, c.rms_eps, a.data());
  Mlp(m.layer, a.data(), 1, yl);
  DS_RETURN_IF_ERROR(AllReduce(yl, H));  // row-parallel ffn_down
  for (int64_t i = 0; i < H; ++i) ul[i] += yl[i];
  hidden_out->assign(H, 0.f);
  cpu::RmsNorm(ul, m.shared_head_norm.data(), H, c.rms_eps, hidden_out->data());
  logits->assign(c.n_vocab, 0.f);
  if (tp_.world == 1) {
    cpu::MatMul(m.head, hidden_out->data(), 1, logits->data(), pool_);
    return absl::OkStatus();
  }
  // Vocab-parallel head (the runner refuses MTP with the lm_head on rank 0): this rank's rows,
  // then every rank's, gathered as the model's logits are.
  std::vector<float> local(lc_.n_vocab), gathered(c.n_vocab);
  cpu::MatMul(m.head, hidden_out->data(), 1, local.data(), pool_);
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = tp::GatherVocabParallel(
      *tp_.collective, tp_.plan, c.n_vocab, 1, local.data(), gathered.data(), logits->data(),
      [this](float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t width,
             int64_t rows) { return CopyColumns(dst, ld_dst, src, ld_src, width, rows); });
  comm_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

// The MtpStep rows of a prompt's positions without their MLP and head (a row's K/V depends only
// on its own inputs): the same K/V bit for bit (cpu::MatMul is per row).
absl::Status CpuDevice::MtpFill(const RowRun& run, int32_t next) {
  if (!w_.has_mtp)
    return absl::UnimplementedError(
        "MtpFill: the model file has no MTP block (nextn_predict_layers = 0)");
  const int64_t H = cfg_.n_embd;
  const int64_t n = run.n - (next < 0 ? 1 : 0);
  if (n <= 0) return absl::OkStatus();
  std::vector<int32_t> tokens(n);
  std::vector<float> hid(n * H), u(n * H), y(n * H);
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = i + 1 < run.n ? step_->ids[run.row0 + i + 1] : next;
    // The final-normed state: Head's hn_ row.
    cpu::RmsNorm(h_.data() + (run.row0 + i) * H, w_.output_norm.data(), H, cfg_.rms_eps,
                 hid.data() + i * H);
  }
  // y (the attention's output) is not needed: no all-reduce of it.
  return MtpAttention(run.slot, run.pos0, tokens, hid.data(), u.data(), y.data());
}

// Payload: [mtp_len i32][conv f32...][ssm f32...]
//   [per attention layer: K rows [0,n_past), V rows [0,n_past)][MTP K, V rows [0,mtp_len)]
//   [MTP valid bytes [0,mtp_len)]; saved with mtp_len = MtpRowsKept (device.h): the rows that
//   hold for any sequence sharing the n_past saved positions.
size_t CpuDevice::StateBytes(int32_t n_past, int32_t mtp_len) const {
  size_t n = 4;
  n += sizeof(float) * static_cast<size_t>(n_gdn_) * (conv_elems_ + ssm_elems_);
  n += sizeof(float) * 2 * static_cast<size_t>(n_attn_) * n_past * kv_width_;
  if (w_.has_mtp) n += sizeof(float) * 2 * static_cast<size_t>(mtp_len) * kv_width_ + mtp_len;
  return n;
}

std::string CpuDevice::state_layout() const {
  return absl::StrCat("cpu f32 gdn=", n_gdn_, "x", conv_elems_, "+", ssm_elems_, " attn=", n_attn_,
                      "x", kv_width_, " mtp=", w_.has_mtp ? 1 : 0);
}

absl::StatusOr<std::vector<uint8_t>> CpuDevice::SaveState(int slot, int32_t n_past) const {
  const Slot& s = slots_[slot];
  const int32_t mtp_len = w_.has_mtp ? MtpRowsKept(s.mtp_len, n_past) : 0;
  std::vector<uint8_t> bytes(StateBytes(n_past, mtp_len));
  uint8_t* p = bytes.data();
  auto put = [&p](const void* src, size_t n) {
    if (n) std::memcpy(p, src, n);
    p += n;
  };
  put(&mtp_len, 4);
  put(s.conv.data(), s.conv.size() * 4);
  put(s.ssm.data(), s.ssm.size() * 4);
  // K rows [0, n_past) then V rows of each layer, gathered through the page table (the format
  // of the unpaged cache, so snapshots move between pool shapes and page sizes).
  for (int l = 0; l < n_attn_; ++l) {
    const size_t base = static_cast<size_t>(l) * PoolRows() * kv_width_;
    for (const std::vector<float>* pool : {&k_pool_, &v_pool_})
      for (int32_t j = 0; j < n_past; j += paging_.page_size) {
        const int32_t n = std::min<int32_t>(paging_.page_size, n_past - j);
        put(pool->data() + base + PoolRow(s, j) * kv_width_, static_cast<size_t>(n) * kv_width_ * 4);
      }
  }
  if (w_.has_mtp) {
    const size_t mrows = static_cast<size_t>(mtp_len) * kv_width_;
    put(s.mtp_k.data(), mrows * 4);
    put(s.mtp_v.data(), mrows * 4);
    put(s.mtp_valid.data(), mtp_len);
  }
  return bytes;
}

absl::Status CpuDevice::LoadState(int slot, int32_t n_past, std::span<const uint8_t> bytes) {
  int32_t mtp_len = 0;
  if (bytes.size() >= 4) std::memcpy(&mtp_len, bytes.data(), 4);
  if (bytes.size() < 4 || mtp_len < 0 || mtp_len > slot_ctx_ || (!w_.has_mtp && mtp_len != 0))
    return absl::InvalidArgumentError(absl::StrCat("Restore: MTP length ", mtp_len,
                                                   " does not fit this device (slot_ctx ",
                                                   slot_ctx_, ")"));
  if (bytes.size() != StateBytes(n_past, mtp_len))
    return absl::InvalidArgumentError(absl::StrCat("Restore: state of ", bytes.size(),
                                                   " bytes, expected ",
                                                   StateBytes(n_past, mtp_len),
                                                   " (taken from a different model?)"));
  Slot& s = slots_[slot];
  const uint8_t* p = bytes.data() + 4;
  auto get = [&p](void* dst, size_t n) {
    if (n) std::memcpy(dst, p, n);
    p += n;
  };
  get(s.conv.data(), s.conv.size() * 4);
  get(s.ssm.data(), s.ssm.size() * 4);
  for (int l = 0; l < n_attn_; ++l) {
    const size_t base = static_cast<size_t>(l) * PoolRows() * kv_width_;
    for (std::vector<float>* pool : {&k_pool_, &v_pool_})
      for (int32_t j = 0; j < n_past; j += paging_.page_size) {
        const int32_t n = std::min<int32_t>(paging_.page_size, n_past - j);
        get(pool->data() + base + PoolRow(s, j) * kv_width_, static_cast<size_t>(n) * kv_width_ * 4);
      }
  }
  if (w_.has_mtp) {
    const size_t mrows = static_cast<size_t>(mtp_len) * kv_width_;
    get(s.mtp_k.data(), mrows * 4);
    get(s.mtp_v.data(), mrows * 4);
    std::fill(s.mtp_valid.begin(), s.mtp_valid.end(), 0);
    get(s.mtp_valid.data(), mtp_len);
  }
  s.mtp_len = mtp_len;
  return absl::OkStatus();
}

}  // namespace ds
