// CudaDevice (cuda_device.h): speculative entries (CommitSpeculative) and the MTP block
// (MtpRows / MtpStep, spec §8.2) through the device's own norm / matmul / attention kernels.
//
// MTP K/V: one more attention layer in the paged pool, f16, behind the slot's page table (the
// runner maps a draft position's page before MtpStep). Rows are marked in a per-slot mask
// (mtp_valid_) as they are written, and writing row p drops rows > p (rejected drafts), exactly
// the CPU reference's rule (worker/model/cpu_device.h): rows never written — gaps, or pages
// that held another slot's rows — are not attended (kernels/cuda/mtp_attention.cuh).
#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/draft_head.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/mtp_attention.cuh"
#include "kernels/cuda/norm.cuh"
#include "worker/cuda/cuda_device.h"
#include "worker/cuda/slot_bytes.h"
#include "worker/tp/vocab_gather.h"

namespace ds::cuda {

absl::Status CudaDevice::CommitSpeculative(int slot, int entry) {
  if (slot < 0 || slot >= n_slots_ || entry < 0 || entry >= n_spec_entries_)
    return absl::InternalError(absl::StrCat("CommitSpeculative: slot ", slot, " / entry ", entry,
                                            " out of range (", n_slots_, " slots, ",
                                            n_spec_entries_, " entries)"));
  spec_last_[slot] = -1;
  spec_last_pos_[slot] = -1;
  if (n_gdn_ == 0) return absl::OkStatus();
  // One strided copy per state kind: layer l's index `from` to its index `slot`, all layers.
  // After the verify's Finish and a deferred draft chain they go beside that chain (it reads no
  // recurrent state); stream_ waits for them before its next work (BeginSideCopies).
  DS_ASSIGN_OR_RETURN(cudaStream_t s, BeginSideCopies());
  const size_t from = static_cast<size_t>(n_slots_) + entry;
  const size_t ring1 = 4ull * gdn_shape_.channels() * sizeof(float);
  const size_t st1 = SlotRecurrentBytes(gdn_shape_, copts_.gdn_state_bf16).state;
  auto copy = [&](void* base, uint64_t pitch, size_t bytes) -> absl::Status {
    if (bytes == 0) return absl::OkStatus();  // a TP rank without GDN heads
    auto* b = reinterpret_cast<uint8_t*>(base);
    if (pitch <= static_cast<uint64_t>(INT32_MAX)) {
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(b + slot * bytes, pitch, b + from * bytes, pitch,
                                                bytes, n_gdn_, cudaMemcpyDeviceToDevice, s));
      return absl::OkStatus();
    }
    for (int l = 0; l < n_gdn_; ++l)  // a pitch past what 2-D copies take: layer by layer
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b + l * pitch + slot * bytes,
                                              b + l * pitch + from * bytes, bytes,
                                              cudaMemcpyDeviceToDevice, s));
    return absl::OkStatus();
  };
  DS_RETURN_IF_ERROR(copy(rings_, ring_pitch_, ring1));
  DS_RETURN_IF_ERROR(copy(states_, state_pitch_, st1));
  return EndSideCopies(s);
}

// The fused chain's fixed arguments, when this device's MTP block takes it (mtp_chain.cuh:
// one rank, the full head, F32 / F16 / BF16 rows of one type); otherwise the chain keeps one
// kernel per op. Per call MtpDraftGreedy sets the call (MtpChainCall), the passes and the outputs.
absl::Status CudaDevice::SetUpFusedDraftChain() {
  mtp_chain_ = MtpChainArgs{};
  // Not on the portable path either: it stands for the sm_70 kernels, which have no clusters.
  if (!copts_.fused_draft_chain || portable_ || tp_world_ > 1 || mtp_coarse_head_ != nullptr)
    return absl::OkStatus();
  const DLayer& L = mtp_layer_;
  MtpChainArgs a;
  a.type = mtp_eh_.type;
  bool one_type = true;
  auto mat = [&](const DMat& m) {
    one_type = one_type && m.type == a.type && !m.tiled;
    return MtpChainMatrix{m.d, m.rows, m.cols};
  };
  a.H = cfg_.n_embd;
  a.n_ff = L.ffn_gate.rows;
  a.n_vocab = cfg_.n_vocab;
  a.eps = cfg_.rms_eps;
  a.shape = attn_shape_;
  a.embed = mat(mtp_embed_);
  a.eh = mat(mtp_eh_);
  a.wq = mat(L.q);
  a.wk = mat(L.k);
  a.wv = mat(L.v);
  a.wo = mat(L.o);
  a.gate = mat(L.ffn_gate);
  a.up = mat(L.ffn_up);
  a.down = mat(L.ffn_down);
  a.head = mat(mtp_head_);
  if (!one_type) return absl::OkStatus();
  a.enorm = mtp_enorm_;
  a.hnorm = mtp_hnorm_;
  a.attn_norm = L.attn_norm;
  a.q_norm = L.q_norm;
  a.k_norm = L.k_norm;
  a.post_norm = L.post_norm;
  a.head_norm = mtp_norm_;
  a.kv = MtpKvView();
  a.valid = mtp_valid_;
  a.valid_ld = slot_ctx_;
  a.hid0 = hn_;
  a.hid_out = mtp_hid_;
  a.logits = mtp_logits_;
  a.u = mtp_u_;
  a.qg = mtp_qg_;
  a.k = mtp_k_;
  a.v = mtp_v_;
  a.q = mtp_q_;
  a.ff = mtp_ff_;
  a.parts = mtp_parts_;
  a.max_parts = MtpAttnSplits();
  a.best = mtp_chain_best_;
  a.n = 1;
  a.passes = 1;
  if (!MtpChainSupported(a).ok()) return absl::OkStatus();  // the per-kernel chain
  // The resident form where asked for and placeable, else the global form, else per kernel.
  MtpChainArgs placed = a;
  if (!copts_.draft_chain_resident ||
      !MtpChainConfigure(&placed, device_, copts_.fused_draft_blocks, /*resident=*/true).ok()) {
    placed = a;
    if (!MtpChainConfigure(&placed, device_, copts_.fused_draft_blocks).ok()) return absl::OkStatus();
  }
  placed.fold_prep = copts_.draft_chain_fold_prep;
  placed.prefetch_weights = copts_.draft_chain_prefetch;
  mtp_chain_ = placed;
  return absl::OkStatus();
}

std::string CudaDevice::draft_chain_form() const {
  if (mtp_chain_.blocks == 0) return "per kernel";
  if (!mtp_chain_.resident)
    return absl::StrCat("fused, global form, ", mtp_chain_.blocks, " blocks");
  return absl::StrCat("fused, resident form, ", mtp_chain_.blocks, " blocks, ",
                      mtp_chain_.smem_bytes / 1024, " KiB of shared memory each");
}

KvCacheView CudaDevice::MtpKvView() const {
  KvCacheView kv = kv_base_;
  kv.k = mtp_layer_.kc;
  kv.v = mtp_layer_.vc;
  kv.type = GgmlType::F16;
  return kv;
}

int CudaDevice::MtpAttnSplits() const {
  // About four blocks per SM for a full context; at least 128 positions per split.
  const int by_sm = std::max(1, 4 * sm_count_ / std::max(1, attn_shape_.n_head));
  return std::clamp((slot_ctx_ + 127) / 128, 1, by_sm);
}

absl::Status CudaDevice::MtpStep(int slot, int32_t token, int32_t pos,
                                 std::span<const float> hidden, std::vector<float>* logits,
                                 std::vector<float>* hidden_out) {
  return MtpRows(slot, pos, std::span<const int32_t>(&token, 1), hidden, cfg_.n_embd, logits,
                 hidden_out);
}

// One MTP pass over r rows of one slot, everything it reads on the device: tokens / slots /
// positions [r] (device), hidden rows (`hid` [r, H], or rows `hid_rows` of `hid` when set). The
// rows' K/V go into the MTP plane; with `last`, the last row also runs attention, MLP, norm and
// LM head, leaving h' in mtp_hid_ and the logits in mtp_logits_. A row's K/V depends only on its
// own inputs (embedding, hidden, eh_proj, attn_norm, k/v projections), so the earlier rows stop
// after writing K/V: the rows' matmuls are one weight read for all of them, and the last row
// attends to the earlier ones exactly as an MtpStep after them would (they are valid, written
// just before). No host value that changes between calls of one shape reaches a kernel, so a
// draft chain of these passes can be replayed from a graph.
absl::Status CudaDevice::MtpPass(const int32_t* d_tok, const int32_t* d_slot, const int32_t* d_pos,
                                 int r, bool last, const float* hid, const int32_t* hid_rows) {
  const int H = cfg_.n_embd;
  const float eps = cfg_.rms_eps;
  const DLayer& L = mtp_layer_;
  const int64_t kvw = static_cast<int64_t>(attn_shape_.n_kv) * attn_shape_.hd;
  const KvCacheView kv = MtpKvView();

  // cat = [enorm(embed[token]) | hnorm(h)] per row; u = eh_proj · cat. Under TP the embedding
  // is vocab-parallel as in Embed (zero rows for other ranks' tokens + the all-reduce) and
  // eh_proj is whole on every rank (docs/tp.md §10).
  InvalidateX();
  DS_RETURN_IF_ERROR(EmbedRows(mtp_embed_.type, mtp_embed_.d, H, d_tok, r, mtp_a_, stream_,
                               embd_v0_, embd_v1_));
  if (coll_ && tp_world_ > 1)
    DS_RETURN_IF_ERROR(coll_->AllReduceSumOnStream(mtp_a_, static_cast<size_t>(r) * H, stream_));
  if (r == 1) {
    DS_RETURN_IF_ERROR(
        RmsNormRows(mtp_a_, H, nullptr, mtp_enorm_, mtp_cat_, 1, H, eps, stream_, early_launch_));
    DS_RETURN_IF_ERROR(
        RmsNormRows(hid, H, hid_rows, mtp_hnorm_, mtp_cat_ + H, 1, H, eps, stream_, early_launch_));
  } else {  // the norms write contiguous rows: each half goes into cat's rows by a 2-D copy
    DS_RETURN_IF_ERROR(
        RmsNormRows(mtp_a_, H, nullptr, mtp_enorm_, mtp_b_, r, H, eps, stream_, early_launch_));
    DS_RETURN_IF_ERROR(CopyColumns(mtp_cat_, 2 * H, mtp_b_, H, H, r));
    DS_RETURN_IF_ERROR(
        RmsNormRows(hid, H, hid_rows, mtp_hnorm_, mtp_b_, r, H, eps, stream_, early_launch_));
    DS_RETURN_IF_ERROR(CopyColumns(mtp_cat_ + H, 2 * H, mtp_b_, H, H, r));
  }
  DS_RETURN_IF_ERROR(LinearRows(mtp_eh_, mtp_cat_, r, mtp_u_, false));

  // K/V of every row into the MTP plane; the query of the last row only. A TP rank without
  // attention heads writes no K/V and contributes zeros to the attention's all-reduce.
  const bool heads = attn_shape_.n_kv > 0;
  float* u = mtp_u_ + static_cast<int64_t>(r - 1) * H;  // the last row's residual
  if (!heads) {
    if (!last) return absl::OkStatus();
    DS_RETURN_IF_ERROR(MtpReduceResidual(u, /*contributes=*/false));
    return MtpTail(u);
  }
  DS_RETURN_IF_ERROR(
      RmsNormRows(mtp_u_, H, nullptr, L.attn_norm, mtp_a_, r, H, eps, stream_, early_launch_));
  InvalidateX();
  // A one-row pass with its query (every draft after the first): q, k and v in one launch, as
  // the trunk's attention layers do (ncu, 27B on the H200: 23 us instead of 22 + 9 + 8).
  const bool qkv_once = last && r == 1 && ColumnPath(L.q, 1) &&
                        SameColumnMatrices({{&L.q, mtp_qg_}, {&L.k, mtp_k_}, {&L.v, mtp_v_}});
  if (qkv_once) {
    DS_RETURN_IF_ERROR(ColumnsMulti({{&L.q, mtp_qg_}, {&L.k, mtp_k_}, {&L.v, mtp_v_}}, mtp_a_, 1));
  } else {
    DS_RETURN_IF_ERROR(LinearRows(L.k, mtp_a_, r, mtp_k_, false));
    DS_RETURN_IF_ERROR(LinearRows(L.v, mtp_a_, r, mtp_v_, false));
  }
  QkvPrepArgs pa;
  pa.shape = attn_shape_;
  pa.tok_slot = d_slot;
  pa.tok_pos = d_pos;
  pa.k = mtp_k_;
  pa.v = mtp_v_;
  pa.q_norm = L.q_norm;
  pa.k_norm = L.k_norm;
  pa.kv = kv;
  const int kv_only = last ? r - 1 : r;
  if (kv_only > 0) {
    // No query heads: QkvPrep then only norms / ropes / stores the K/V heads of these rows.
    QkvPrepArgs ka = pa;
    ka.shape.n_head = 0;
    ka.T = kv_only;
    ka.early = early_launch_;
    DS_RETURN_IF_ERROR(QkvPrep(ka, stream_));
  }
  if (!last) return absl::OkStatus();
  const int i = r - 1;
  if (!qkv_once)
    DS_RETURN_IF_ERROR(LinearRows(L.q, mtp_a_ + static_cast<int64_t>(i) * H, 1, mtp_qg_, false));
  pa.T = 1;
  pa.tok_slot = d_slot + i;
  pa.tok_pos = d_pos + i;
  pa.k = mtp_k_ + i * kvw;
  pa.v = mtp_v_ + i * kvw;
  pa.qg = mtp_qg_;
  pa.q_out = mtp_q_;
  pa.early = early_launch_;
  DS_RETURN_IF_ERROR(QkvPrep(pa, stream_));

  // u += GatedAttention(attn_norm(u)) over the slot's valid MTP rows [0, pos].
  MaskedAttnArgs ma;
  ma.shape = attn_shape_;
  ma.dev_slot = d_slot + i;
  ma.dev_pos = d_pos + i;
  ma.valid = mtp_valid_;
  ma.valid_ld = slot_ctx_;
  ma.q = mtp_q_;
  ma.qg = mtp_qg_;
  ma.kv = kv;
  ma.n_splits = MtpAttnSplits();
  ma.partials = mtp_parts_;
  ma.out = mtp_o_;
  ma.early = early_launch_;
  DS_RETURN_IF_ERROR(MaskedAttnDecode(ma, stream_));
  InvalidateX();
  // Row-parallel attn_output under TP: the ResidualOnThisRank rule of the trunk (rank 0 adds
  // into u, the others store their partial product there) and the all-reduce sum them.
  DS_RETURN_IF_ERROR(LinearRows(L.o, mtp_o_, 1, u, ResidualOnThisRank()));
  DS_RETURN_IF_ERROR(MtpReduceResidual(u, /*contributes=*/true));
  return MtpTail(u);
}

absl::Status CudaDevice::MtpReduceResidual(float* u, bool contributes) {
  if (!coll_ || tp_world_ == 1) return absl::OkStatus();
  if (!contributes && !ResidualOnThisRank())
    DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(u, 0, cfg_.n_embd * sizeof(float), stream_));
  return coll_->AllReduceSumOnStream(u, cfg_.n_embd, stream_);
}

// u += MLP(post_norm(u)); h' = shared_head_norm(u); logits = head · h' (this rank's vocabulary
// rows into logits_part_ under TP: MtpRows gathers them).
absl::Status CudaDevice::MtpTail(float* u) {
  const int H = cfg_.n_embd;
  const float eps = cfg_.rms_eps;
  const DLayer& L = mtp_layer_;
  const int n_ff = L.ffn_gate.rows;
  if (n_ff > 0) {
    DS_RETURN_IF_ERROR(
        RmsNormRows(u, H, nullptr, L.post_norm, mtp_a_, 1, H, eps, stream_, early_launch_));
    InvalidateX();
    const DMat& g = L.ffn_gate;
    const DMat& up = L.ffn_up;
    if (g.type == up.type && g.tiled == up.tiled && ColumnPath(g, 1)) {
      // silu(gate) * up in one launch, as the trunk's FFN (ncu, 27B: 48 us instead of 2 x 28 + 3).
      DS_RETURN_IF_ERROR(GemvColumns(g, &up, mtp_a_, 1, mtp_ff_, GemvEpilogue::kSiluMul));
    } else {
      DS_RETURN_IF_ERROR(LinearRows(g, mtp_a_, 1, mtp_ff_, false));
      DS_RETURN_IF_ERROR(LinearRows(up, mtp_a_, 1, mtp_ff_ + n_ff, false));
      DS_RETURN_IF_ERROR(SiluMul(mtp_ff_, mtp_ff_ + n_ff, mtp_ff_, n_ff, stream_));
    }
    InvalidateX();
    DS_RETURN_IF_ERROR(LinearRows(L.ffn_down, mtp_ff_, 1, u, ResidualOnThisRank()));
  }
  DS_RETURN_IF_ERROR(MtpReduceResidual(u, /*contributes=*/n_ff > 0));

  DS_RETURN_IF_ERROR(
      RmsNormRows(u, H, nullptr, mtp_norm_, mtp_hid_, 1, H, eps, stream_, early_launch_));
  InvalidateX();
  float* logits = VocabParallel() ? logits_part_ : mtp_logits_;
  if (mtp_coarse_head_ != nullptr) {  // drafts propose tokens: the coarse head (draft_head.cuh)
    DS_RETURN_IF_ERROR(EnsureQuantized(mtp_hid_, 1, H));
    DS_RETURN_IF_ERROR(
        CoarseGemv(mtp_coarse_head_, mtp_head_.rows, H, xq_, xd_, logits, stream_, early_launch_));
  } else {
    DS_RETURN_IF_ERROR(LinearRows(mtp_head_, mtp_hid_, 1, logits, false));
  }
  InvalidateX();
  return absl::OkStatus();
}

absl::Status CudaDevice::CheckMtp(int slot, int32_t pos0, int n) const {
  if (!has_mtp_)
    return absl::UnimplementedError(
        "MtpStep: the CUDA device holds no MTP block (the file has none, or the backend was "
        "created without speculative entries: CudaBackendOptions::spec_tokens / --mtp)");
  if (n < 1 || pos0 < 0 || pos0 + n > slot_ctx_ || slot < 0 || slot >= n_slots_)
    return absl::InternalError(
        absl::StrCat("MTP: ", n, " rows at ", pos0, " of slot ", slot, " out of range"));
  return absl::OkStatus();
}

// n rows as n MtpStep calls would leave them, in one pass per chunk of mtp_rows_max_ rows (the
// K/V of all; attention, MLP and head for the last row only, the only output).
absl::Status CudaDevice::MtpRows(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                 std::span<const float> hidden, int64_t n_embd,
                                 std::vector<float>* logits, std::vector<float>* hidden_out) {
  const int H = cfg_.n_embd;
  const int n = static_cast<int>(tokens.size());
  DS_RETURN_IF_ERROR(CheckMtp(slot, pos0, n));
  if (n_embd != H || hidden.size() != static_cast<size_t>(n) * H)
    return absl::InternalError(absl::StrCat("MtpRows: ", hidden.size(), " hidden values for ", n,
                                            " rows of ", H));
  const int R = mtp_rows_max_;
  // Pass block 0 of the MTP ints (MtpInts): its uploads and the two results go through pinned
  // mirrors without a host sync of their own (one at the end; pageable copies would each block
  // and stage).
  int32_t* h_blk = h_mtp_ints_;
  float* h_in = h_mtp_f_;                                      // [R, H]
  float* h_hid = h_mtp_f_ + static_cast<size_t>(R) * H;        // [H]
  float* h_logits = h_hid + H;                                 // [n_vocab]
  // Rows [pos0, pos0 + n) replace whatever was there and every later row is dropped (rejected
  // drafts): the mask after n MtpStep calls.
  h_blk[MtpMaskArgs()] = slot;
  h_blk[MtpMaskArgs() + 1] = pos0;
  h_blk[MtpMaskArgs() + 2] = n;
  h_blk[MtpMaskArgs() + 3] = mtp_len_[slot];
  mtp_len_[slot] = pos0 + n;
  int r = 0;
  for (int c0 = 0; c0 < n; c0 += r) {
    r = std::min(R, n - c0);
    // The mirrors are free at the start of a call (the last one ended in a sync); between
    // chunks the previous uploads must have landed before they are rewritten.
    if (c0 > 0) DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    for (int i = 0; i < r; ++i) {
      h_blk[i] = tokens[c0 + i];
      h_blk[R + i] = slot;
      h_blk[2 * R + i] = pos0 + c0 + i;
    }
    std::memcpy(h_in, hidden.data() + static_cast<size_t>(c0) * H,
                static_cast<size_t>(r) * H * sizeof(float));
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mtp_ints_, h_blk, MtpBlockInts() * sizeof(int32_t),
                                            cudaMemcpyHostToDevice, stream_));
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mtp_u_, h_in, static_cast<size_t>(r) * H * sizeof(float),
                                            cudaMemcpyHostToDevice, stream_));
    if (c0 == 0)
      DS_RETURN_IF_ERROR(
          MtpMaskUpdate(mtp_valid_, slot_ctx_, mtp_ints_ + MtpMaskArgs(), stream_, early_launch_));
    // (The pass reads the hidden rows from mtp_u_ before its eh_proj overwrites them.)
    DS_RETURN_IF_ERROR(MtpPass(mtp_ints_, mtp_ints_ + R, mtp_ints_ + 2 * R, r, c0 + r == n,
                               mtp_u_, nullptr));
  }
  if (VocabParallel()) {
    // The head wrote this rank's rows: gather every rank's into mtp_logits_ as the runner gathers
    // the model's (the collective is blocking and not ordered with the stream: finish first).
    DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    DS_RETURN_IF_ERROR(tp::GatherVocabParallel(
        *coll_, tp_plan_, cfg_.n_vocab, 1, logits_part_, logits_gather_, mtp_logits_,
        [this](float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t width,
               int64_t rows) { return CopyColumns(dst, ld_dst, src, ld_src, width, rows); }));
  }
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_hid, mtp_hid_, static_cast<size_t>(H) * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream_));
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_logits, mtp_logits_,
                                          static_cast<size_t>(cfg_.n_vocab) * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream_));
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  hidden_out->assign(h_hid, h_hid + H);
  logits->assign(h_logits, h_logits + cfg_.n_vocab);
  return absl::OkStatus();
}

absl::Status CudaDevice::MtpFill(const RowRun& run, int32_t next) {
  const int n = run.n - (next < 0 ? 1 : 0);
  if (n <= 0) return absl::OkStatus();
  DS_RETURN_IF_ERROR(CheckMtp(run.slot, run.pos0, n));
  const int H = cfg_.n_embd;
  const int R = mtp_rows_max_;
  // Pass block 0 of the MTP ints: the mask arguments and the last row's token / slot / position.
  // Its pinned mirror may still be read by an earlier copy (an earlier run's fill; draft chains
  // have mirrors of their own): wait for the stream first. Only prefill-like runs get here (a plain
  // decode row has no token after it yet), where the micro-step's layers dwarf the wait.
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  int32_t* h_blk = h_mtp_ints_;
  h_blk[0] = next;
  h_blk[R] = run.slot;
  h_blk[2 * R] = run.pos0 + run.n - 1;
  h_blk[MtpMaskArgs()] = run.slot;
  h_blk[MtpMaskArgs() + 1] = run.pos0;
  h_blk[MtpMaskArgs() + 2] = n;
  h_blk[MtpMaskArgs() + 3] = mtp_len_[run.slot];
  mtp_len_[run.slot] = run.pos0 + n;
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mtp_ints_, h_blk, MtpBlockInts() * sizeof(int32_t),
                                          cudaMemcpyHostToDevice, stream_));
  DS_RETURN_IF_ERROR(
      MtpMaskUpdate(mtp_valid_, slot_ctx_, mtp_ints_ + MtpMaskArgs(), stream_, early_launch_));
  // Rows whose next token is the next row's id: ids, slots and positions where Prepare put them.
  const int in_run = std::min(n, run.n - 1);
  for (int c0 = 0, r = 0; c0 < in_run; c0 += r) {
    r = std::min(R, in_run - c0);
    const int row = run.row0 + c0;
    DS_RETURN_IF_ERROR(RmsNormRows(h_ + static_cast<int64_t>(row) * H, H, nullptr, output_norm_,
                                   mtp_u_, r, H, cfg_.rms_eps, stream_, early_launch_));
    DS_RETURN_IF_ERROR(MtpPass(d_ints_ + row + 1, TokenSlots() + row, TokenPositions() + row, r,
                               /*last=*/false, mtp_u_, nullptr));
  }
  if (next >= 0) {  // the run's last row, with the caller's token
    DS_RETURN_IF_ERROR(RmsNormRows(h_ + static_cast<int64_t>(run.row0 + run.n - 1) * H, H, nullptr,
                                   output_norm_, mtp_u_, 1, H, cfg_.rms_eps, stream_,
                                   early_launch_));
    DS_RETURN_IF_ERROR(
        MtpPass(mtp_ints_, mtp_ints_ + R, mtp_ints_ + 2 * R, 1, /*last=*/false, mtp_u_, nullptr));
  }
  return absl::OkStatus();
}

// The greedy draft chain on the device (Device::MtpDraftGreedy): pass 0 is MtpRows over the n
// catch-up rows with their hidden states taken from the last micro-step's hn_ rows; pass j >= 1
// is one MtpStep whose token is pass j-1's argmax and whose hidden state is pass j-1's h'.
// The fused chain (one kernel) takes its per-call values in its launch (MtpChainCall) and is
// launched directly. The per-kernel chain gives each pass its own block of the MTP ints, all
// uploaded at once before the chain, and is captured once per (n, n_drafts) and replayed. The
// drafts come back in one copy (or stay on the device when deferred).
absl::Status CudaDevice::MtpDraftGreedy(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                        int hidden_row0, int n_logit_rows, int64_t n_embd,
                                        int n_drafts, int32_t* drafts) {
  const int n = static_cast<int>(tokens.size());
  DS_RETURN_IF_ERROR(CheckMtp(slot, pos0, n + std::max(0, n_drafts - 1)));
  const int R = mtp_rows_max_;
  if (n > R || n_drafts < 0 || n_drafts > kMtpChainMax || hidden_row0 < 0 ||
      hidden_row0 + n > n_logit_rows || n_logit_rows > logit_rows_max_ || n_embd != cfg_.n_embd)
    return absl::InternalError(absl::StrCat("MtpDraftGreedy: ", n, " rows (hidden rows from ",
                                            hidden_row0, " of ", n_logit_rows, "), ", n_drafts,
                                            " drafts"));
  const int B = MtpBlockInts();
  const int passes = std::max(1, n_drafts);
  int32_t* d_rows = mtp_ints_ + static_cast<size_t>(kMtpChainMax) * B;
  int32_t* d_drafts = d_rows + R;
  const int32_t len0 = mtp_len_[slot];
  // Pass j's rows start at p_j (pos0, then pos0 + n - 1 + j); the slot's MTP rows end where the
  // last pass's end.
  mtp_len_[slot] = n_drafts > 1 ? pos0 + n - 1 + passes : pos0 + n;
  const bool fused = mtp_chain_.blocks > 0 && n_drafts > 0 && n <= kMtpChainMaxRows;
  // The drafts go to the half of the slot's rows its last chain did not write (chain_drafts_).
  const int half = 1 - chain_half_[slot];
  chain_half_[slot] = static_cast<uint8_t>(half);
  if (fused) {  // every pass in one launch (kernels/cuda/mtp_chain.cuh), nothing uploaded
    MtpChainArgs a = mtp_chain_;
    a.call.slot = slot;
    a.call.pos0 = pos0;
    a.call.len0 = len0;
    a.call.hid_row0 = hidden_row0;
    std::copy(tokens.begin(), tokens.end(), a.call.tokens);
    a.n = n;
    a.passes = passes;
    a.drafts = d_drafts;
    // The drafts also where a deferred chain's consumers read them (the next verify's
    // embedding, DeferredDrafts): no copies after the chain.
    a.slot_drafts = chain_drafts_ + ChainRow(0, half);
    a.slot_drafts_host = h_chain_drafts_ + ChainRow(0, half);
    a.slot_drafts_ld = kMtpChainMax;
    DS_RETURN_IF_ERROR(MtpChain(a, stream_));
    ++fused_chains_;
    if (!drafts) {  // deferred: the kernel wrote the slot's rows itself
      stream_tail_ = true;
      return absl::OkStatus();
    }
    int32_t* h_drafts = h_chain_drafts_ + ChainRow(slot, half);
    DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    std::copy(h_drafts, h_drafts + n_drafts, drafts);
    return absl::OkStatus();
  }
  // The next pinned mirror, once a queued copy that last read it has run (usually long ago).
  const int mirror = chain_mirror_next_;
  chain_mirror_next_ = (chain_mirror_next_ + 1) % kChainMirrors;
  if (chain_mirror_pending_[mirror]) {
    DS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(chain_mirror_read_[mirror]));
    chain_mirror_pending_[mirror] = false;
  }
  int32_t* h = h_chain_ints_ + static_cast<size_t>(mirror) * MtpIntsTotal();
  // Block j: tokens [R], slots [R], positions [R], mask args [4]; then the hidden rows [R] and
  // the drafts [kMtpChainMax] after the last block.
  int32_t len = len0;
  for (int j = 0; j < passes; ++j) {
    int32_t* blk = h + static_cast<size_t>(j) * B;
    const int rows = j == 0 ? n : 1;
    const int32_t p = j == 0 ? pos0 : pos0 + n - 1 + j;
    for (int i = 0; i < rows; ++i) {
      blk[i] = j == 0 ? tokens[i] : -1;  // pass j >= 1 reads its token from the drafts
      blk[R + i] = slot;
      blk[2 * R + i] = p + i;
    }
    blk[MtpMaskArgs()] = slot;
    blk[MtpMaskArgs() + 1] = p;
    blk[MtpMaskArgs() + 2] = rows;
    blk[MtpMaskArgs() + 3] = len;
    len = p + rows;
  }
  int32_t* h_rows = h + static_cast<size_t>(kMtpChainMax) * B;
  for (int i = 0; i < n; ++i) h_rows[i] = hidden_row0 + i;
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mtp_ints_, h, MtpIntsTotal() * sizeof(int32_t),
                                          cudaMemcpyHostToDevice, stream_));
  if (n_drafts == 0 || !drafts) {  // the call returns without waiting: the upload may be queued
    DS_CUDA_RETURN_IF_ERROR(cudaEventRecord(chain_mirror_read_[mirror], stream_));
    chain_mirror_pending_[mirror] = true;
  }
  auto chain = [&]() -> absl::Status {
    for (int j = 0; j < passes; ++j) {
      const int32_t* blk = mtp_ints_ + static_cast<size_t>(j) * B;
      DS_RETURN_IF_ERROR(
          MtpMaskUpdate(mtp_valid_, slot_ctx_, blk + MtpMaskArgs(), stream_, early_launch_));
      DS_RETURN_IF_ERROR(MtpPass(j == 0 ? blk : d_drafts + j - 1, blk + R, blk + 2 * R,
                                 j == 0 ? n : 1, n_drafts > 0, j == 0 ? hn_ : mtp_hid_,
                                 j == 0 ? d_rows : nullptr));
      if (n_drafts > 0)
        DS_RETURN_IF_ERROR(ArgmaxSplitRows(mtp_logits_, cfg_.n_vocab, 1, cfg_.n_vocab,
                                           argmax_scratch_, d_drafts + j, stream_, early_launch_));
    }
    return absl::OkStatus();
  };
  chain_key_.assign({n, n_drafts});  // a member: no allocation per draft chain
  DS_RETURN_IF_ERROR(chain_graphs_.Run(chain_key_, chain));
  if (n_drafts == 0) return absl::OkStatus();
  if (!drafts) {  // deferred: the slot's row on the device, its host copy behind it, no wait
    stream_tail_ = true;
    int32_t* row = chain_drafts_ + ChainRow(slot, half);
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(row, d_drafts, n_drafts * sizeof(int32_t),
                                            cudaMemcpyDeviceToDevice, stream_));
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_chain_drafts_ + ChainRow(slot, half), row,
                                            n_drafts * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                            stream_));
    return absl::OkStatus();
  }
  int32_t* h_drafts = h_rows + R;
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_drafts, d_drafts, n_drafts * sizeof(int32_t),
                                          cudaMemcpyDeviceToHost, stream_));
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  std::copy(h_drafts, h_drafts + n_drafts, drafts);
  return absl::OkStatus();
}

absl::Status CudaDevice::DeferredDrafts(int slot, int n, int32_t* out) {
  if (!has_mtp_ || slot < 0 || slot >= n_slots_ || n < 0 || n > kMtpChainMax)
    return absl::InternalError(absl::StrCat("DeferredDrafts: slot ", slot, ", ", n, " drafts"));
  // The copy was queued behind the chain, before the step that read the drafts; the runner asks
  // after that step's Finish, so it has landed. The half that step embedded (a chain judged on
  // the device may be writing the other one now).
  const int32_t* h = h_chain_drafts_ + ChainRow(slot, verify_half_[slot]);
  std::copy(h, h + n, out);
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaDevice::QueueChainAfterVerify(int slot, int32_t pos0, int row, int n_rows,
                                                       bool chain_drafts, int n_drafts) {
  const int offered = n_rows - 1;
  // The fused chain only (the per-kernel chain's index blocks are uploaded from the host), with
  // the verify's drafts where the device holds them and its tokens sampled by this micro-step.
  if (!copts_.judged_chains || mtp_chain_.blocks == 0 || mtp_chain_.resident || n_rows < 1 ||
      n_rows > kMtpChainMaxRows || n_drafts < 1 || n_drafts > kMtpChainMax ||
      (offered > 0 && !chain_drafts) || last_sample_out_ == nullptr)
    return false;
  DS_RETURN_IF_ERROR(CheckMtp(slot, pos0, n_rows + n_drafts - 1));
  if (row < 0 || row + n_rows > logit_rows_max_)
    return absl::InternalError(absl::StrCat("QueueChainAfterVerify: rows [", row, ", ",
                                            row + n_rows, ") of a micro-step"));
  if (!chains_after_) {
    DS_CUDA_RETURN_IF_ERROR(cudaEventRecord(sampled_, stream_));
    chains_after_ = true;
  }
  const int half = 1 - chain_half_[slot];
  MtpChainArgs a = mtp_chain_;
  a.call.slot = slot;
  a.call.pos0 = pos0;
  a.call.len0 = mtp_len_[slot];
  a.call.hid_row0 = row;
  a.call.sampled = last_sample_out_ + row;
  a.call.offered = offered > 0 ? chain_drafts_ + ChainRow(slot, verify_half_[slot]) : nullptr;
  a.call.n_offered = offered;
  a.n = n_rows;
  a.passes = n_drafts;
  a.drafts = mtp_ints_ + static_cast<size_t>(kMtpChainMax) * MtpBlockInts() + mtp_rows_max_;
  a.slot_drafts = chain_drafts_ + ChainRow(0, half);
  a.slot_drafts_host = h_chain_drafts_ + ChainRow(0, half);
  a.slot_drafts_ld = kMtpChainMax;
  DS_RETURN_IF_ERROR(MtpChain(a, stream_));
  chain_half_[slot] = static_cast<uint8_t>(half);
  ++fused_chains_;
  ++judged_chains_;
  return true;
}

void CudaDevice::ChainAfterVerifyKept(int slot, int32_t pos0, int kept, int n_drafts) {
  // As MtpDraftGreedy sets it for n = kept + 1 catch-up rows.
  const int32_t n = kept + 1;
  mtp_len_[slot] = n_drafts > 1 ? pos0 + n - 1 + n_drafts : pos0 + n;
}

}  // namespace ds::cuda
