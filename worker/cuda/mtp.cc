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
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/mtp_attention.cuh"
#include "kernels/cuda/norm.cuh"
#include "worker/cuda/cuda_device.h"

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
  const size_t from = static_cast<size_t>(n_slots_) + entry;
  const size_t ring1 = 4ull * gdn_shape_.channels() * sizeof(float);
  const size_t st1 = static_cast<size_t>(gdn_shape_.v_heads) * gdn_shape_.k_dim * gdn_shape_.v_dim *
                     sizeof(float);
  auto copy = [&](float* base, uint64_t pitch, size_t bytes) -> absl::Status {
    auto* b = reinterpret_cast<uint8_t*>(base);
    if (pitch <= static_cast<uint64_t>(INT32_MAX)) {
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(b + slot * bytes, pitch, b + from * bytes, pitch,
                                                bytes, n_gdn_, cudaMemcpyDeviceToDevice, stream_));
      return absl::OkStatus();
    }
    for (int l = 0; l < n_gdn_; ++l)  // a pitch past what 2-D copies take: layer by layer
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b + l * pitch + slot * bytes,
                                              b + l * pitch + from * bytes, bytes,
                                              cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  };
  DS_RETURN_IF_ERROR(copy(rings_, ring_pitch_, ring1));
  return copy(states_, state_pitch_, st1);
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

// n rows as n MtpStep calls would leave them, in one pass per chunk of mtp_rows_max_ rows. Only
// the last row's output comes back, and a row's K/V depends only on its own inputs (embedding,
// hidden, eh_proj, attn_norm, k/v projections), so the earlier rows stop after writing K/V: the
// rows' matmuls are one weight read for all of them, and the attention, MLP, norm and LM head run
// for the last row alone (which attends to the earlier ones exactly as the n-th MtpStep would:
// they are valid, written just before it).
absl::Status CudaDevice::MtpRows(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                 std::span<const float> hidden, int64_t n_embd,
                                 std::vector<float>* logits, std::vector<float>* hidden_out) {
  if (!has_mtp_)
    return absl::UnimplementedError(
        "MtpStep: the CUDA device holds no MTP block (the file has none, or the backend was "
        "created without speculative entries: CudaBackendOptions::spec_tokens / --mtp)");
  const int H = cfg_.n_embd;
  const int n = static_cast<int>(tokens.size());
  if (n < 1 || n_embd != H || hidden.size() != static_cast<size_t>(n) * H || pos0 < 0 ||
      pos0 + n > slot_ctx_ || slot < 0 || slot >= n_slots_)
    return absl::InternalError(absl::StrCat("MtpRows: ", n, " rows at ", pos0, " of slot ", slot,
                                            " with ", hidden.size(), " hidden values"));
  const float eps = cfg_.rms_eps;
  const DLayer& L = mtp_layer_;
  const int R = mtp_rows_max_;
  const int64_t kvw = static_cast<int64_t>(attn_shape_.n_kv) * attn_shape_.hd;
  // Rows [pos0, pos0 + n) replace whatever was there and every later row is dropped (rejected
  // drafts): the mask after n MtpStep calls.
  uint8_t* valid = mtp_valid_ + static_cast<size_t>(slot) * slot_ctx_;
  if (mtp_len_[slot] > pos0)
    DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(valid + pos0, 0, mtp_len_[slot] - pos0, stream_));
  DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(valid + pos0, 1, n, stream_));
  mtp_len_[slot] = pos0 + n;
  KvCacheView kv = kv_base_;
  kv.k = L.kc;
  kv.v = L.vc;
  kv.type = GgmlType::F16;
  // mtp_ints_: [tokens R][slots R][positions R].
  const int32_t* d_tok = mtp_ints_;
  const int32_t* d_slot = mtp_ints_ + R;
  const int32_t* d_pos = mtp_ints_ + 2 * R;
  // Pinned mirrors: the uploads and the two results go without a host sync of their own (one
  // at the end; pageable copies would each block and stage).
  float* h_in = h_mtp_f_;                                      // [R, H]
  float* h_hid = h_mtp_f_ + static_cast<size_t>(R) * H;        // [H]
  float* h_logits = h_hid + H;                                 // [n_vocab]
  int r = 0;
  for (int c0 = 0; c0 < n; c0 += r) {
    r = std::min(R, n - c0);
    const bool last_chunk = c0 + r == n;
    // The mirrors are free at the start of a call (the last one ended in a sync); between
    // chunks the previous uploads must have landed before they are rewritten.
    if (c0 > 0) DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    for (int i = 0; i < r; ++i) {
      h_mtp_ints_[i] = tokens[c0 + i];
      h_mtp_ints_[R + i] = slot;
      h_mtp_ints_[2 * R + i] = pos0 + c0 + i;
    }
    std::memcpy(h_in, hidden.data() + static_cast<size_t>(c0) * H,
                static_cast<size_t>(r) * H * sizeof(float));
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mtp_ints_, h_mtp_ints_, 3ull * R * sizeof(int32_t),
                                            cudaMemcpyHostToDevice, stream_));
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mtp_u_, h_in, static_cast<size_t>(r) * H * sizeof(float),
                                            cudaMemcpyHostToDevice, stream_));

    // cat = [enorm(embed[token]) | hnorm(h)] per row; u = eh_proj · cat.
    InvalidateX();
    DS_RETURN_IF_ERROR(EmbedRows(mtp_embed_.type, mtp_embed_.d, H, d_tok, r, mtp_a_, stream_));
    if (r == 1) {
      DS_RETURN_IF_ERROR(RmsNormRows(mtp_a_, H, nullptr, mtp_enorm_, mtp_cat_, 1, H, eps, stream_));
      DS_RETURN_IF_ERROR(RmsNormRows(mtp_u_, H, nullptr, mtp_hnorm_, mtp_cat_ + H, 1, H, eps, stream_));
    } else {  // the norms write contiguous rows: each half goes into cat's rows by a 2-D copy
      DS_RETURN_IF_ERROR(RmsNormRows(mtp_a_, H, nullptr, mtp_enorm_, mtp_b_, r, H, eps, stream_));
      DS_RETURN_IF_ERROR(CopyColumns(mtp_cat_, 2 * H, mtp_b_, H, H, r));
      DS_RETURN_IF_ERROR(RmsNormRows(mtp_u_, H, nullptr, mtp_hnorm_, mtp_b_, r, H, eps, stream_));
      DS_RETURN_IF_ERROR(CopyColumns(mtp_cat_ + H, 2 * H, mtp_b_, H, H, r));
    }
    DS_RETURN_IF_ERROR(LinearRows(mtp_eh_, mtp_cat_, r, mtp_u_, false));

    // K/V of every row into the MTP plane; the query of the last row only.
    DS_RETURN_IF_ERROR(RmsNormRows(mtp_u_, H, nullptr, L.attn_norm, mtp_a_, r, H, eps, stream_));
    InvalidateX();
    DS_RETURN_IF_ERROR(LinearRows(L.k, mtp_a_, r, mtp_k_, false));
    DS_RETURN_IF_ERROR(LinearRows(L.v, mtp_a_, r, mtp_v_, false));
    QkvPrepArgs pa;
    pa.shape = attn_shape_;
    pa.tok_slot = d_slot;
    pa.tok_pos = d_pos;
    pa.k = mtp_k_;
    pa.v = mtp_v_;
    pa.q_norm = L.q_norm;
    pa.k_norm = L.k_norm;
    pa.kv = kv;
    const int kv_only = last_chunk ? r - 1 : r;
    if (kv_only > 0) {
      // No query heads: QkvPrep then only norms / ropes / stores the K/V heads of these rows.
      QkvPrepArgs ka = pa;
      ka.shape.n_head = 0;
      ka.T = kv_only;
      DS_RETURN_IF_ERROR(QkvPrep(ka, stream_));
    }
    if (!last_chunk) continue;
    const int i = r - 1;
    DS_RETURN_IF_ERROR(LinearRows(L.q, mtp_a_ + static_cast<int64_t>(i) * H, 1, mtp_qg_, false));
    pa.T = 1;
    pa.tok_slot = d_slot + i;
    pa.tok_pos = d_pos + i;
    pa.k = mtp_k_ + i * kvw;
    pa.v = mtp_v_ + i * kvw;
    pa.qg = mtp_qg_;
    pa.q_out = mtp_q_;
    DS_RETURN_IF_ERROR(QkvPrep(pa, stream_));
  }
  float* u = mtp_u_ + static_cast<int64_t>(r - 1) * H;  // the last row's residual
  const int32_t pos = pos0 + n - 1;

  // u += GatedAttention(attn_norm(u)) over the slot's valid MTP rows [0, pos].
  MaskedAttnArgs ma;
  ma.shape = attn_shape_;
  ma.slot = slot;
  ma.pos = pos;
  ma.q = mtp_q_;
  ma.qg = mtp_qg_;
  ma.kv = kv;
  ma.valid = valid;
  ma.n_splits = MaskedAttnSplits(pos, MtpAttnSplits());
  ma.partials = mtp_parts_;
  ma.out = mtp_o_;
  DS_RETURN_IF_ERROR(MaskedAttnDecode(ma, stream_));
  InvalidateX();
  DS_RETURN_IF_ERROR(LinearRows(L.o, mtp_o_, 1, u, true));

  // u += MLP(post_norm(u)).
  DS_RETURN_IF_ERROR(RmsNormRows(u, H, nullptr, L.post_norm, mtp_a_, 1, H, eps, stream_));
  InvalidateX();
  const int n_ff = L.ffn_gate.rows;
  DS_RETURN_IF_ERROR(LinearRows(L.ffn_gate, mtp_a_, 1, mtp_ff_, false));
  DS_RETURN_IF_ERROR(LinearRows(L.ffn_up, mtp_a_, 1, mtp_ff_ + n_ff, false));
  DS_RETURN_IF_ERROR(SiluMul(mtp_ff_, mtp_ff_ + n_ff, mtp_ff_, n_ff, stream_));
  InvalidateX();
  DS_RETURN_IF_ERROR(LinearRows(L.ffn_down, mtp_ff_, 1, u, true));

  // h' = shared_head_norm(u); logits = head · h'.
  DS_RETURN_IF_ERROR(RmsNormRows(u, H, nullptr, mtp_norm_, mtp_hid_, 1, H, eps, stream_));
  InvalidateX();
  DS_RETURN_IF_ERROR(LinearRows(mtp_head_, mtp_hid_, 1, mtp_logits_, false));
  InvalidateX();
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

}  // namespace ds::cuda
