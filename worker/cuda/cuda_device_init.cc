// CudaDevice (cuda_device.h): the memory plan, the allocations and the weight upload.
#include <algorithm>
#include <set>
#include <cstring>

#include "absl/strings/str_format.h"
#include "common/collective/collective.h"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_prefill_mma.cuh"
#include "kernels/cuda/attention_prefill_wgmma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/draft_head.cuh"
#include "kernels/cuda/gemm_fp8.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/mtp_attention.cuh"
#include "worker/cuda/cuda_device.h"
#include "worker/cuda/slot_bytes.h"
#include "worker/model/kv_type.h"
#include "worker/runner/dense_weights_plan.h"

namespace ds {

std::string CudaMemoryPlan::ToString() const {
  auto gib = [](uint64_t b) { return static_cast<double>(b) / (1ull << 30); };
  return absl::StrFormat("weights %.2f GiB + KV pool %.2f GiB (%d tokens) + recurrent state "
                         "%.2f GiB + workspace %.2f GiB = %.2f GiB; dense weights %s",
                         gib(weights), gib(kv_cache), plan.pool_tokens(), gib(recurrent),
                         gib(workspace), gib(total()), dense_choice);
}

namespace cuda {
namespace {

constexpr uint64_t kAlign = 256;
uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// prefill_fp8: the transient bf16 rows of a matrix on their way to its e4m3 copy.
constexpr uint64_t kFp8TempBytes = 64ull << 20;

// Bump allocator over one cudaMalloc.
struct Arena {
  uint8_t* base = nullptr;
  uint64_t size = 0, used = 0;
  template <typename T>
  T* Take(uint64_t count) {
    T* p = reinterpret_cast<T*>(base + used);
    used += AlignUp(count * sizeof(T));
    return p;
  }
};

}  // namespace

CudaDevice::~CudaDevice() {
  step_graphs_.Clear();
  chain_graphs_.Clear();
  for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
  if (h_ints_) cudaFreeHost(h_ints_);
  if (h_chain_ints_) cudaFreeHost(h_chain_ints_);
  if (h_chain_drafts_) cudaFreeHost(h_chain_drafts_);
  if (sampled_) cudaEventDestroy(sampled_);
  if (h_tokens_) cudaFreeHost(h_tokens_);
  for (cudaEvent_t e : chain_mirror_read_)
    if (e) cudaEventDestroy(e);
  cudaFree(weights_mem_);
  cudaFree(state_mem_);
  cudaFree(work_mem_);
  if (stream_) cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(
    const gguf::File& file, const ModelConfig& cfg, const TpPlacement& tp, int device,
    int n_slots, int slot_ctx, const CudaBackendOptions& copts) {
  std::unique_ptr<CudaDevice> d(new CudaDevice());
  DS_RETURN_IF_ERROR(d->Init(file, cfg, tp, device, n_slots, slot_ctx, copts));
  return d;
}

absl::Status CudaDevice::Init(const gguf::File& file, const ModelConfig& cfg,
                              const TpPlacement& tp, int device, int n_slots, int slot_ctx,
                              const CudaBackendOptions& copts) {
  // Tensor parallelism (docs/tp.md): with tp.world > 1 only this rank's shard is uploaded (the
  // runner's plan) and the residual is all-reduced over the collective on the stream.
  if (tp.collective) {
    if (!tp.collective->supports_stream_ordered())
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA backend: collective ", tp.collective->name(),
          " cannot reduce device buffers on a stream (use nccl, or gloo through "
          "HostStagedCollective)"));
    coll_ = tp.collective;
  }
  tp_rank_ = tp.rank;
  tp_world_ = tp.world;
  vocab_parallel_ = tp.world > 1 && tp.plan.lm_head == tp::LmHead::kVocabParallel;
  if (tp.world > 1) {  // vocab-parallel embedding (ModelWeights::Load cut token_embd the same way)
    tp_plan_ = tp.plan;
    embd_v0_ = tp.plan.ranks[tp.rank].vocab.begin;
    embd_v1_ = tp.plan.ranks[tp.rank].vocab.end;
  }
  copts_ = copts;
  if (!KvTypeSupported(copts_.kv_type))
    return absl::InvalidArgumentError(absl::StrCat("CUDA backend: KV type ",
                                                   KvTypeName(copts_.kv_type),
                                                   " (expected f16, q8_0 or q4_0)"));
  device_ = device;
  n_slots_ = n_slots;
  slot_ctx_ = slot_ctx;
  cfg_ = cfg;
  DS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaDeviceProp prop;
  DS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
  // The portable path (cuda_options.h): all there is below sm_80; on newer GPUs on request.
  portable_ = copts_.portable || prop.major < 8;
  bf16_ = !portable_;
  sm_count_ = std::max(1, prop.multiProcessorCount);

  const ModelConfig& c = cfg_;
  // Local sizes: this rank's heads, FFN columns and vocabulary rows (all of them without TP).
  // State and KV stay with the heads that own them; local GDN value heads keep the tiled order,
  // so the unchanged kernels run on the shard (worker/tp/plan.h).
  const LocalShape lc = tp.Local(c);
  const int n_head = lc.n_head, n_kv = lc.n_head_kv, gdn_k = lc.gdn_k_heads, gdn_v = lc.gdn_v_heads;
  n_vocab_local_ = static_cast<int>(lc.n_vocab);
  ModelWeights mw;
  if (tp.world > 1) {
    DS_ASSIGN_OR_RETURN(mw, ModelWeights::Load(file, c, &tp.plan, tp.rank));
  } else {
    DS_ASSIGN_OR_RETURN(mw, ModelWeights::Load(file, c));
  }
  gdn_shape_ = GdnShape{gdn_k, gdn_v, c.gdn_k_dim, c.gdn_v_dim, c.conv_kernel};
  if (c.n_recurrent() > 0 && gdn_k > 0) DS_RETURN_IF_ERROR(GdnShapeSupported(gdn_shape_));
  attn_shape_ = AttnShape{n_head, n_kv, c.head_dim, c.n_rot, c.rope_base, c.rms_eps};
  attn_tensor_cores_ = copts_.attn_tensor_cores && !portable_ && AttnDecodeMmaSupports(attn_shape_);
  attn_prefill_tensor_cores_ =
      copts_.attn_tensor_cores && !portable_ && AttnPrefillMmaSupports(attn_shape_);
  gdn_scan_mma_ = copts_.gdn_scan_mma && !portable_;  // portable_ covers compute capability < 8.0
  gdn_bulk_state_ = copts_.gdn_bulk_state && !portable_ && GdnBulkStateAvailable();
  attn_prefill_wgmma_ = copts_.attn_tensor_cores && copts_.attn_prefill_wgmma && !portable_ &&
                        c.n_attention() > 0 && AttnPrefillWgmmaSupports(attn_shape_) &&
                        AttnPrefillWgmmaAvailable();
  if (c.n_attention() > 0 && (c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256))
    return absl::UnimplementedError(absl::StrCat("CUDA backend: head_dim ", c.head_dim, " not in {32,64,128,256}"));
  // Bytes of one token's K (or V) row over all KV heads: hd/32 blocks per head for q8_0 / q4_0.
  kv_token_bytes_ = static_cast<uint64_t>(n_kv) * KvRowBytes(copts_.kv_type, c.head_dim);

  // ---- memory plan (before any allocation) ----
  std::vector<std::pair<std::string, const cpu::WeightView*>> mats;
  auto add_mat = [&](const std::string& n, const cpu::WeightView& w) { mats.push_back({n, &w}); };
  add_mat("token_embd", mw.token_embd);
  add_mat("output", mw.output);
  uint64_t small_floats = c.n_embd;  // output_norm
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = mw.layers[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    small_floats += 2 * c.n_embd;
    if (L.recurrent) {
      add_mat(p + "attn_qkv", L.gdn.qkv);
      add_mat(p + "attn_gate", L.gdn.gate);
      add_mat(p + "ssm_beta", L.gdn.beta);
      add_mat(p + "ssm_alpha", L.gdn.alpha);
      add_mat(p + "ssm_out", L.gdn.out);
      small_floats += L.gdn.conv.size() + L.gdn.ssm_a.size() + L.gdn.dt_bias.size() + L.gdn.norm.size() + 64;
    } else {
      add_mat(p + "attn_q", L.attn.q);
      add_mat(p + "attn_k", L.attn.k);
      add_mat(p + "attn_v", L.attn.v);
      add_mat(p + "attn_output", L.attn.out);
      small_floats += L.attn.q_norm.size() + L.attn.k_norm.size() + 64;
    }
    add_mat(p + "ffn_gate", L.ffn_gate);
    add_mat(p + "ffn_up", L.ffn_up);
    add_mat(p + "ffn_down", L.ffn_down);
  }
  // The MTP block (spec §8.2) when speculative steps are asked for; under TP this rank's cut of
  // it (docs/tp.md §10), with the vocab-parallel head only (the runner refuses MTP with the
  // lm_head on rank 0). Its embedding and head are the model's unless the file has its own
  // (nextn.embed_tokens / nextn.shared_head_head).
  has_mtp_ = copts_.spec_tokens > 0 && mw.has_mtp && (tp.world == 1 || vocab_parallel_);
  const bool mtp_own_embed = has_mtp_ && mw.mtp.embed.data != mw.token_embd.data;
  const bool mtp_own_head = has_mtp_ && mw.mtp.head.data != mw.output.data;
  if (has_mtp_) {
    const LayerWeights& L = mw.mtp.layer;
    add_mat("mtp.eh_proj", mw.mtp.eh_proj);
    add_mat("mtp.attn_q", L.attn.q);
    add_mat("mtp.attn_k", L.attn.k);
    add_mat("mtp.attn_v", L.attn.v);
    add_mat("mtp.attn_output", L.attn.out);
    add_mat("mtp.ffn_gate", L.ffn_gate);
    add_mat("mtp.ffn_up", L.ffn_up);
    add_mat("mtp.ffn_down", L.ffn_down);
    if (mtp_own_embed) add_mat("mtp.embed", mw.mtp.embed);
    if (mtp_own_head) add_mat("mtp.head", mw.mtp.head);
    // enorm, hnorm, shared_head_norm, attn_norm, post_norm, q_norm, k_norm (+ alignment).
    small_floats += 5ull * c.n_embd + L.attn.q_norm.size() + L.attn.k_norm.size() + 7 * 64;
  }
  uint64_t max_mat_elems = 0;
  tiled_ = copts_.tiled && !portable_ && TiledAvailable(device_);
  early_launch_ = tiled_ && copts_.early_launch && prop.major >= 9;
  // With dense weights on (not auto), steps past tiled_max_rows rows take the 16-bit GEMM, not
  // MMQ or the f16 kernel.
  const bool dense_on = copts_.dense_weights == DenseWeights::kOn;
  tiled_max_rows_ = tiled_ ? std::clamp((copts_.int8_mmq || copts_.f16_mma) && !dense_on
                                            ? std::max(copts_.tiled_max_rows, copts_.mmq_max_rows)
                                            : copts_.tiled_max_rows,
                                        0, kTiledMaxCols)
                           : 0;
  // Dense weights: the trunk's quantized matrices (not the embedding, the lm_head or the MTP
  // block, which only ever see a few rows); whether they are made is decided with the memory plan
  // below (kAuto), and the set emptied when not.
  std::set<const cpu::WeightView*> dense_mats;
  // prefill_fp8: the copies are e4m3 (1 byte per weight and a few block scales) for the matrices
  // of whole 128 x 128 blocks, 16-bit for the others; where cuBLASLt has no block-scaled product
  // the option is dropped with a note.
  bool fp8_on = copts_.prefill_fp8 && !portable_ && copts_.dense_weights != DenseWeights::kOff;
  if (fp8_on) {
    if (auto probe = Fp8Gemm::Create(0, kFp8Block, kFp8Block); !probe.ok()) {
      std::fprintf(stderr, "deltaserve: --prefill-fp8 ignored on device %d: %s\n", device_,
                   std::string(probe.status().message()).c_str());
      fp8_on = false;
    }
  }
  if (copts_.fp8_decode_rows != CudaBackendOptions{}.fp8_decode_rows && !copts_.prefill_fp8)
    std::fprintf(stderr, "deltaserve: --fp8-decode-rows %d has no effect without --prefill-fp8 on\n",
                 copts_.fp8_decode_rows);
  auto dense_fp8 = [&](const cpu::WeightView* w) {
    return fp8_on && w->rows % kFp8Block == 0 && w->cols % kFp8Block == 0;
  };
  auto dense_copy_bytes = [&](const cpu::WeightView* w) -> uint64_t {
    const uint64_t n = static_cast<uint64_t>(w->rows) * w->cols;
    return dense_fp8(w) ? AlignUp(n) + AlignUp(Fp8BlockScaleFloats(w->rows, static_cast<int>(w->cols)) * 4)
                        : AlignUp(n * 2);
  };
  if (copts_.dense_weights != DenseWeights::kOff)
    for (auto& [n, w] : mats)
      if (n.rfind("blk.", 0) == 0 && w->type != GgmlType::F32) dense_mats.insert(w);
  // Which matrices get the tiled layout: every tiled-format matrix except the embedding (read
  // by row lookups), so also the LM head unless it is tied to the embedding. The formats other
  // than Q6_K only with tiled_f16_formats and the f16 kernel, their only column kernel.
  const bool f16_formats = tiled_ && copts_.tiled_f16_formats && copts_.f16_mma && tiled_max_rows_ > 0;
  auto tile_it = [&](const cpu::WeightView* w) {
    // Not an empty TP slice (its row bytes would be 0, the staging chunk below divides by them).
    return tiled_ && w != &mw.token_embd && w != &mw.mtp.embed && TiledSupported(w->type) &&
           w->rows > 0 && w->cols > 0 && w->cols % 256 == 0 && (TiledInt8Supported(w->type) || f16_formats);
  };
  auto mat_bytes = [&](const cpu::WeightView* w) -> uint64_t {
    return tile_it(w) ? TiledBytes(w->type, w->rows, static_cast<int>(w->cols))
                      : GgmlRowBytes(w->type, w->cols) * w->rows;
  };
  uint64_t staging_bytes = 0;  // transient upload buffer of the repack (freed before state/work)
  uint64_t dense_bytes = 0;    // the 16-bit copies of dense_mats, charged once they are chosen
  trunk_tiled_ = tiled_;
  kq_tiled_ = false;
  f16_only_tiled_ = false;
  for (auto& [n, w] : mats) {
    f16_only_tiled_ = f16_only_tiled_ || (tile_it(w) && !TiledInt8Supported(w->type));
    kq_tiled_ = kq_tiled_ ||
                (tile_it(w) && (w->type == GgmlType::Q4_K || w->type == GgmlType::Q5_K));
    if (n.rfind("blk.", 0) == 0 && w->type != GgmlType::F32)
      trunk_tiled_ = trunk_tiled_ && tile_it(w);
    if (!GemvSupported(w->type))
      return absl::UnimplementedError(absl::StrCat("CUDA backend: tensor ", n, " has type ",
                                                   std::string(GgmlInfo(w->type).name),
                                                   " which the CUDA kernels do not support"));
    plan_.weights += AlignUp(mat_bytes(w));
    if (dense_mats.contains(w))
      dense_bytes += dense_copy_bytes(w);
    if (tile_it(w))
      staging_bytes = std::max<uint64_t>(staging_bytes, std::min<uint64_t>(GgmlRowBytes(w->type, w->cols) * w->rows, 64ull << 20) + GgmlRowBytes(w->type, w->cols) * kTiledRows);
    max_k_ = std::max<int>(max_k_, static_cast<int>(w->cols));
    if (w != &mw.output && w != &mw.token_embd && w != &mw.mtp.embed && w != &mw.mtp.head)
      max_mat_elems = std::max<uint64_t>(max_mat_elems, static_cast<uint64_t>(w->rows) * w->cols);
  }
  // prefill_fp8: the product's activation scratch and cuBLASLt workspace, charged with the copies.
  int fp8_max_m = 0;
  for (const cpu::WeightView* w : dense_mats)
    if (dense_fp8(w)) fp8_max_m = std::max<int>(fp8_max_m, static_cast<int>(w->rows));
  const uint64_t fp8_scratch =
      fp8_max_m > 0 ? AlignUp(Fp8Gemm::ScratchBytes(std::max(1, copts_.max_step_tokens), max_k_, fp8_max_m)) : 0;
  dense_bytes += fp8_scratch;  // allocated by Fp8Gemm, outside the weights' arena
  // A tied lm_head is (a row range of) the uploaded embedding: no bytes of its own.
  if (mw.tied_output) plan_.weights -= AlignUp(GgmlRowBytes(mw.output.type, mw.output.cols) * mw.output.rows);
  // The drafts' coarse head (CudaBackendOptions::coarse_draft_head): when the MTP head is a tiled
  // Q6_K matrix of its own (not the embedding).
  const cpu::WeightView* draft_head = mtp_own_head ? &mw.mtp.head : &mw.output;
  const uint64_t coarse_bytes =
      has_mtp_ && copts_.coarse_draft_head && (mtp_own_head || !mw.tied_output) &&
              tile_it(draft_head) && draft_head->type == GgmlType::Q6_K  // CoarsenTiled's input
          ? CoarseBytes(draft_head->rows, static_cast<int>(draft_head->cols))
          : 0;
  plan_.weights += AlignUp(coarse_bytes);
  plan_.weights += small_floats * 4 + 64 * kAlign * c.n_layer;
  for (auto& [n, w] : mats)
    if (w != &mw.token_embd && n.rfind("mtp.", 0) != 0) step_weight_bytes_ += GgmlRowBytes(w->type, w->cols) * w->rows;

  if (copts_.kv_page_size < 1 || copts_.kv_pool_tokens < 0)
    return absl::InvalidArgumentError(absl::StrCat("CUDA backend: KV page size ",
                                                   copts_.kv_page_size, " / pool tokens ",
                                                   copts_.kv_pool_tokens));
  max_pages_ = (slot_ctx_ + copts_.kv_page_size - 1) / copts_.kv_page_size;
  const int C = c.n_recurrent() > 0 ? gdn_shape_.channels() : 0;
  // Speculative entries: spec_tokens for each of spec_seqs sequences, state indices after the
  // slots' (cuda_device.h).
  if (copts_.spec_tokens < 0 || copts_.spec_seqs < 0)
    return absl::InvalidArgumentError(absl::StrCat("CUDA backend: spec_tokens ", copts_.spec_tokens,
                                                   " / spec_seqs ", copts_.spec_seqs));
  const int spec_seqs = copts_.spec_seqs > 0 ? copts_.spec_seqs : std::min(n_slots_, 8);
  n_spec_entries_ = copts_.spec_tokens > 0 ? copts_.spec_tokens * spec_seqs : 0;
  limits_.spec_entries = n_spec_entries_;
  limits_.max_spec_tokens = copts_.spec_tokens;
  const uint64_t n_idx = static_cast<uint64_t>(n_slots_) + n_spec_entries_;
  // The delta-rule state in f32, or bf16 (CudaBackendOptions::gdn_state_bf16: half of it, which
  // the planner below turns into more slots or KV).
  const uint64_t ring1 = 4ull * C * 4,
                 st1 = SlotRecurrentBytes(gdn_shape_, copts_.gdn_state_bf16).state;
  ring_pitch_ = AlignUp(n_idx * ring1);
  state_pitch_ = AlignUp(n_idx * st1);
  n_gdn_ = c.n_recurrent();
  plan_.recurrent = c.n_recurrent() * (ring_pitch_ + state_pitch_);
  // What the slots alone take (the planner scales it with the slot count) and the entries' rest.
  const uint64_t rec_slots =
      c.n_recurrent() * (AlignUp(n_slots_ * ring1) + AlignUp(n_slots_ * st1));
  // Recurrent state stays per slot (the GDN kernels index it by slot); the slot count is the
  // scheduler's and the planner below charges every one of them.

  T_max_ = std::max(1, copts_.max_step_tokens);
  limits_.max_rows = T_max_;
  limits_.max_logit_rows = logit_rows_max_;
  // Decode rows per micro-step: every slot's decode plus room for decode_path runs (a replay's
  // generated tokens, which the runner otherwise cuts into more micro-steps). Their attention
  // partials are sized by it: T_max rows of AttnSplits(1) splits were 6.2 GiB on the 27B.
  limits_.max_decode_rows = std::min(T_max_, std::max(n_slots_ + 1, kDecodeRowsMin));
  limits_.device_sampling = true;
  const uint64_t T = T_max_, H = c.n_embd;
  const uint64_t Vw = static_cast<uint64_t>(gdn_v) * c.gdn_v_dim;
  const uint64_t qgw = 2ull * n_head * c.head_dim, ow = static_cast<uint64_t>(n_head) * c.head_dim;
  const uint64_t kvw = static_cast<uint64_t>(n_kv) * c.head_dim;
  const int G = n_kv > 0 ? n_head / n_kv : 1;
  const uint64_t n_ff = lc.n_ff;
  // Vocab-parallel lm_head: this rank's logits [rows, V_r] and the gathered ones, rank-major.
  const bool gather = VocabParallel();
  const uint64_t part_floats = gather ? static_cast<uint64_t>(logit_rows_max_) * n_vocab_local_ : 0;
  const uint64_t gather_floats = gather ? static_cast<uint64_t>(logit_rows_max_) * c.n_vocab : 0;
  // MTP rows per pass: a verify's catch-up (k + 1 rows) in one; a prompt's rows in chunks of
  // this many (a GEMM each), ~164 KiB per row on the 27B.
  mtp_rows_max_ = has_mtp_ ? std::min(T_max_, kMtpRowsMax) : 0;
  const uint64_t MR = static_cast<uint64_t>(mtp_rows_max_);
  partial_floats_ = AttnDecodePartialFloats(attn_shape_, limits_.max_decode_rows, AttnSplits(1));
  wh_elems_ = std::max<uint64_t>(max_mat_elems, static_cast<uint64_t>(c.n_embd) * 4096);
  struct Buf {
    void** p;
    uint64_t bytes;
  };
  // The cuBLAS prefill attention's scores / probabilities ([G, tq, slot_ctx], 2.25x the
  // gathered K/V per context token on the 27B); the flash kernel needs neither.
  const uint64_t score_ctx =
      attn_prefill_tensor_cores_ || attn_prefill_wgmma_ ? 0 : static_cast<uint64_t>(slot_ctx_);
  const uint64_t LR = static_cast<uint64_t>(logit_rows_max_);  // logit rows of one micro-step
  // TiledF16Multi's activations and K-split scratch (~14 MiB on the 27B), when it can run.
  // The tiled formats other than Q6_K take it at every column count (f16_only_tiled_); Q4_K /
  // Q5_K with the sub-block sums (kq_tiled_).
  const bool f16_cols =
      tiled_ && copts_.f16_mma && (tiled_max_rows_ >= copts_.f16_mma_min_cols || f16_only_tiled_);
  std::vector<Buf> bufs = {
      {reinterpret_cast<void**>(&d_ints_), kIntRows * T * 4},
      {reinterpret_cast<void**>(&argmax_scratch_.value), LR * kArgmaxParts * 4},
      {reinterpret_cast<void**>(&argmax_scratch_.index), LR * kArgmaxParts * 4},
      {reinterpret_cast<void**>(&argmax_scratch_.tickets), LR * 4},
      {reinterpret_cast<void**>(&h_), T * H * 4},
      {reinterpret_cast<void**>(&a_), T * H * 4},
      {reinterpret_cast<void**>(&mixed_), T * std::max<uint64_t>(C, qgw) * 4},
      {reinterpret_cast<void**>(&z_), T * Vw * 4},
      {reinterpret_cast<void**>(&gb_), T * gdn_v * 4ull},
      {reinterpret_cast<void**>(&ga_), T * gdn_v * 4ull},
      {reinterpret_cast<void**>(&gy_), T * C * 4},
      {reinterpret_cast<void**>(&gg_), T * gdn_v * 4ull},
      {reinterpret_cast<void**>(&gbeta_), T * gdn_v * 4ull},
      {reinterpret_cast<void**>(&gwy_),
       C > 0 ? static_cast<uint64_t>(GdnChunkScratchFloats(gdn_shape_, static_cast<int>(T))) * 4
             : 0},
      {reinterpret_cast<void**>(&mix_out_), T * std::max(Vw, ow) * 4},
      {reinterpret_cast<void**>(&kx_), T * kvw * 4},
      {reinterpret_cast<void**>(&vx_), T * kvw * 4},
      {reinterpret_cast<void**>(&q_), T * ow * 4},
      {reinterpret_cast<void**>(&q16_), T * ow * 2},
      {reinterpret_cast<void**>(&ffa_), T * n_ff * 4},
      {reinterpret_cast<void**>(&ffb_), T * n_ff * 4},
      {reinterpret_cast<void**>(&xq_), static_cast<uint64_t>(QuantRows()) * max_k_},
      {reinterpret_cast<void**>(&xd_), static_cast<uint64_t>(QuantRows()) * max_k_ / 32 * 4 + 4},
      {reinterpret_cast<void**>(&xsum_), static_cast<uint64_t>(max_k_) / 16 * 4},
      {reinterpret_cast<void**>(&xh_), T * max_k_ * 2},
      {reinterpret_cast<void**>(&xf_),
       f16_cols ? static_cast<uint64_t>(QuantRows()) * max_k_ * 2 : 0},
      {reinterpret_cast<void**>(&xf_scale_), f16_cols ? static_cast<uint64_t>(QuantRows()) * 4 : 0},
      {reinterpret_cast<void**>(&xf_sums_),
       kq_tiled_ ? static_cast<uint64_t>(QuantRows()) * max_k_ / 32 * 2 : 0},
      {reinterpret_cast<void**>(&f16_scratch_.partial),
       f16_cols ? static_cast<uint64_t>(TiledF16PartialFloats(kTiledF16MaxCols)) * 4 : 0},
      {reinterpret_cast<void**>(&f16_scratch_.tickets), f16_cols ? TiledF16Tickets() * 4ull : 0},
      {reinterpret_cast<void**>(&xh_scale_), 16},
      {reinterpret_cast<void**>(&wh_), wh_elems_ * 2},
      {reinterpret_cast<void**>(&kt_), static_cast<uint64_t>(slot_ctx_) * kvw * 2},
      // The wgmma prefill's transposed V: rows padded to whole 64-key tiles.
      {reinterpret_cast<void**>(&vt_),
       static_cast<uint64_t>(AttnPrefillVtElems(attn_shape_, slot_ctx_)) * 2},
      {reinterpret_cast<void**>(&scores_), static_cast<uint64_t>(G) * attn_tq_ * score_ctx * 4},
      {reinterpret_cast<void**>(&probs_), static_cast<uint64_t>(G) * attn_tq_ * score_ctx * 2},
      {reinterpret_cast<void**>(&partials_), static_cast<uint64_t>(partial_floats_) * 4},
      {reinterpret_cast<void**>(&hn_), static_cast<uint64_t>(logit_rows_max_) * H * 4},
      {reinterpret_cast<void**>(&logits_), static_cast<uint64_t>(logit_rows_max_) * c.n_vocab * 4},
      {reinterpret_cast<void**>(&logits_part_), part_floats * 4},
      {reinterpret_cast<void**>(&logits_gather_), gather_floats * 4},
      // MTP block (MtpRows): mtp_rows_max_ rows up to the attention, then the last row.
      {reinterpret_cast<void**>(&mtp_cat_), MR * 2 * H * 4},
      {reinterpret_cast<void**>(&mtp_u_), MR * H * 4},
      {reinterpret_cast<void**>(&mtp_a_), MR * H * 4},
      {reinterpret_cast<void**>(&mtp_b_), MR * H * 4},
      {reinterpret_cast<void**>(&mtp_qg_), has_mtp_ ? qgw * 4 : 0},
      {reinterpret_cast<void**>(&mtp_k_), MR * kvw * 4},
      {reinterpret_cast<void**>(&mtp_v_), MR * kvw * 4},
      {reinterpret_cast<void**>(&mtp_q_), has_mtp_ ? ow * 4 : 0},
      {reinterpret_cast<void**>(&mtp_o_), has_mtp_ ? ow * 4 : 0},
      {reinterpret_cast<void**>(&mtp_ff_), has_mtp_ ? 2 * c.n_ff * 4ull : 0},
      {reinterpret_cast<void**>(&mtp_hid_), has_mtp_ ? H * 4 : 0},
      {reinterpret_cast<void**>(&mtp_logits_), has_mtp_ ? c.n_vocab * 4ull : 0},
      {reinterpret_cast<void**>(&mtp_parts_),
       has_mtp_ ? MaskedAttnPartialFloats(attn_shape_, MtpAttnSplits()) * 4ull : 0},
      {reinterpret_cast<void**>(&mtp_ints_), has_mtp_ ? MtpIntsTotal() * 4ull : 0},
      {reinterpret_cast<void**>(&mtp_chain_best_), has_mtp_ ? MtpChainBestInts() * 4ull : 0},
      {reinterpret_cast<void**>(&chain_drafts_),
       has_mtp_ ? 2ull * n_slots_ * kMtpChainMax * 4ull : 0},
  };
  for (auto& b : bufs) plan_.workspace += AlignUp(b.bytes);
  plan_.workspace += 64ull << 20;  // cuBLAS workspace and CUDA context slack

  // ---- the memory plan: what fits beside weights, workspace and recurrent state is the KV pool
  // shared by all slots (worker/runner/memory_planner.h) ----
  size_t free_b = 0, total_b = 0;
  DS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  MemoryPlanInput pin;
  pin.device_free = free_b;
  pin.device_total = total_b;
  pin.memory_fraction = copts_.memory_fraction;
  // Kept free: CUDA graphs, the sampler's growing buffers, library handles allocated later.
  pin.margin = RuntimeHeadroom(total_b);
  pin.weights = plan_.weights;
  // kt_/vt_ (and scores_/probs_ without the flash prefill) grow with the context; the rest
  // does not.
  pin.workspace_per_ctx =
      kvw * 2 * 2 + (score_ctx > 0 ? static_cast<uint64_t>(G) * attn_tq_ * (4 + 2) : 0);
  pin.workspace_fixed = plan_.workspace - std::min<uint64_t>(plan_.workspace, pin.workspace_per_ctx * slot_ctx_);
  pin.recurrent_per_slot = rec_slots / std::max(1, n_slots_);
  pin.recurrent_fixed = plan_.recurrent - rec_slots;
  pin.kv_per_token = static_cast<uint64_t>(c.n_attention()) * 2 * kv_token_bytes_;
  pin.page_size = copts_.kv_page_size;
  pin.slots = std::max(1, n_slots_ - 1);  // + the warmup scratch slot the planner adds
  pin.slot_ctx = slot_ctx_;
  pin.pool_tokens = copts_.kv_pool_tokens;
  // Prefix-cache checkpoints live beside the plan (cudaMalloc'd as they are saved); a save also
  // leaves the runtime its headroom twice over (slot_checkpoint.cc), so ask for that on top.
  if (copts_.prefix_cache_bytes > 0) {
    pin.cache_bytes = copts_.prefix_cache_bytes + pin.margin;
    pin.cache_required = copts_.prefix_cache_required;
  }
  if (c.n_attention() == 0 || n_kv == 0) pin.kv_per_token = 0;
  // The MTP layer's K and V: one more f16 plane each in the pool's pages.
  const uint64_t mtp_token_bytes = has_mtp_ ? static_cast<uint64_t>(n_kv) * c.head_dim * 2 : 0;
  pin.kv_per_token += 2 * mtp_token_bytes;
  auto dp = PlanDenseWeights(pin, dense_bytes, copts_.dense_weights);
  if (!dp.ok())
    return absl::ResourceExhaustedError(absl::StrCat(
        "CUDA backend on device ", device_, " (kv_type ", KvTypeName(copts_.kv_type),
        ", dense weights ", DenseWeightsName(copts_.dense_weights), "): ", dp.status().message()));
  const MemoryPlan* mp = &dp->plan;
  if (dp->dense) {
    plan_.weights += dense_bytes;
    plan_.dense_copies = dense_bytes;
  } else {
    dense_mats.clear();
  }
  // CudaBackendOptions::fp8_decode_rows: the FP8 family's column rows, where it changes a step.
  fp8_column_rows_ = -1;
  if (fp8_on && trunk_tiled_ && copts_.fp8_decode_rows > 0 &&
      std::any_of(dense_mats.begin(), dense_mats.end(), dense_fp8))
    if (const int cap = copts_.fp8_decode_rows - 1; cap < tiled_max_rows_) fp8_column_rows_ = cap;
  plan_.dense_choice = dp->reason;
  plan_.plan = *mp;
  plan_.cache_reserved = mp->cache;
  n_pages_ = std::max<int64_t>(1, mp->pool_pages);
  const uint64_t kv_layer = static_cast<uint64_t>(n_pages_) * copts_.kv_page_size * kv_token_bytes_;
  const uint64_t table_entries = static_cast<uint64_t>(n_slots_) * max_pages_;
  plan_.kv_cache = c.n_attention() * 2 * AlignUp(kv_layer) + AlignUp(table_entries * 4);
  const uint64_t mtp_layer = static_cast<uint64_t>(n_pages_) * copts_.kv_page_size * mtp_token_bytes;
  mtp_page_bytes_ = mtp_token_bytes * copts_.kv_page_size;
  const uint64_t mtp_valid_bytes = has_mtp_ ? static_cast<uint64_t>(n_slots_) * slot_ctx_ : 0;
  plan_.kv_cache += 2 * AlignUp(mtp_layer) + AlignUp(mtp_valid_bytes);
  const uint64_t transient = staging_bytes + (fp8_on && !dense_mats.empty() ? kFp8TempBytes : 0);
  if (plan_.total() > free_b || plan_.weights + transient > free_b)
    return absl::ResourceExhaustedError(absl::StrFormat(
        "CUDA backend: model needs %s (+ %.2f GiB transient upload staging) but device %d has "
        "%.2f GiB free (n_slots=%d, slot_ctx=%d, kv_type=%s); lower --slots/--ctx or "
        "--max-step-tokens, or quantize the KV cache (--kv-type q8_0 / q4_0)",
        plan_.ToString(), static_cast<double>(transient) / (1ull << 30), device_,
        static_cast<double>(free_b) / (1ull << 30), n_slots_, slot_ctx_,
        KvTypeName(copts_.kv_type)));

  // ---- allocate and upload ----
  DS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DS_ASSIGN_OR_RETURN(CublasGemm * g, CublasGemm::Create());
  gemm_.reset(g);
  const uint64_t fp8_bytes = dp->dense ? fp8_scratch : 0;
  if (fp8_bytes > 0) {
    DS_ASSIGN_OR_RETURN(fp8_, Fp8Gemm::Create(std::max(1, copts_.max_step_tokens), max_k_, fp8_max_m));
  }
  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&weights_mem_, plan_.weights - fp8_bytes));
  Arena wa{static_cast<uint8_t*>(weights_mem_), plan_.weights - fp8_bytes, 0};
  void* staging = nullptr;
  if (staging_bytes) DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&staging, staging_bytes));
  std::unique_ptr<void, cudaError_t (*)(void*)> staging_owner(staging, cudaFree);
  // prefill_fp8: the dequantized rows on their way to e4m3 (kFp8TempBytes, during the upload).
  std::unique_ptr<void, cudaError_t (*)(void*)> fp8_temp(nullptr, cudaFree);
  auto up_mat = [&](const cpu::WeightView& w, DMat* m) -> absl::Status {
    m->type = w.type;
    m->rows = static_cast<int>(w.rows);
    m->cols = static_cast<int>(w.cols);
    m->tiled = tile_it(&w);
    m->bytes = mat_bytes(&w);
    uint8_t* d = wa.Take<uint8_t>(m->bytes);
    m->d = d;
    // Rows [r0, r0 + n) of the uploaded matrix (in whichever layout it has) as 16-bit values.
    auto dequantize = [&](int64_t r0, int n, void* out, bool bf16) -> absl::Status {
      if (m->tiled) return DequantizeTiledRows(m->type, d, static_cast<int>(r0), n, m->cols, out, bf16, stream_);
      return DequantizeRows(m->type, d + r0 * GgmlRowBytes(m->type, m->cols), n, m->cols, out, bf16,
                            stream_);
    };
    // The dense copy: 16-bit, or (prefill_fp8) e4m3 from the same bf16 values.
    auto densify = [&]() -> absl::Status {
      if (!dense_mats.contains(&w)) return absl::OkStatus();
      if (dense_fp8(&w)) {
        // Row chunks of whole 128-row blocks through the transient bf16 buffer.
        const uint64_t n = static_cast<uint64_t>(m->rows) * m->cols;
        auto* q = wa.Take<uint8_t>(n);
        auto* scale = wa.Take<float>(Fp8BlockScaleFloats(m->rows, m->cols));
        m->dense_fp8 = q;
        m->dense_fp8_scale = scale;
        if (!fp8_temp) {
          void* t = nullptr;
          DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&t, kFp8TempBytes));
          fp8_temp.reset(t);
        }
        const int64_t chunk = std::max<int64_t>(kFp8Block, kFp8TempBytes / (2ull * m->cols) / kFp8Block * kFp8Block);
        for (int64_t r0 = 0; r0 < m->rows; r0 += chunk) {
          const int rn = static_cast<int>(std::min<int64_t>(chunk, m->rows - r0));
          DS_RETURN_IF_ERROR(dequantize(r0, rn, fp8_temp.get(), /*bf16=*/true));
          DS_RETURN_IF_ERROR(QuantizeBlocksFp8(fp8_temp.get(), true, rn, m->cols, q + r0 * m->cols,
                                               scale + r0 / kFp8Block * Fp8BlockScaleLd(m->cols),
                                               stream_));
        }
      } else {
        auto* dense = wa.Take<uint8_t>(static_cast<uint64_t>(m->rows) * m->cols * 2);
        m->dense = dense;
        DS_RETURN_IF_ERROR(dequantize(0, m->rows, dense, bf16_));
      }
      DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      return absl::OkStatus();
    };
    if (!m->tiled) {
      DS_RETURN_IF_ERROR(Copy(d, w.data, m->bytes));
      return densify();
    }
    // Raw rows go through the staging buffer in chunks of whole tiles and are repacked there.
    const uint64_t rb = GgmlRowBytes(w.type, w.cols);
    const int64_t chunk = std::max<int64_t>(kTiledRows, staging_bytes / rb / kTiledRows * kTiledRows);
    for (int64_t r0 = 0; r0 < w.rows; r0 += chunk) {
      const int64_t n = std::min<int64_t>(chunk, w.rows - r0);
      DS_RETURN_IF_ERROR(Copy(staging, static_cast<const uint8_t*>(w.data) + r0 * rb, n * rb));
      DS_RETURN_IF_ERROR(TileRows(w.type, staging, r0, n, m->cols, d, stream_));
      DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    return densify();
  };
  auto up_vec = [&](const std::vector<float>& v) -> absl::StatusOr<const float*> {
    float* d = wa.Take<float>(v.size());
    if (!v.empty()) DS_RETURN_IF_ERROR(Copy(d, v.data(), v.size() * 4));
    return d;
  };
  DS_RETURN_IF_ERROR(up_mat(mw.token_embd, &token_embd_));
  if (mw.tied_output) {
    // The lm_head is the embedding, or under TP a row range of it (a view into the same mapping):
    // point into the uploaded embedding.
    const auto* e = static_cast<const uint8_t*>(mw.token_embd.data);
    const auto* o = static_cast<const uint8_t*>(mw.output.data);
    output_ = token_embd_;
    output_.rows = static_cast<int>(mw.output.rows);
    output_.bytes = GgmlRowBytes(mw.output.type, mw.output.cols) * mw.output.rows;
    if (o < e || o + output_.bytes > e + token_embd_.bytes)
      return absl::InternalError("CUDA backend: tied lm_head shard is not a row range of token_embd");
    output_.d = static_cast<const uint8_t*>(token_embd_.d) + (o - e);
  } else {
    DS_RETURN_IF_ERROR(up_mat(mw.output, &output_));
  }
  DS_ASSIGN_OR_RETURN(output_norm_, up_vec(mw.output_norm));
  layers_.resize(c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = mw.layers[l];
    DLayer& D = layers_[l];
    D.rec = L.recurrent;
    DS_ASSIGN_OR_RETURN(D.attn_norm, up_vec(L.attn_norm));
    DS_ASSIGN_OR_RETURN(D.post_norm, up_vec(L.post_norm));
    if (L.recurrent) {
      DS_RETURN_IF_ERROR(up_mat(L.gdn.qkv, &D.qkv));
      DS_RETURN_IF_ERROR(up_mat(L.gdn.gate, &D.gate));
      DS_RETURN_IF_ERROR(up_mat(L.gdn.beta, &D.beta));
      DS_RETURN_IF_ERROR(up_mat(L.gdn.alpha, &D.alpha));
      DS_RETURN_IF_ERROR(up_mat(L.gdn.out, &D.ssm_out));
      DS_ASSIGN_OR_RETURN(D.gdn.conv_w, up_vec(L.gdn.conv));
      DS_ASSIGN_OR_RETURN(D.gdn.ssm_a, up_vec(L.gdn.ssm_a));
      DS_ASSIGN_OR_RETURN(D.gdn.dt_bias, up_vec(L.gdn.dt_bias));
      DS_ASSIGN_OR_RETURN(D.gdn.norm_w, up_vec(L.gdn.norm));
      D.gdn.eps = c.rms_eps;
    } else {
      DS_RETURN_IF_ERROR(up_mat(L.attn.q, &D.q));
      DS_RETURN_IF_ERROR(up_mat(L.attn.k, &D.k));
      DS_RETURN_IF_ERROR(up_mat(L.attn.v, &D.v));
      DS_RETURN_IF_ERROR(up_mat(L.attn.out, &D.o));
      DS_ASSIGN_OR_RETURN(D.q_norm, up_vec(L.attn.q_norm));
      DS_ASSIGN_OR_RETURN(D.k_norm, up_vec(L.attn.k_norm));
    }
    DS_RETURN_IF_ERROR(up_mat(L.ffn_gate, &D.ffn_gate));
    DS_RETURN_IF_ERROR(up_mat(L.ffn_up, &D.ffn_up));
    DS_RETURN_IF_ERROR(up_mat(L.ffn_down, &D.ffn_down));
  }
  if (has_mtp_) {
    const LayerWeights& L = mw.mtp.layer;
    DLayer& D = mtp_layer_;
    DS_ASSIGN_OR_RETURN(D.attn_norm, up_vec(L.attn_norm));
    DS_ASSIGN_OR_RETURN(D.post_norm, up_vec(L.post_norm));
    DS_RETURN_IF_ERROR(up_mat(L.attn.q, &D.q));
    DS_RETURN_IF_ERROR(up_mat(L.attn.k, &D.k));
    DS_RETURN_IF_ERROR(up_mat(L.attn.v, &D.v));
    DS_RETURN_IF_ERROR(up_mat(L.attn.out, &D.o));
    DS_ASSIGN_OR_RETURN(D.q_norm, up_vec(L.attn.q_norm));
    DS_ASSIGN_OR_RETURN(D.k_norm, up_vec(L.attn.k_norm));
    DS_RETURN_IF_ERROR(up_mat(L.ffn_gate, &D.ffn_gate));
    DS_RETURN_IF_ERROR(up_mat(L.ffn_up, &D.ffn_up));
    DS_RETURN_IF_ERROR(up_mat(L.ffn_down, &D.ffn_down));
    DS_RETURN_IF_ERROR(up_mat(mw.mtp.eh_proj, &mtp_eh_));
    DS_ASSIGN_OR_RETURN(mtp_enorm_, up_vec(mw.mtp.enorm));
    DS_ASSIGN_OR_RETURN(mtp_hnorm_, up_vec(mw.mtp.hnorm));
    DS_ASSIGN_OR_RETURN(mtp_norm_, up_vec(mw.mtp.shared_head_norm));
    if (mtp_own_embed) {
      DS_RETURN_IF_ERROR(up_mat(mw.mtp.embed, &mtp_embed_));
    } else {
      mtp_embed_ = token_embd_;
    }
    if (mtp_own_head) {
      DS_RETURN_IF_ERROR(up_mat(mw.mtp.head, &mtp_head_));
    } else {
      mtp_head_ = output_;
    }
    if (coarse_bytes > 0) {  // mtp_head_ was uploaded tiled (tile_it above)
      mtp_coarse_head_ = wa.Take<uint8_t>(coarse_bytes);
      DS_RETURN_IF_ERROR(
          CoarsenTiled(mtp_head_.d, mtp_head_.rows, mtp_head_.cols, mtp_coarse_head_, stream_));
      DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
  }
  staging_owner.reset();  // before the state and workspace allocations (checked in the plan)

  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&state_mem_, plan_.kv_cache + plan_.recurrent));
  Arena sa{static_cast<uint8_t*>(state_mem_), plan_.kv_cache + plan_.recurrent, 0};
  // Zero KV and recurrent state first: the block table lives in the same arena (it used to be
  // zeroed after its upload, which mapped every page of every slot to page 0).
  DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(state_mem_, 0, plan_.kv_cache + plan_.recurrent, stream_));
  // Page tables start all zero (page 0 is a valid page: a stray read stays in bounds); the
  // runner maps each slot's pages as its sequence grows (MapPages).
  d_table_ = sa.Take<int32_t>(table_entries);
  h_table_.assign(table_entries, 0);
  kv_base_ = KvCacheView{nullptr, nullptr,   d_table_,  copts_.kv_page_size,
                         max_pages_, n_kv, c.head_dim, copts_.kv_type};
  // Every GDN layer's rings, then every layer's states, each layer at a fixed pitch.
  rings_ = sa.Take<float>(n_gdn_ * ring_pitch_ / 4);
  states_ = sa.Take<uint8_t>(n_gdn_ * state_pitch_);
  int gi = 0;
  for (DLayer& D : layers_) {
    if (D.rec) {
      D.ring = rings_ + gi * ring_pitch_ / 4;
      D.state = states_ + gi * state_pitch_;
      ++gi;
    } else {
      D.kc = sa.Take<uint8_t>(kv_layer);
      D.vc = sa.Take<uint8_t>(kv_layer);
    }
  }

  if (has_mtp_) {
    mtp_layer_.kc = sa.Take<uint8_t>(mtp_layer);
    mtp_layer_.vc = sa.Take<uint8_t>(mtp_layer);
    mtp_valid_ = sa.Take<uint8_t>(mtp_valid_bytes);  // zeroed with the arena: nothing written
  }
  mtp_len_.assign(n_slots_, 0);
  chain_half_.assign(n_slots_, 0);
  verify_half_.assign(n_slots_, 0);
  spec_last_.assign(n_slots_, -1);
  spec_last_pos_.assign(n_slots_, -1);

  uint64_t work_bytes = 0;
  for (auto& b : bufs) work_bytes += AlignUp(b.bytes);
  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&work_mem_, work_bytes));
  Arena ka{static_cast<uint8_t*>(work_mem_), work_bytes, 0};
  for (auto& b : bufs) *b.p = ka.Take<uint8_t>(b.bytes);
  argmax_scratch_.max_rows = logit_rows_max_;
  DS_CUDA_RETURN_IF_ERROR(cudaMemset(argmax_scratch_.tickets, 0, LR * 4));
  if (f16_cols) {
    f16_scratch_.partial_floats = TiledF16PartialFloats(kTiledF16MaxCols);
    f16_scratch_.n_tickets = TiledF16Tickets();
    f16_scratch_.cluster_split = copts_.f16_cluster_split;
    f16_scratch_.tail_split = copts_.f16_tail_split;
    f16_scratch_.split_cost = copts_.f16_split_cost;
    f16_scratch_.warpgroup_order = copts_.f16_wgmma && TiledF16WgmmaAvailable();
    DS_CUDA_RETURN_IF_ERROR(cudaMemset(f16_scratch_.tickets, 0, TiledF16Tickets() * 4ull));
  }
  // Host mirror: d_ints_'s kIntRows rows, then MtpRows' tokens, slots and positions, then (at
  // a 16-byte boundary) its hidden rows in and its hidden state and logits out.
  const uint64_t int_bytes = (kIntRows * T + (has_mtp_ ? MtpIntsTotal() : 0)) * 4ull;
  const uint64_t mtp_f_floats = has_mtp_ ? MR * H + H + c.n_vocab : 0;
  DS_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(&h_ints_, (int_bytes + 15) / 16 * 16 + mtp_f_floats * 4 + 16));
  h_mtp_ints_ = h_ints_ + kIntRows * T;
  tokens_out_max_ = std::max(kTokensOutMin, logit_rows_max_);
  DS_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(&h_tokens_, static_cast<size_t>(tokens_out_max_) * sizeof(int32_t)));
  if (has_mtp_) {
    DS_CUDA_RETURN_IF_ERROR(
        cudaMallocHost(&h_chain_ints_, static_cast<size_t>(kChainMirrors) * MtpIntsTotal() * 4));
    DS_CUDA_RETURN_IF_ERROR(
        cudaMallocHost(&h_chain_drafts_, 2ull * n_slots_ * kMtpChainMax * sizeof(int32_t)));
    DS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&sampled_, cudaEventDisableTiming));
    for (cudaEvent_t& e : chain_mirror_read_)
      DS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  h_mtp_f_ = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(h_ints_) + (int_bytes + 15) / 16 * 16);
  return has_mtp_ ? SetUpFusedDraftChain() : absl::OkStatus();
}

}  // namespace cuda
}  // namespace ds
