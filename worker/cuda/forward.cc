// CudaDevice (cuda_device.h): one micro-step — its index arrays, the embedding, the layers, the
// head — and the decode graphs that replay it.
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/collective/collective.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/norm.cuh"
#include "worker/cuda/cuda_device.h"

namespace ds::cuda {

int CudaDevice::AttnSplits(int n_dec) const {
  const int want = std::max(1, 2 * sm_count_ / std::max(1, attn_shape_.n_kv * n_dec));
  return std::min(want, std::max(1, (slot_ctx_ + 255) / 256));
}

absl::Status CudaDevice::Prepare(const MicroStep& step) {
  rows_ = step.rows();
  n_logit_rows_ = step.n_logit_rows();
  if (rows_ > T_max_ || n_logit_rows_ > logit_rows_max_)
    return absl::InvalidArgumentError(absl::StrCat("CUDA micro-step of ", rows_, " rows / ",
                                                   n_logit_rows_, " logit rows exceeds ", T_max_,
                                                   " / ", logit_rows_max_));
  // Host index arrays (pinned), row for row the layout of d_ints_ (cuda_device.h): token rows,
  // then the decode rows wave by wave, the GDN state indices and runs, the logit rows.
  int32_t* ids = h_ints_;
  int32_t* tslot = h_ints_ + T_max_;
  int32_t* tpos = h_ints_ + 2 * T_max_;
  int32_t* drow = h_ints_ + 3 * T_max_;
  int32_t* dslot = h_ints_ + 4 * T_max_;
  int32_t* dpos = h_ints_ + 5 * T_max_;
  int32_t* lrows = h_ints_ + kLogitRowsRow * T_max_;
  std::copy(step.ids.begin(), step.ids.end(), ids);
  std::copy(step.slots.begin(), step.slots.end(), tslot);
  std::copy(step.positions.begin(), step.positions.end(), tpos);
  std::copy(step.logit_rows.begin(), step.logit_rows.end(), lrows);
  n_dec_ = 0;
  int dec_runs = 0, longest = 0;
  prefill_.clear();
  waves_.clear();
  for (const RowRun& r : step.runs) {
    if (r.decode_like()) {
      ++dec_runs;
      longest = std::max(longest, r.n);
    } else {
      prefill_.push_back(r);
    }
  }
  // Speculative runs (RowRun::spec_entry): the GDN state indices each decode row reads and
  // writes (cuda_device.h), rows 6 and 7.
  int32_t* gdn_out = h_ints_ + 6 * T_max_;
  int32_t* gdn_in = h_ints_ + 7 * T_max_;
  spec_step_ = false;
  for (const RowRun& r : step.runs) {
    if (r.spec_entry < 0) continue;
    if (!r.decode_like() || r.spec_entry + r.n > n_spec_entries_)
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA micro-step: speculative run of ", r.n, " tokens at entry ", r.spec_entry,
          " (decode path: ", r.decode_like(), ") exceeds the ", n_spec_entries_, " entries"));
    spec_step_ = true;
  }
  // Decode entries: the GDN state indices a row reads and writes (speculative steps).
  auto entry = [&](const RowRun& r, int w) {
    drow[n_dec_] = r.row0 + w;
    dslot[n_dec_] = r.slot;
    dpos[n_dec_] = r.pos0 + w;
    if (spec_step_) {
      int32_t in = r.slot, out = r.slot;
      if (r.spec_entry >= 0) {
        out = n_slots_ + r.spec_entry + w;
        if (w > 0) {
          in = out - 1;
        } else if (spec_last_[r.slot] == out - 1 && spec_last_pos_[r.slot] == r.pos0 - 1) {
          in = out - 1;  // the run continues one cut off at the previous micro-step's end
        }
      }
      gdn_out[n_dec_] = out;
      gdn_in[n_dec_] = in;
    }
    ++n_dec_;
  };
  // GDN runs (GdnDecodeArgs::run_first): when every decode run of several tokens is
  // speculative (an MTP verify), each run's tokens go through one block per head in order, the
  // state read once; their outputs are entries, never the input, so no block can overwrite what
  // another still reads. Otherwise (a decode-path replay updates its slot in place) the rows go
  // in waves, one launch per token index.
  gdn_runs_ = longest > 1 && copts_.gdn_decode_runs;
  for (const RowRun& r : step.runs)
    if (r.decode_like() && r.n > 1 && r.spec_entry < 0) gdn_runs_ = false;
  n_gdn_runs_ = 0;
  if (gdn_runs_) {
    int32_t* run_first = h_ints_ + 8 * T_max_;
    int32_t* run_len = h_ints_ + 9 * T_max_;
    for (const RowRun& r : step.runs) {
      if (!r.decode_like()) continue;
      run_first[n_gdn_runs_] = n_dec_;
      run_len[n_gdn_runs_] = r.n;
      ++n_gdn_runs_;
      for (int w = 0; w < r.n; ++w) entry(r, w);
    }
  } else {
    for (int w = 0; w < longest; ++w) {
      const int first = n_dec_;
      for (const RowRun& r : step.runs)
        if (r.decode_like() && r.n > w) entry(r, w);
      waves_.push_back({first, n_dec_ - first});
    }
  }
  for (const RowRun& r : step.runs)
    if (r.spec_entry >= 0) {
      spec_last_[r.slot] = n_slots_ + r.spec_entry + r.n - 1;
      spec_last_pos_[r.slot] = r.pos0 + r.n - 1;
    }
  // Batch-invariant: the split length of a decode row's attention depends on its own length
  // only (the split count of a lone sequence; later splits exit early), not on how many rows
  // share the launch.
  if (n_dec_ > limits_.max_decode_rows)
    return absl::InvalidArgumentError(absl::StrCat("CUDA micro-step of ", n_dec_,
                                                   " decode rows exceeds ",
                                                   limits_.max_decode_rows));
  n_splits_ = copts_.batch_invariant ? AttnSplits(1) : AttnSplits(std::max(1, dec_runs));
  PlanRowSegments(step);
  residual_reduced_ = false;
  // Deferred drafts (SeqStep::chain_drafts): their rows' ids name where the chain left them
  // (EmbedRows' chain_ids reads chain_drafts_ at run time) over the placeholders of the step.
  for (const MicroStep::ChainTokens& c : step.chain_tokens) {
    if (!has_mtp_ || c.slot < 0 || c.slot >= n_slots_ || c.first < 0 || c.n < 1 ||
        c.first + c.n > kMtpChainMax || c.row < 0 || c.row + c.n > rows_)
      return absl::InternalError(absl::StrCat("CUDA micro-step: chain tokens at row ", c.row,
                                              " (slot ", c.slot, ", drafts ", c.first, "+", c.n,
                                              ")"));
    verify_half_[c.slot] = chain_half_[c.slot];
    const int64_t at = ChainRow(c.slot, chain_half_[c.slot]) + c.first;
    for (int i = 0; i < c.n; ++i) ids[c.row + i] = -static_cast<int32_t>(1 + at + i);
  }
  // Every index array in one copy: the used head of each of the kIntRows rows (one 2-D copy,
  // not one per array: on the demo model's MTP cycle each small copy cost ~3-7 us of the
  // device's time between the draft chain and the verify, docs/perf/h200.md). Rows this step
  // does not use (the GDN indices of a plain step) go along stale and are not read.
  // After a Finish and a deferred draft chain it goes beside that chain (which reads none of
  // these arrays): the verify after it then starts when the chain ends (BeginSideCopies).
  const int width = std::max({rows_, n_dec_, n_logit_rows_, n_gdn_runs_, 1});
  DS_ASSIGN_OR_RETURN(cudaStream_t s, BeginSideCopies());
  step_in_flight_ = true;
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(d_ints_, T_max_ * 4ull, h_ints_, T_max_ * 4ull,
                                            width * 4ull, kIntRows, cudaMemcpyHostToDevice, s));
  return EndSideCopies(s);
}

absl::Status CudaDevice::RunCaptured(const MicroStep& step,
                                     const std::function<absl::Status()>& body) {
  // Every argument that changes between steps of one shape (ids, slots, positions, logit rows,
  // speculative state indices) is in the index arrays Prepare uploaded, so one graph per shape
  // serves every step of that shape: plain decodes per row count, and the verify steps of MTP
  // (k + 1 decode-path rows per sequence, their GDN writing speculative entries). A collective
  // that cannot be captured (the host-staged one) keeps every step eager.
  if (coll_ && !coll_->graph_capturable()) return body();
  step.ShapeKey(&shape_key_);  // a member: no allocation per decode step
  return step_graphs_.Run(shape_key_, body);
}

absl::Status CudaDevice::GraphCache::Run(const Key& key, const std::function<absl::Status()>& body) {
  if (!dev->copts_.use_graphs || dev->profiling_) return body();
  auto it = graphs.find(key);
  if (it == graphs.end()) {
    // The first call of a shape runs eagerly so that lazy library state (cuBLAS workspaces for
    // the R > gemv_max_rows path) exists before capture, and a shape seen once (a rare replay)
    // costs no capture; the second one captures. Past kMaxGraphs shapes new ones stay eager.
    if (failed.count(key) || graphs.size() >= kMaxGraphs) return body();
    if (runs.size() >= 16 * kMaxGraphs) runs.clear();  // bounded bookkeeping
    if (runs[key]++ == 0) return body();
    cudaGraph_t g = nullptr;
    DS_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(dev->stream_, cudaStreamCaptureModeThreadLocal));
    absl::Status st = body();
    cudaError_t e = cudaStreamEndCapture(dev->stream_, &g);
    cudaGraphExec_t exec = nullptr;
    if (st.ok() && e == cudaSuccess && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess) {
      it = graphs.emplace(key, exec).first;
      runs.erase(key);
    } else {
      std::fprintf(stderr, "cuda backend: graph capture of %s failed (%s); running eagerly\n",
                   what, st.ok() ? cudaGetErrorString(e) : st.ToString().c_str());
      cudaGetLastError();
      failed.insert(key);
    }
    if (g) cudaGraphDestroy(g);
    if (it == graphs.end()) return body();
  }
  DS_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, dev->stream_));
  return absl::OkStatus();
}

void CudaDevice::GraphCache::Clear() {
  for (auto& [k, g] : graphs) cudaGraphExecDestroy(g);
  graphs.clear();
}

absl::Status CudaDevice::Embed() {
  InvalidateX();
  ProfBegin("embed");
  DS_RETURN_IF_ERROR(EmbedRows(token_embd_.type, token_embd_.d, cfg_.n_embd, d_ints_, rows_, h_,
                               stream_, embd_v0_, embd_v1_, has_mtp_ ? chain_drafts_ : nullptr));
  ProfEnd();
  // Vocab-parallel under TP: other ranks' tokens came out as zero rows; the all-reduce (inside
  // the decode graph like the layers' two) gives every rank the whole embedding, exactly.
  a_normed_for_ = -1;
  if (tp_world_ > 1) {
    bool normed = false;
    DS_RETURN_IF_ERROR(AllReduceResidualFusedNorm(
        layers_.empty() ? nullptr : layers_[0].attn_norm, rows_, &normed));
    if (normed) a_normed_for_ = 0;
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::GdnMixer(const DLayer& L, int R) {
  const GdnShape& s = gdn_shape_;
  const int C = s.channels(), Vw = s.v_heads * s.v_dim;
  // When every row of the step is a decode row, the decode kernel writes the int8 copy of its
  // output for ssm_out (QuantizeActivations' bits: no launch of its own), unless ssm_out takes
  // the f16 kernel at this width (F16Columns), which reads f16 activations instead.
  const bool quant_in_kernel = copts_.fuse_gdn_decode && prefill_.empty() && R <= QuantRows() &&
                               s.v_dim % 32 == 0 && !F16Columns(L.ssm_out, R);
  ProfBegin("gdn_proj");
  DS_RETURN_IF_ERROR(LinearMulti({{&L.qkv, mixed_}, {&L.gate, z_}}, a_, R));
  DS_RETURN_IF_ERROR(LinearMulti({{&L.beta, gb_}, {&L.alpha, ga_}}, a_, R));
  ProfEnd();
  ProfBegin("gdn_core");
  // The decode rows: in runs (every multi-token run speculative: one launch, a block per (head,
  // run)), else in waves in order (the w-th token of a decode_path run follows its (w-1)-th).
  GdnDecodeArgs d;
  d.shape = s;
  d.p = L.gdn;
  d.mixed = mixed_;
  d.z = z_;
  d.b = gb_;
  d.alpha = ga_;
  d.conv_ring = L.ring;
  d.state = L.state;
  d.state_bf16 = copts_.gdn_state_bf16;
  d.out = mix_out_;
  d.early = early_launch_;
  d.bulk_state = gdn_bulk_state_;
  // Only the layer's first decode launch may ask for its states before the wait: the kernel
  // ahead of it (the beta / alpha projection) writes none, but each later launch (the next wave
  // of a decode_path run) reads the states the launch just before it is still writing.
  // batch_invariance_test's replay rows 1.. caught that on an H100 (2026-12-07).
  d.state_early = early_launch_ && copts_.gdn_state_early;
  d.spread_run_tokens = copts_.gdn_spread_run_tokens;
  d.one_group_runs = copts_.gdn_one_group_runs;
  if (quant_in_kernel) {
    d.xq = xq_;
    d.xd = xd_;
    d.xsum = R == 1 ? xsum_ : nullptr;  // EnsureQuantized's rule: sums for one-row steps
  }
  if (gdn_runs_) {
    GdnDecodeArgs a = d;
    a.n_seqs = n_gdn_runs_;
    a.run_first = GdnRunFirst();
    a.run_len = GdnRunLen();
    a.rows = DecodeRows();
    a.slots = GdnOut();
    a.in_slots = GdnIn();
    a.pos = DecodePositions();
    DS_RETURN_IF_ERROR(GdnDecode(a, stream_));
    d.state_early = false;
  }
  for (const DecodeWave& wave : waves_) {
    GdnDecodeArgs a = d;
    a.n_seqs = wave.n;
    a.rows = DecodeRows() + wave.first;
    a.slots = (spec_step_ ? GdnOut() : DecodeSlots()) + wave.first;
    a.in_slots = spec_step_ ? GdnIn() + wave.first : nullptr;
    a.pos = DecodePositions() + wave.first;
    DS_RETURN_IF_ERROR(GdnDecode(a, stream_));
    d.state_early = false;
  }
  for (const RowRun& p : prefill_) {
    GdnPrefillArgs a;
    a.shape = s;
    a.p = L.gdn;
    a.T = p.n;
    a.slot = p.slot;
    a.pos0 = p.pos0;
    a.mixed = mixed_ + static_cast<int64_t>(p.row0) * C;
    a.z = z_ + static_cast<int64_t>(p.row0) * Vw;
    a.b = gb_ + static_cast<int64_t>(p.row0) * s.v_heads;
    a.alpha = ga_ + static_cast<int64_t>(p.row0) * s.v_heads;
    a.conv_ring = L.ring;
    a.state = L.state;
    a.state_bf16 = copts_.gdn_state_bf16;
    a.y = gy_;
    a.g = gg_;
    a.beta = gbeta_;
    a.wy = gwy_;
    a.out = mix_out_ + static_cast<int64_t>(p.row0) * Vw;
    a.chunk = p.n >= copts_.gdn_chunk_min ? kGdnChunk : 0;
    a.scan_mma = gdn_scan_mma_;
    DS_RETURN_IF_ERROR(GdnPrefill(a, stream_));
  }
  ProfEnd();
  ProfBegin("gdn_proj");
  InvalidateX();
  if (quant_in_kernel) NoteQuantized(mix_out_, R, /*sums=*/R == 1);
  DS_RETURN_IF_ERROR(ProjectToResidual(L.ssm_out, mix_out_, R));
  ProfEnd();
  return absl::OkStatus();
}

absl::Status CudaDevice::AttnMixer(const DLayer& L, int R) {
  const AttnShape& s = attn_shape_;
  ProfBegin("attn_proj");
  DS_RETURN_IF_ERROR(LinearMulti({{&L.q, mixed_}, {&L.k, kx_}, {&L.v, vx_}}, a_, R));
  ProfEnd();
  ProfBegin("attn_core");
  KvCacheView kv = kv_base_;
  kv.k = L.kc;
  kv.v = L.vc;
  QkvPrepArgs pa;
  pa.shape = s;
  pa.T = R;
  pa.tok_slot = TokenSlots();
  pa.tok_pos = TokenPositions();
  pa.qg = mixed_;
  pa.k = kx_;
  pa.v = vx_;
  pa.q_norm = L.q_norm;
  pa.k_norm = L.k_norm;
  pa.q_out = q_;
  pa.q16 = prefill_.empty() ? nullptr : q16_;
  pa.kv = kv;
  pa.early = early_launch_;
  DS_RETURN_IF_ERROR(QkvPrep(pa, stream_));
  if (n_dec_ > 0) {
    AttnDecodeArgs a;
    a.shape = s;
    a.n_seqs = n_dec_;
    a.rows = DecodeRows();
    a.slots = DecodeSlots();
    a.pos = DecodePositions();
    a.q = q_;
    a.qg = mixed_;
    a.kv = kv;
    a.n_splits = n_splits_;
    a.partials = partials_;
    a.out = mix_out_;
    a.tensor_cores = attn_tensor_cores_;
    a.early = early_launch_;
    DS_RETURN_IF_ERROR(AttnDecode(a, stream_));
  }
  const int64_t ow = static_cast<int64_t>(s.n_head) * s.hd, qgw = 2 * ow;
  for (const RowRun& p : prefill_) {
    AttnPrefillArgs a;
    a.shape = s;
    a.T = p.n;
    a.pos0 = p.pos0;
    a.slot = p.slot;
    a.q16 = q16_ + p.row0 * ow;
    a.qg = mixed_ + p.row0 * qgw;
    a.kv = kv;
    a.k_tmp = kt_;
    a.v_tmp = vt_;
    a.scores = scores_;
    a.probs = probs_;
    a.tq = attn_tq_;
    a.out = mix_out_ + p.row0 * ow;
    a.tensor_cores = attn_prefill_tensor_cores_;
    a.wgmma = attn_prefill_wgmma_;
    DS_RETURN_IF_ERROR(AttnPrefill(a, gemm_.get(), stream_));
  }
  ProfEnd();
  ProfBegin("attn_proj");
  InvalidateX();
  DS_RETURN_IF_ERROR(ProjectToResidual(L.o, mix_out_, R));
  ProfEnd();
  return absl::OkStatus();
}

absl::Status CudaDevice::Layer(int layer) {
  const DLayer& L = layers_[layer];
  const int R = rows_;
  if (a_normed_for_ != layer) {  // else the all-reduce before this layer left the norm in a_
    ProfBegin("norm");
    DS_RETURN_IF_ERROR(NormToA(L.attn_norm, R));
    ProfEnd();
  }
  a_normed_for_ = -1;
  if ((L.rec && gdn_shape_.k_heads == 0) || (!L.rec && attn_shape_.n_kv == 0))
    DS_RETURN_IF_ERROR(ContributeNothing(R));  // TP rank without heads of this mixer
  else if (L.rec)
    DS_RETURN_IF_ERROR(GdnMixer(L, R));
  else
    DS_RETURN_IF_ERROR(AttnMixer(L, R));
  bool normed = false;
  DS_RETURN_IF_ERROR(AllReduceResidualFusedNorm(L.post_norm, R, &normed));
  if (!normed) {
    ProfBegin("norm");
    DS_RETURN_IF_ERROR(NormToA(L.post_norm, R));
    ProfEnd();
  }
  ProfBegin("ffn");
  if (L.ffn_gate.rows == 0) {  // TP rank without FFN columns
    DS_RETURN_IF_ERROR(ContributeNothing(R));
  } else {
    DS_RETURN_IF_ERROR(LinearSiluPair(L.ffn_gate, L.ffn_up, a_, R, ffa_));
    InvalidateX();
    DS_RETURN_IF_ERROR(ProjectToResidual(L.ffn_down, ffa_, R));
  }
  ProfEnd();
  const float* next_norm =
      layer + 1 < static_cast<int>(layers_.size()) ? layers_[layer + 1].attn_norm : nullptr;
  DS_RETURN_IF_ERROR(AllReduceResidualFusedNorm(next_norm, R, &normed));
  if (normed) a_normed_for_ = layer + 1;
  return absl::OkStatus();
}

bool CudaDevice::OverlapStep() const {
  // Not in profiling passes (their per-class times need one stream) nor in decode steps: the
  // next matmul needs the reduced rows at once, and decode-only steps are graph-captured.
  return copts_.overlap_allreduce && coll_ && tp_world_ > 1 && !profiling_ && !prefill_.empty() &&
         rows_ >= copts_.overlap_min_rows;
}

absl::Status CudaDevice::ProjectToResidual(const DMat& w, const float* x, int R) {
  if (!OverlapStep()) return Linear(w, x, R, h_, ResidualOnThisRank());
  return LinearOverlapReduce(w, x, R);
}

absl::Status CudaDevice::AllReduceResidualFusedNorm(const float* w, int R, bool* normed) {
  *normed = false;
  if (residual_reduced_) {
    // ProjectToResidual reduced h_ chunk by chunk on comm_: what follows waits for all of it
    // (the fused norm is for decode-sized steps; here the norm runs on its own after this).
    residual_reduced_ = false;
    DS_CUDA_RETURN_IF_ERROR(cudaEventRecord(comm_.join, comm_.s));
    DS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, comm_.join, 0));
    return absl::OkStatus();
  }
  if (!coll_) return absl::OkStatus();
  if (w && copts_.fuse_allreduce_norm) {
    const int H = cfg_.n_embd;
    Collective::FusedNormArgs a;
    a.h = h_;
    a.rows = R;
    a.n = H;
    a.w = w;
    a.eps = cfg_.rms_eps;
    a.out = a_;
    // The int8 copy of a_ the column kernels read, as NormToA makes it for GEMV-sized steps.
    if (R <= QuantRows() && H % 32 == 0) {
      a.xq = xq_;
      a.xd = xd_;
    }
    InvalidateX();
    ProfBegin("allreduce");
    absl::Status st = coll_->AllReduceRmsNormOnStream(a, stream_);
    ProfEnd();
    if (st.ok()) {
      if (a.xq) NoteQuantized(a_, R, /*sums=*/false);
      *normed = true;
      return st;
    }
    if (!absl::IsUnimplemented(st)) return st;
  }
  return AllReduceResidual(R);
}

absl::Status CudaDevice::AllReduceResidual(int R) {
  if (!coll_) return absl::OkStatus();
  // Enqueued on stream_ after the projection, no host sync: it orders like a kernel and is
  // captured into the decode graphs like one (the first decode-only step of a shape runs
  // eagerly, so NCCL's lazy connection setup never happens during capture).
  ProfBegin("allreduce");
  absl::Status st =
      coll_->AllReduceSumOnStream(h_, static_cast<size_t>(R) * cfg_.n_embd, stream_);
  ProfEnd();
  return st;
}

absl::Status CudaDevice::ContributeNothing(int R) {
  InvalidateX();
  if (!ResidualOnThisRank())
    DS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(h_, 0, static_cast<size_t>(R) * cfg_.n_embd * sizeof(float), stream_));
  if (!OverlapStep()) return absl::OkStatus();
  // The peers reduce this step piece by piece (ProjectToResidual): the same pieces here.
  DS_RETURN_IF_ERROR(BeginOverlapReduce());
  DS_RETURN_IF_ERROR(ReduceRowsDone(0, R));
  return EndOverlapReduce();
}

absl::Status CudaDevice::Head() {
  // Leading micro-steps of a long prefill produce no logits: nothing to do (and a zero-row launch
  // is an invalid configuration).
  if (n_logit_rows_ == 0) return absl::OkStatus();
  ProfBegin("lm_head");
  DS_RETURN_IF_ERROR(RmsNormRows(h_, cfg_.n_embd, LogitRows(), output_norm_, hn_, n_logit_rows_,
                                 cfg_.n_embd, cfg_.rms_eps, stream_, early_launch_));
  InvalidateX();
  // Under TP with the lm_head on rank 0 only, the other ranks hold no rows of it.
  if (n_vocab_local_ > 0)
    DS_RETURN_IF_ERROR(
        LinearRows(output_, hn_, n_logit_rows_, VocabParallel() ? logits_part_ : logits_, false,
                   /*prefill_rows=*/!prefill_.empty()));
  ProfEnd();
  return absl::OkStatus();
}

}  // namespace ds::cuda
