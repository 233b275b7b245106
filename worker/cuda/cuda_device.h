// CudaDevice: the qwen35 layers on one GPU, under the step runner (worker/runner/device.h).
//
// Weights stay in their GGUF block formats in one device allocation (under tensor parallelism only
// this rank's shard, cut by the runner's plan: docs/tp.md "CUDA shards"). Decode rows (one token of
// a sequence) go through the quantized GEMV kernels (up to 16 activation columns per weight read;
// Q6_K through the tiled int8 mma kernel), prefill rows through dequantize-to-bf16 + cuBLAS.
// Steps whose rows all go through the decode kernels (plain decodes, MTP verify runs) are captured
// once per run shape as a CUDA graph and replayed. A memory plan
// (weights / KV / recurrent state / workspace) is computed before any allocation and a clear error
// names the shortfall.
//
// Files: cuda_device_init.cc (memory plan, allocation, weight upload and repack),
// matmul_dispatch.cc (which kernel runs a matrix product), forward.cc (one micro-step: embed,
// layers, head, graphs), outputs.cc (logits, sampling, profiling), slot_state.cc (reset, save,
// load). One stream; every tensor op is a kernel from kernels/cuda.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/sampling/sampling_params.h"
#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/gdn.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemm_fp8.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/mtp_chain.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/tiled_f16.cuh"
#include "worker/cuda/cuda_options.h"
#include "worker/model/weights.h"
#include "worker/runner/device.h"
#include "worker/runner/step_runner.h"

namespace ds::cuda {

// A weight matrix on the device.
struct DMat {
  GgmlType type = GgmlType::F32;
  const void* d = nullptr;  // [rows, row_bytes]; tiled: kernels/cuda/gemv_tiled.cuh
  int rows = 0, cols = 0;
  uint64_t bytes = 0;
  bool tiled = false;       // Q6_K repacked into 16-row mma tiles at upload
  // CudaBackendOptions::dense_weights: the 16-bit copy [rows, cols] the cuBLAS path multiplies
  // (no dequantization per step); null without it.
  const void* dense = nullptr;
  // CudaBackendOptions::prefill_fp8: the e4m3 copy [rows, cols] and its block scales
  // (kernels/cuda/gemm_fp8.cuh) instead of `dense`.
  const uint8_t* dense_fp8 = nullptr;
  const float* dense_fp8_scale = nullptr;
};

struct DLayer {
  bool rec = false;
  const float* attn_norm = nullptr;  // [H]
  const float* post_norm = nullptr;  // [H]
  // GDN
  DMat qkv, gate, beta, alpha, ssm_out;
  GdnLayerParams gdn;
  float* ring = nullptr;   // [n_slots, 4, C]
  void* state = nullptr;   // [n_slots, Hv, dk, dv] f32, or bf16 (gdn_state_bf16)
  // attention
  DMat q, k, v, o;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  uint8_t* kc = nullptr;  // [n_pages, page, n_kv, row_bytes] the shared pool (KvCacheView: f16 or q8_0/q4_0 blocks)
  uint8_t* vc = nullptr;
  // FFN
  DMat ffn_gate, ffn_up, ffn_down;
};

class CudaDevice final : public Device {
 public:
  ~CudaDevice() override;
  // Uploads rank tp.rank's weights of `file` to GPU `device` and allocates the state of n_slots
  // slots of slot_ctx positions. tp.collective (if any) must reduce device buffers on a stream.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(const gguf::File& file,
                                                            const ModelConfig& cfg,
                                                            const TpPlacement& tp, int device,
                                                            int n_slots, int slot_ctx,
                                                            const CudaBackendOptions& copts);

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  const DeviceLimits& limits() const override { return limits_; }
  MemoryFootprint memory() const override { return plan_; }

  absl::Status Prepare(const MicroStep& step) override;
  absl::Status Embed() override;
  absl::Status Layer(int layer) override;
  absl::Status Head() override;
  absl::Status RunCaptured(const MicroStep& step,
                           const std::function<absl::Status()>& body) override;

  LogitBuffers logit_buffers() override { return {logits_part_, logits_gather_, logits_}; }
  absl::Status CopyColumns(float* dst, int64_t ld_dst, const float* src, int64_t ld_src,
                           int64_t width, int64_t rows) override;
  absl::Status ReadLogits(int n, float* dst) override;
  absl::Status ReadHidden(int n, float* dst) override;
  absl::Status Argmax(int n, int32_t* tokens) override;
  absl::Status Sample(std::span<const DeviceSampleRow> rows, int32_t* tokens) override;
  absl::Status Finish() override;
  double TakeCommSeconds() override { return 0; }  // collectives are stream-ordered: not timed

  // Speculative verify (CudaBackendOptions::spec_tokens): the slot's GDN state becomes entry
  // `entry`'s (one strided copy per state kind over all GDN layers). MtpStep: the MTP block
  // (spec §8.2) for one token, its K/V in an f16 plane of the paged pool (worker/cuda/mtp.cc);
  // MtpRows: n rows of one slot in one pass (MtpStep is MtpRows of one row).
  absl::Status CommitSpeculative(int slot, int entry) override;
  absl::Status MtpStep(int slot, int32_t token, int32_t pos, std::span<const float> hidden,
                       std::vector<float>* logits, std::vector<float>* hidden_out) override;
  absl::Status MtpRows(int slot, int32_t pos0, std::span<const int32_t> tokens,
                       std::span<const float> hidden, int64_t n_embd, std::vector<float>* logits,
                       std::vector<float>* hidden_out) override;
  // SeqStep::fill_mtp: the run's rows normed from h_ go through MtpPass with the micro-step's own
  // index arrays (the token after a row is the next row's id); only the last row's token and the
  // mask arguments are uploaded.
  absl::Status MtpFill(const RowRun& run, int32_t next) override;
  // Greedy drafts without host round trips: the catch-up pass reads its hidden rows from hn_,
  // each draft's argmax feeds the next pass on the device, the chain replays from a graph per
  // (rows, drafts) shape and only the draft tokens come back.
  // drafts == nullptr (deferred): the drafts go to the slot's row of chain_drafts_ and, behind
  // it, to its pinned host copy; nothing waits.
  absl::Status MtpDraftGreedy(int slot, int32_t pos0, std::span<const int32_t> tokens,
                              int hidden_row0, int n_logit_rows, int64_t n_embd, int n_drafts,
                              int32_t* drafts) override;
  bool KeepsDeferredDrafts() const override { return has_mtp_; }
  absl::Status DeferredDrafts(int slot, int n, int32_t* out) override;
  // The fused chain judges the verify's drafts itself (MtpChainCall::sampled): it reads the
  // sampled tokens where the sampling kernels wrote them (h_tokens_) and the drafts from the half
  // of chain_drafts_ the verify embedded, and writes its own to the other half. Finish then waits
  // for an event recorded before it. False where the fused chain is off or the verify's drafts
  // came from the host.
  absl::StatusOr<bool> QueueChainAfterVerify(int slot, int32_t pos0, int row, int n_rows,
                                             bool chain_drafts, int n_drafts) override;
  void ChainAfterVerifyKept(int slot, int32_t pos0, int kept, int n_drafts) override;

  KvPaging kv_paging() const override { return {copts_.kv_page_size, n_pages_, max_pages_}; }
  absl::Status MapPages(int slot, int first, std::span<const int32_t> pages) override;
  void ResetSlot(int slot) override;
  absl::StatusOr<std::vector<uint8_t>> SaveState(int slot, int32_t n_past) const override;
  absl::Status LoadState(int slot, int32_t n_past, std::span<const uint8_t> bytes) override;
  std::string state_layout() const override;
  // Prefix cache checkpoints in device memory (slot_checkpoint.cc): cudaMalloc'd copies of a
  // slot's state, saved and loaded with device-to-device copies.
  bool HasDeviceStateCopies() const override { return true; }
  absl::StatusOr<std::shared_ptr<void>> SaveStateOnDevice(int slot, int32_t n_past,
                                                          uint64_t* bytes) const override;
  absl::Status LoadStateFromDevice(int slot, int32_t n_past, const void* src,
                                   uint64_t bytes) override;

  const CudaMemoryPlan& memory_plan() const { return plan_; }
  bool portable() const { return portable_; }  // the sm_70 kernel path (cuda_options.h)
  // All-reduces that ran overlapped with the projection GEMMs (overlap_allreduce), since start.
  int64_t overlapped_allreduces() const { return overlap_pieces_; }
  // Draft chains run by the fused kernel (kernels/cuda/mtp_chain.cuh) since start.
  int64_t fused_draft_chains() const { return fused_chains_; }
  // Of those, chains queued behind a verify's sampling, judged on the device (tests: the path ran).
  int64_t judged_draft_chains() const { return judged_chains_; }
  // Batches of copies queued on the side stream (CudaBackendOptions::side_copies) since start.
  int64_t side_copy_batches() const { return side_copy_batches_; }
  bool fused_draft_chain_resident() const { return mtp_chain_.blocks > 0 && mtp_chain_.resident; }
  std::string draft_chain_form() const;  // CudaBackend::DraftChainForm
  // Bytes of weight matrices one forward step reads (every layer matrix + the LM head).
  uint64_t StepWeightBytes() const { return step_weight_bytes_; }
  // Profiling pass: when on, graphs are off and every op class is bracketed by CUDA events;
  // ProfileTotals() gives accumulated milliseconds per class since ResetProfile().
  void SetProfiling(bool on) { profiling_ = on; }
  void ResetProfile() { prof_ms_.clear(); }
  std::vector<std::pair<std::string, double>> ProfileTotals() const {
    return {prof_ms_.begin(), prof_ms_.end()};
  }

 private:
  CudaDevice() = default;
  absl::Status Init(const gguf::File& file, const ModelConfig& cfg, const TpPlacement& tp,
                    int device, int n_slots, int slot_ctx, const CudaBackendOptions& copts);

  // ---- matmul_dispatch.cc
  // The step's matmuls: x and y hold the micro-step's rows_ rows, which go through the kernels
  // the prepared row segments (segs_) name. R must be rows_.
  absl::Status Linear(const DMat& w, const float* x, int R, float* y, bool accumulate);
  absl::Status LinearSiluPair(const DMat& g, const DMat& u, const float* x, int R, float* y);
  // Several matrices on the same input x (store epilogue): the column segments in one launch per
  // chunk for all of them when they share type and K (in every step, so that a row's f16 K split
  // does not depend on the step), the GEMM segments matrix by matrix; else one Linear each.
  absl::Status LinearMulti(std::initializer_list<std::pair<const DMat*, float*>> mats,
                           const float* x, int R);
  // LinearMulti's launches for the R rows from row0 of x and of every y (a column segment, or the
  // MTP passes outside the step's segment plan): the matrices must pass SameColumnMatrices and
  // take the column kernels at R rows.
  absl::Status ColumnsMulti(std::initializer_list<std::pair<const DMat*, float*>> mats,
                            const float* x, int R, int row0 = 0);
  bool SameColumnMatrices(std::initializer_list<std::pair<const DMat*, float*>> mats) const;
  // R rows that are not the step's (the head's logit rows): the column kernels up to
  // ColumnRows(w) rows, else dequantization + cuBLAS.
  // prefill_rows: rows of a step that holds prefill (the head's logit rows of an all_logits
  // prompt): tiled matrices take the column kernels only up to PrefillColumnRows().
  absl::Status LinearRows(const DMat& w, const float* x, int R, float* y, bool accumulate,
                          bool prefill_rows = false);
  // Prefill rows per tiled column segment: the tiled kernel's width, not MMQ's decode widths.
  int PrefillColumnRows() const { return std::min(tiled_max_rows_, copts_.tiled_max_rows); }
  // R rows of x / y through the column kernels (GEMV or tiled mma), kGemvMaxCols (tiled:
  // kTiledMaxCols) columns per launch; every column's result is the same whatever its neighbours.
  absl::Status GemvColumns(const DMat& w, const DMat* w2, const float* x, int R, float* y,
                           GemvEpilogue epilogue);
  // The GEMM segments `segs` of x through dequantization + cuBLAS (F32: SGEMM): each weight
  // chunk is dequantized once and multiplied with every segment on its own, so a segment's
  // result does not depend on the others.
  struct RowSegment;
  absl::Status GemmSegments(const DMat& w, const float* x, std::span<const RowSegment> segs,
                            float* y, bool accumulate);
  // a_ = RMSNorm(h_) * w; for GEMV-sized steps fused with the int8 quantization of a_.
  absl::Status NormToA(const float* w, int R);
  absl::Status EnsureQuantized(const float* x, int R, int K);
  absl::Status EnsureHalf(const float* x, int R, int K);
  // Rows [row0, row0 + n) of x times a matrix's e4m3 copy into y (+ y when accumulate), the
  // activations quantized once for the matrices that share them (prefill_fp8).
  absl::Status GemmFp8Rows(const DMat& w, const float* x, int row0, int n, float* y,
                           bool accumulate);
  // The f16 activations of TiledF16Multi (HalfActivations) in xf_ / xf_scale_, cached like xq_.
  absl::Status EnsureHalfColumns(const float* x, int R, int K);
  // True when a product of a tiled matrix with R columns takes the f16 tensor-core kernel.
  bool F16ColumnRows(int R) const {
    return xf_ != nullptr && copts_.f16_mma && R >= copts_.f16_mma_min_cols &&
           R <= std::min(kTiledF16MaxCols, tiled_max_rows_);
  }
  // Tiled formats other than Q6_K have no int8 kernel: the f16 one at every column count of the
  // column path.
  bool F16Columns(const DMat& w, int R) const {
    return w.tiled && (F16ColumnRows(R) || !TiledInt8Supported(w.type));
  }
  // Rows of a replay's column segment (RowSegment::exact): under the f16 kernel's width.
  int ExactCap() const { return std::max(1, copts_.f16_mma_min_cols - 1); }
  // Tiled matrices: the f16 kernel, MMQ or the tiled column kernel for the launch's segments.
  absl::Status TiledColumns(const GemvArgs* segs, int n, bool f16);
  // The int8 / 16-bit copies of an activation are reused by the matmuls that share it; call this
  // whenever a buffer that may be cached gets new contents.
  void InvalidateX() {
    xq_src_ = nullptr;
    xh_src_ = nullptr;
    x8_src_ = nullptr;
    xf_src_ = nullptr;
  }
  // Records what xq_/xd_ now hold (every quantizer that writes them calls this): `rows` rows of
  // `src`, and whether xsum_ holds their 16-element sums.
  void NoteQuantized(const float* src, int rows, bool sums) {
    xq_src_ = src;
    xq_rows_ = rows;
    xsum_valid_ = sums;
  }
  // Rows that take a matmul on int8 activations (GEMV or tiled kernel): the xq_/xd_ capacity.
  int QuantRows() const { return std::max(copts_.gemv_max_rows, tiled_max_rows_); }
  // Rows up to which a matmul on `w` takes the column kernels (tiled mma or v2 GEMV) rather than
  // dequantization + cuBLAS.
  int ColumnRows(const DMat& w) const { return FamilyCap(Family(w)); }
  // The column rows of family f (Family): the GEMV's, the tiled kernels', the FP8 family's, the
  // small float matrices'.
  int FamilyCap(int f) const {
    return f == 3 ? std::max(copts_.gemv_max_rows, copts_.small_float_max_rows)
                  : f == 2 ? fp8_column_rows_ : f == 1 ? tiled_max_rows_ : copts_.gemv_max_rows;
  }
  // Float matrices small enough that the GEMV's column groups re-read them from L2
  // (CudaBackendOptions::small_float_max_rows).
  static constexpr uint64_t kSmallFloatBytes = 2ull << 20;
  static bool SmallFloat(const DMat& w) {
    const bool float_type = w.type == GgmlType::F32 || w.type == GgmlType::F16 || w.type == GgmlType::BF16;
    return !w.tiled && float_type && GgmlRowBytes(w.type, w.cols) * w.rows <= kSmallFloatBytes;
  }
  // CudaBackendOptions::fp8_decode_rows: the trunk's matrices with dense copies (e4m3 or, for the
  // few matrices of partial 128 x 128 blocks, 16-bit) keep the column kernels only up to
  // fp8_column_rows_ rows; steps with more decode rows multiply the copies (segs_[2]).
  bool Fp8Family(const DMat& w) const {
    return fp8_column_rows_ >= 0 && (w.dense_fp8 != nullptr || w.dense != nullptr);
  }
  int Family(const DMat& w) const { return Fp8Family(w) ? 2 : w.tiled ? 1 : SmallFloat(w) ? 3 : 0; }
  static constexpr int kFamilies = 4;
  bool ColumnPath(const DMat& w, int R) const { return R <= ColumnRows(w); }
  // A piece of the step's rows and the kernels its matmuls take.
  struct RowSegment {
    int row0 = 0;
    int n = 0;
    bool column = false;  // column kernels (n <= ColumnRows), else dequantization + cuBLAS
    // Holds rows of a replay (a non-speculative decode_path run): kept under the f16 kernel's
    // column count, so its rows get the int8 kernels' numbers, those of decoding one by one.
    bool exact = false;
  };
  // Cuts the prepared step's rows into segments for weights of each flavour (see
  // CudaBackendOptions::batch_invariant): segs_[1] for tiled matrices, segs_[0] for the others,
  // segs_[2] for the FP8 decode family (Fp8Family) when fp8_decode_rows is in force, segs_[3]
  // for small float matrices (SmallFloat).
  void PlanRowSegments(const MicroStep& step);
  // The step's segments for one weight flavour, the column and the cuBLAS ones apart (each in
  // row order), split once per micro-step rather than in every matmul.
  struct StepSegments {
    std::vector<RowSegment> column, gemm;
  };
  const StepSegments& SegmentsFor(const DMat& w) const { return segs_[Family(w)]; }
  // TP overlap (CudaBackendOptions::overlap_allreduce): Linear into h_ with segs_[f].gemm cut
  // into overlap_gemm_[f] chunks; after each column segment / chunk, ReduceRowsDone enqueues on
  // comm_ the all-reduce of every planned piece (reduce_pieces_) whose rows are now all written,
  // while stream_ goes on with the next chunk. The weight is dequantized once for all chunks
  // (every layer matrix fits wh_), else once per chunk.
  absl::Status LinearOverlapReduce(const DMat& w, const float* x, int R);
  absl::Status BeginOverlapReduce();
  absl::Status ReduceRowsDone(int row0, int n);
  absl::Status EndOverlapReduce();  // every piece enqueued; sets residual_reduced_

  // ---- forward.cc
  absl::Status GdnMixer(const DLayer& L, int R);
  absl::Status AttnMixer(const DLayer& L, int R);
  // Tensor parallelism: h_ <- Σ over ranks after a row-parallel projection (docs/tp.md §8).
  absl::Status AllReduceResidual(int R);
  // The same, fused with the RMSNorm by `w` into a_ (and the int8 copy of a_) that comes next
  // when the collective offers it (CustomAllReduceCollective; CudaBackendOptions::
  // fuse_allreduce_norm): *normed says whether a_ holds the norm. w = nullptr: the plain one.
  absl::Status AllReduceResidualFusedNorm(const float* w, int R, bool* normed);
  // The row-parallel projection h_ (+)= x · wᵀ of a layer's tail (attn_output / ssm_out,
  // ffn_down). With CudaBackendOptions::overlap_allreduce on a large prefill step
  // (OverlapStep) it also reduces h_ chunk by chunk on comm_ (LinearOverlapReduce) and sets
  // residual_reduced_, so the AllReduceResidualFusedNorm after it only makes stream_ wait for
  // comm_; otherwise it is Linear into h_ and the all-reduce comes after it as before.
  absl::Status ProjectToResidual(const DMat& w, const float* x, int R);
  bool OverlapStep() const;
  // Row-parallel projections accumulate into the residual h_ on rank 0 only; the other ranks
  // store their partial product there. The all-reduce then gives every rank h + Σ_r y_r with no
  // extra buffer or add kernel, and without a collective (or at world 1) the arithmetic is
  // exactly the single-GPU path's h += y.
  bool ResidualOnThisRank() const { return tp_rank_ == 0; }
  // A TP rank that owns no units of a kind (e.g. more ranks than KV heads) skips that block and
  // contributes zeros to its all-reduce: rank 0 leaves h_ as it is, the others clear it.
  absl::Status ContributeNothing(int R);
  bool VocabParallel() const { return tp_world_ > 1 && vocab_parallel_; }
  // Decode attention splits: enough blocks for ~2 waves of the GPU's SMs, none under 256 tokens.
  int AttnSplits(int n_dec) const;

  // ---- outputs.cc
  // Blocking copy between host and device (either way) ordered on stream_. Every transfer of
  // the device goes through it: stream_ is non-blocking, so a plain cudaMemcpy (legacy stream)
  // is not ordered with its kernels, and a pageable host->device cudaMemcpy may return before
  // its DMA lands (that raced the repack of the tiled weights against their staging copy).
  absl::Status Copy(void* dst, const void* src, size_t n) const;
  void ProfBegin(const char* cls);
  void ProfEnd();
  absl::Status FlushProfile();

  ModelConfig cfg_;
  // TP collective (caller-owned, stream-ordered, e.g. NCCL); null = no reduction at all.
  Collective* coll_ = nullptr;
  int tp_rank_ = 0;
  int tp_world_ = 1;
  bool vocab_parallel_ = false;
  // Vocabulary rows [embd_v0_, embd_v1_) of token_embd_ (TP: the rank's vocab-parallel shard,
  // the lm_head's rows; embd_v1_ = -1: the whole table).
  int64_t embd_v0_ = 0, embd_v1_ = -1;
  int n_vocab_local_ = 0;  // lm_head rows on this rank (n_vocab without TP)
  tp::Plan tp_plan_;       // the group's plan (TP only): the MTP head's vocab gather
  int device_ = 0, n_slots_ = 0, slot_ctx_ = 0;
  int sm_count_ = 1;       // multiprocessors of the GPU (cudaDeviceProp)
  CudaBackendOptions copts_;
  DeviceLimits limits_;
  bool bf16_ = true;  // 16-bit GEMM operand type: bf16 on sm_80+, f16 on the portable path
  bool portable_ = false;  // copts_.portable, or compute capability < 8.0 (cuda_options.h)
  // Decode attention on tensor cores: copts_.attn_tensor_cores off the portable path, for
  // shapes the kernel runs (AttnDecodeMmaSupports).
  bool attn_tensor_cores_ = false;
  bool attn_prefill_tensor_cores_ = false;  // the same for prefill (AttnPrefillMmaSupports)
  // Prefill attention on warpgroup tensor cores (copts_.attn_prefill_wgmma, sm_90a builds on
  // compute capability 9.0: AttnPrefillWgmmaAvailable).
  bool attn_prefill_wgmma_ = false;
  bool gdn_scan_mma_ = false;  // copts_.gdn_scan_mma on sm_80+, off the portable path
  bool gdn_bulk_state_ = false;  // copts_.gdn_bulk_state where GdnBulkStateAvailable()
  float* xh_scale_ = nullptr;  // [2] xh_'s f16 range scaling (dequant.cuh), portable path only
  const float* XhScale() const { return bf16_ ? nullptr : xh_scale_; }
  CudaMemoryPlan plan_;
  uint64_t step_weight_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CublasGemm> gemm_;
  void* weights_mem_ = nullptr;
  void* state_mem_ = nullptr;
  void* work_mem_ = nullptr;

  DMat token_embd_, output_;
  const float* output_norm_ = nullptr;
  std::vector<DLayer> layers_;
  GdnShape gdn_shape_;
  AttnShape attn_shape_;
  KvCacheView kv_base_;  // k/v set per layer
  int max_pages_ = 0;        // page table entries per slot (slot_ctx in pages)
  int64_t n_pages_ = 0;      // pages in the KV pool (the planner's pool_pages)
  int32_t* d_table_ = nullptr;       // [n_slots, max_pages] device (kv_base_.block_table)
  const int32_t* SlotPageTable(int slot) const { return d_table_ + static_cast<size_t>(slot) * max_pages_; }
  // Device memory the plan leaves free for graphs, sampler buffers and library handles allocated
  // later (the planner's margin); prefix-cache checkpoints keep twice that free.
  static uint64_t RuntimeHeadroom(uint64_t card_bytes) { return (512ull << 20) + card_bytes / 100; }
  std::vector<int32_t> h_table_;     // its host copy (SaveState / LoadState walk it)
  uint64_t kv_token_bytes_ = 0;  // one token's K (or V) over all KV heads, in copts_.kv_type
  uint64_t mtp_page_bytes_ = 0;  // one page of the MTP layer's f16 K (or V) plane; 0: no MTP block
  // KV pages that n_past positions of a slot fill.
  int SlotPages(int32_t n_past) const { return (n_past + copts_.kv_page_size - 1) / copts_.kv_page_size; }
  // Saved-state bytes of a slot of n_past positions (slot_bytes.h: the layers, then the MTP part).
  size_t SavedStateBytes(int32_t n_past) const;
  // One layer's K then V pages of a slot <-> host memory (K pages, then V pages; to_host: slot ->
  // host), synchronous: through `stage` (a device buffer of 2 * pages pages: one CopyPages and
  // one copy), or with one copy per page when there is none (null).
  absl::Status HostLayerPages(const DLayer& L, int slot, int pages, size_t page_bytes,
                              uint8_t* stage, uint8_t* host, bool to_host) const;
  // The MTP part of a saved state between the slot and `saved` (to_saved: slot -> saved): the MTP
  // plane's K and V pages, then the mask bytes, of which only rows [0, MtpRowsKept) stay set
  // (slot_bytes.h). `on_host`: `saved` is host memory (pages through HostLayerPages with
  // `stage`); else device memory (queued on the stream). The caller sets the slot's MTP length
  // (n_past) after a load. No-op without the MTP block.
  absl::Status CopyMtpPart(int slot, int32_t n_past, uint8_t* saved, bool on_host, uint8_t* stage,
                           bool to_saved) const;

  // Decode rows a micro-step may hold at least (DeviceLimits::max_decode_rows).
  static constexpr int kDecodeRowsMin = 256;
  static constexpr int kMtpRowsMax = 64;  // MTP rows per MtpRows pass (mtp_rows_max_)
  // Workspace (device), sized for max_step_tokens rows.
  int T_max_ = 0, max_k_ = 0, logit_rows_max_ = 64;
  bool tiled_ = false;       // copts_.tiled on a GPU that has the tiled kernel
  bool early_launch_ = false;  // copts_.early_launch on sm_90+ with the tiled kernels
  int tiled_max_rows_ = 0;
  // CudaBackendOptions::fp8_decode_rows in force (FP8 copies made, the trunk tiled): the FP8
  // family's column rows (fp8_decode_rows - 1, at most tiled_max_rows_); -1 = no such family.
  int fp8_column_rows_ = -1;
  // [kIntRows, T_max]: ids, tok_slot, tok_pos, dec_rows, dec_slots, dec_pos, the GDN state
  // indices (out, in) and runs (first, length) of a speculative step, the logit rows; Prepare
  // uploads them in one copy from h_ints_, the same layout.
  static constexpr int kIntRows = 11;
  static constexpr int kLogitRowsRow = 10;
  int32_t* d_ints_ = nullptr;
  // The prepared step's arrays in d_ints_ (kernel arguments): per token row, then per decode run.
  const int32_t* TokenSlots() const { return d_ints_ + T_max_; }
  const int32_t* TokenPositions() const { return d_ints_ + 2 * T_max_; }
  const int32_t* DecodeRows() const { return d_ints_ + 3 * T_max_; }
  const int32_t* DecodeSlots() const { return d_ints_ + 4 * T_max_; }
  const int32_t* DecodePositions() const { return d_ints_ + 5 * T_max_; }
  const int32_t* LogitRows() const { return d_ints_ + kLogitRowsRow * T_max_; }
  ArgmaxScratch argmax_scratch_;     // ArgmaxSplitRows over logit_rows_max rows (work arena)
  int32_t* h_ints_ = nullptr;        // pinned mirror of d_ints_ (the same rows)
  float* h_ = nullptr;      // [T, H] residual stream
  float* a_ = nullptr;      // [T, H] normed
  float* mixed_ = nullptr;  // [T, C]   (also attention qg [T, 2*n_head*hd])
  float* z_ = nullptr;      // [T, Hv*dv]
  float* gb_ = nullptr;     // [T, Hv]
  float* ga_ = nullptr;     // [T, Hv]
  float* gy_ = nullptr;     // [T, C]
  float* gg_ = nullptr;     // [T, Hv]
  float* gbeta_ = nullptr;  // [T, Hv]
  float* gwy_ = nullptr;    // the chunked GDN prefill's scratch (GdnChunkScratchFloats)
  float* mix_out_ = nullptr;  // [T, max(Hv*dv, n_head*hd)]
  float* kx_ = nullptr;     // [T, n_kv*hd]
  float* vx_ = nullptr;     // [T, n_kv*hd]
  float* q_ = nullptr;      // [T, n_head*hd]
  uint16_t* q16_ = nullptr;  // [T, n_head*hd]
  float* ffa_ = nullptr;    // [T, n_ff]
  float* ffb_ = nullptr;    // [T, n_ff]
  int8_t* xq_ = nullptr;    // [QuantRows(), max_k]: a column segment's rows
  float* xd_ = nullptr;     // [QuantRows(), max_k/32]
  // [max_k/16]: sums of 16 xq of a one-row activation (GemvArgs::xsum), valid when xsum_valid_
  // (NoteQuantized): written by EnsureQuantized for R == 1, not by the fused norm / all-reduce quantizers, whose
  // activations feed matrices that gain little from them (kernels/cuda/README.md, "Tiled Q6_K").
  int32_t* xsum_ = nullptr;
  bool xsum_valid_ = false;
  uint16_t* xh_ = nullptr;  // [T, max_k]
  // TiledF16Multi's activations: [QuantRows(), max_k] f16 scaled per row, the [QuantRows()]
  // factors that undo it, and the scratch of its K-split launches.
  uint16_t* xf_ = nullptr;
  float* xf_scale_ = nullptr;
  uint16_t* xf_sums_ = nullptr;  // the sub-block sums of xf_ (GemvArgs::xhs), with kq_tiled_
  TiledF16Scratch f16_scratch_;
  // Every quantized layer matrix has the tiled layout (the 27B Q6_K files): the norms may then
  // write the f16 activations instead of the int8 ones for f16-kernel steps (NormToA).
  bool trunk_tiled_ = false;
  // Some matrix is tiled without an int8 kernel (all but Q6_K, CudaBackendOptions::
  // tiled_f16_formats): the f16 kernel at every column count for those; some is Q4_K / Q5_K
  // (kq_tiled_): xf_ comes with its sub-block sums.
  bool f16_only_tiled_ = false;
  bool kq_tiled_ = false;
  // The prepared step holds exact (replay) segments: LinearRows keeps the head's rows on the
  // int8 kernels too (PlanRowSegments sets it).
  bool step_exact_ = false;
  uint16_t* wh_ = nullptr;  // [wh_elems] dequantized weight scratch
  uint64_t wh_elems_ = 0;
  uint16_t* kt_ = nullptr;  // [slot_ctx, n_kv*hd]
  uint16_t* vt_ = nullptr;
  float* scores_ = nullptr;    // [G, tq, slot_ctx]
  uint16_t* probs_ = nullptr;  // [G, tq, slot_ctx]
  int attn_tq_ = 256;
  float* partials_ = nullptr;  // decode attention partials
  int64_t partial_floats_ = 0;
  float* hn_ = nullptr;      // [logit_rows_max, H]
  float* logits_ = nullptr;  // [logit_rows_max, n_vocab]
  float* logits_part_ = nullptr;    // [logit_rows_max, V_r] vocab-parallel TP: this rank's logits
  float* logits_gather_ = nullptr;  // [world][n_rows][V_r] the gathered ones, rank-major
  // Device sampling (Sample): per-row parameters and penalty pairs, staged on the host and
  // copied before each SampleRows launch; device buffers grow on demand (outside the memory plan:
  // ~64 B per row plus 8 B per penalty pair).
  struct SampleBuffers {
    SampleRowParams* params = nullptr;  // [logit_rows_max]
    PenaltyPair* pairs = nullptr;       // [pairs_cap]
    size_t pairs_cap = 0;
    ~SampleBuffers() {
      cudaFree(params);
      cudaFree(pairs);
    }
  } sample_;
  std::vector<SampleRowParams> h_sample_rows_;
  std::vector<PenaltyPair> h_sample_pairs_;
  const float* xq_src_ = nullptr;  // activation currently in xq_/xd_
  int xq_rows_ = 0;
  const float* xh_src_ = nullptr;  // activation currently in xh_
  int xh_rows_ = 0;
  // CudaBackendOptions::prefill_fp8: the cuBLASLt product with its activation scratch, and the
  // rows it holds quantized (x8_src_: their first row's address).
  std::unique_ptr<Fp8Gemm> fp8_;
  const float* x8_src_ = nullptr;
  int x8_rows_ = 0, x8_k_ = 0;
  const float* xf_src_ = nullptr;  // activation currently in xf_
  int xf_rows_ = 0;

  // The prepared micro-step (host).
  int rows_ = 0, n_logit_rows_ = 0, n_dec_ = 0, n_splits_ = 1;
  int a_normed_for_ = -1;  // a_ holds this layer's attn_norm already (fused TP all-reduce)
  std::vector<RowRun> prefill_;  // runs through the prefill kernels
  // Decode rows in waves: wave w holds the w-th token of every decode-like run (RowRun::
  // decode_like) that has one; GDN steps through the waves in order, attention takes all rows at
  // once. Entries [first, first + n) of the Decode*() arrays; a pure-decode step is one wave.
  struct DecodeWave {
    int first = 0;
    int n = 0;
  };
  std::vector<DecodeWave> waves_;
  StepSegments segs_[kFamilies];
  // TP overlap: segs_[f].gemm with every segment of >= overlap_min_rows rows cut into chunks
  // and the all-reduce pieces (PlanRowSegments), their progress, and the comm stream + events.
  std::vector<RowSegment> overlap_gemm_[kFamilies];
  std::vector<std::pair<int, int>> reduce_pieces_;  // [row0, n) all-reduced together, in order
  std::vector<uint8_t> row_done_;                   // rows the current projection has written
  size_t next_piece_ = 0;                           // first piece not yet enqueued on comm_
  bool residual_reduced_ = false;  // h_ was reduced on comm_ by the last ProjectToResidual
  int64_t overlap_pieces_ = 0;     // all-reduces run on comm_ (tests: the path really ran)
  // A second stream beside stream_, created at first use: `s` waits for stream_ at `fork`,
  // stream_ for `s` at `join`; synchronized before it is destroyed.
  struct AuxStream {
    cudaStream_t s = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
    ~AuxStream() {
      if (s) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
      }
      if (fork) cudaEventDestroy(fork);
      if (join) cudaEventDestroy(join);
    }
  };
  AuxStream comm_;  // the TP overlap's all-reduces
  // Copies that need only the finished micro-steps (CudaBackendOptions::side_copies): the
  // MTP rollback's state copies and the next micro-step's index upload go on side_.s while
  // stream_ runs what was queued after the last Finish (a draft chain), and stream_ waits for
  // side_.join before its next work (no fork: they wait for nothing on stream_).
  AuxStream side_;
  // A micro-step was prepared and not yet finished: its kernels may still read d_ints_ and
  // write recurrent state, so copies keep to stream_.
  bool step_in_flight_ = false;
  // Since the last Finish stream_ was given work the copies may run beside: a draft chain that
  // returned without waiting. Without such work a second stream would only add an event wait.
  bool stream_tail_ = false;
  int64_t side_copy_batches_ = 0;  // copies that went on side_.s (tests: the path really ran)
  // The stream for copies that depend only on finished micro-steps: side_.s when no micro-step
  // is in flight and stream_ has a tail to overlap (the runner finishes each micro-step before it
  // prepares the next, and nothing queued after a Finish but a micro-step writes recurrent state
  // or d_ints_), else stream_. EndSideCopies makes stream_ wait for what was queued on it.
  absl::StatusOr<cudaStream_t> BeginSideCopies();
  absl::Status EndSideCopies(cudaStream_t s);
  std::vector<RowSegment> plan_scratch_;  // PlanRowSegments' working list (kept: no allocation per step)

  // CUDA graphs by shape: run a body eagerly the first time a key is seen, capture it the
  // second, replay it after (at most kMaxGraphs keys; capture failures stay eager).
  struct GraphCache {
    using Key = std::vector<int32_t>;
    static constexpr size_t kMaxGraphs = 128;
    GraphCache(CudaDevice* device, const char* what_it_runs) : dev(device), what(what_it_runs) {}
    CudaDevice* dev;
    const char* what;
    std::map<Key, cudaGraphExec_t> graphs;
    std::set<Key> failed;
    std::map<Key, int> runs;  // eager runs per key not captured yet
    absl::Status Run(const Key& key, const std::function<absl::Status()>& body);
    void Clear();
    ~GraphCache() { Clear(); }
  };
  // Decode-only steps by MicroStep::ShapeKey; MTP draft chains by (catch-up rows, drafts).
  GraphCache step_graphs_{this, "a decode-only step"};
  std::vector<int32_t> shape_key_;  // RunCaptured's key, reused
  GraphCache chain_graphs_{this, "an MTP draft chain"};
  std::vector<int32_t> chain_key_;  // MtpDraftGreedy's key, reused

  bool profiling_ = false;
  std::map<std::string, double> prof_ms_;
  std::vector<std::pair<std::string, std::pair<cudaEvent_t, cudaEvent_t>>> prof_events_;
  std::vector<cudaEvent_t> event_pool_;
  size_t event_next_ = 0;

  // ---- speculative entries and the MTP block (worker/cuda/mtp.cc)
  // GDN state indices: slot s is index s, speculative entry e is index n_slots + e; every GDN
  // layer's rings (and states) lie at a fixed pitch from the previous layer's, so one 2-D copy
  // moves a state index over all layers (CommitSpeculative).
  int n_spec_entries_ = 0;
  float* rings_ = nullptr;   // [n_gdn] x ring_pitch_ bytes, each [n_slots + n_spec, K, C]
  // [n_gdn] x state_pitch_ bytes, each [n_slots + n_spec, Hv, dk, dv] f32 or bf16 (gdn_state_bf16)
  uint8_t* states_ = nullptr;
  uint64_t ring_pitch_ = 0, state_pitch_ = 0;
  int n_gdn_ = 0;
  // The prepared step holds speculative runs: the GDN decode waves read GdnIn() and write
  // GdnOut() (state indices, per decode row).
  bool spec_step_ = false;
  const int32_t* GdnOut() const { return d_ints_ + 6 * T_max_; }
  const int32_t* GdnIn() const { return d_ints_ + 7 * T_max_; }
  // GDN runs (Prepare): device rows 8 and 9 hold each run's first decode entry and length.
  bool gdn_runs_ = false;
  int n_gdn_runs_ = 0;
  const int32_t* GdnRunFirst() const { return d_ints_ + 8 * T_max_; }
  const int32_t* GdnRunLen() const { return d_ints_ + 9 * T_max_; }
  // Per slot: the state index holding its newest speculative state in the current Forward and
  // that token's position (a speculative run cut over micro-steps continues from it); -1 = none.
  std::vector<int32_t> spec_last_, spec_last_pos_;
  // MTP (file has the block and spec_tokens > 0).
  bool has_mtp_ = false;
  DLayer mtp_layer_;  // a full-attention layer; kc / vc are its f16 planes of the pool
  DMat mtp_eh_, mtp_embed_, mtp_head_;
  // The coarse copy of mtp_head_ the drafts multiply (CudaBackendOptions::coarse_draft_head;
  // kernels/cuda/draft_head.cuh), or null.
  uint8_t* mtp_coarse_head_ = nullptr;
  const float* mtp_enorm_ = nullptr;
  const float* mtp_hnorm_ = nullptr;
  const float* mtp_norm_ = nullptr;
  uint8_t* mtp_valid_ = nullptr;  // [n_slots, slot_ctx] device: MTP row written (CPU's mask)
  std::vector<int32_t> mtp_len_;  // [n_slots] rows [0, len) may be valid
  // MTP workspace. Rows of one MtpRows pass (up to mtp_rows_max_; longer runs, e.g. a prompt's
  // rows, go in chunks): cat [R, 2H], u / a / b [R, H], k / v [R, kvw], ints [3R] (tokens,
  // slots, positions). The last row only: qg, q, o, ff [2 n_ff], hid [H], logits [n_vocab],
  // attention partials.
  int mtp_rows_max_ = 0;
  // Passes of one draft chain at most (MtpDraftGreedy: drafts per call): every draft count a
  // request or `--mtp K` may ask for (it was 8, and `generate --mtp 10` failed at its first draft
  // chain: "MtpDraftGreedy: ... 10 drafts", found on an H100 on 2026-12-07).
  static constexpr int kMtpChainMax = sampling::kMaxMtpDrafts;
  // mtp_ints_ (and its pinned mirror h_mtp_ints_): kMtpChainMax pass blocks of MtpBlockInts()
  // (tokens [R], slots [R], positions [R], mask args [4]: slot, pos0, n, old length), then the
  // chain's hidden row indices [R] and its drafts [kMtpChainMax]. MtpRows uses block 0.
  int MtpMaskArgs() const { return 3 * mtp_rows_max_; }
  int MtpBlockInts() const { return 3 * mtp_rows_max_ + 4; }
  int MtpIntsTotal() const { return kMtpChainMax * MtpBlockInts() + mtp_rows_max_ + kMtpChainMax; }

  float *mtp_cat_ = nullptr, *mtp_u_ = nullptr, *mtp_a_ = nullptr, *mtp_b_ = nullptr,
        *mtp_qg_ = nullptr, *mtp_k_ = nullptr, *mtp_v_ = nullptr, *mtp_q_ = nullptr,
        *mtp_o_ = nullptr, *mtp_ff_ = nullptr, *mtp_hid_ = nullptr, *mtp_logits_ = nullptr,
        *mtp_parts_ = nullptr;
  int32_t* mtp_ints_ = nullptr;
  int32_t* h_mtp_ints_ = nullptr;  // pinned [MtpIntsTotal()]: MtpRows and MtpFill (they wait)
  // A draft chain's ints go up from one of kChainMirrors pinned mirrors in turn. A chain that
  // returns without waiting (no drafts, or deferred ones) leaves its upload queued: it records
  // an event after it, and the next use of that mirror waits for it (pending), so no host write
  // lands in a mirror a queued copy still reads. A chain that waits for its drafts leaves every
  // mirror free and records nothing (the default path pays no event calls).
  static constexpr int kChainMirrors = 4;
  int32_t* h_chain_ints_ = nullptr;  // pinned [kChainMirrors][MtpIntsTotal()]
  cudaEvent_t chain_mirror_read_[kChainMirrors] = {};
  bool chain_mirror_pending_[kChainMirrors] = {};
  int chain_mirror_next_ = 0;
  // Deferred drafts (Device::KeepsDeferredDrafts): per device slot, the last deferred chain's
  // drafts on the device (Prepare copies them into the ids of MicroStep::chain_tokens) and their
  // pinned host copy (DeferredDrafts), [n_slots][kMtpChainMax] each.
  //
  // Two halves, [2][n_slots][kMtpChainMax] each: a chain writes the half its slot's last chain
  // did not (chain_half_ then names it), so a chain judged on the device (QueueChainAfterVerify)
  // reads the drafts its verify ran with (verify_half_, set by Prepare) while it writes the next
  // ones, and the host reads the verify's after its wait while that chain may still run.
  int32_t* chain_drafts_ = nullptr;
  int32_t* h_chain_drafts_ = nullptr;
  std::vector<uint8_t> chain_half_;   // [n_slots] the half of the slot's last chain's drafts
  std::vector<uint8_t> verify_half_;  // [n_slots] the half the slot's last verify embedded
  int64_t ChainRow(int slot, int half) const {
    return (static_cast<int64_t>(half) * n_slots_ + slot) * kMtpChainMax;
  }
  // Chains judged on the device were queued after this micro-step's sampling (`sampled_`
  // recorded before them): Finish waits for the event, not the stream.
  cudaEvent_t sampled_ = nullptr;
  bool chains_after_ = false;
  int32_t* last_sample_out_ = nullptr;  // where the last Sample's kernels write its tokens
  // Sampled tokens leave the device through this pinned buffer, which the sampling kernels
  // write themselves (UVA: no device-to-host copy, whose own latency was ~5-6 us between a demo
  // verify and its draft chain); Finish hands them to the caller's destinations after its
  // wait. [tokens_out_max_]: at least kTokensOutMin and a micro-step's logit rows.
  static constexpr int kTokensOutMin = 4096;
  int tokens_out_max_ = 0;
  int32_t* h_tokens_ = nullptr;
  struct PendingTokens {
    int32_t* dst;
    int at, n;
  };
  std::vector<PendingTokens> pending_tokens_;
  int tokens_used_ = 0;
  // Where the next n sampled tokens go on the device side (in h_tokens_), `dst` on the host
  // after Finish.
  absl::StatusOr<int32_t*> TokensOut(int32_t* dst, int n);
  float* h_mtp_f_ = nullptr;  // pinned [mtp_rows_max_ * H + H + n_vocab]: hidden in, hidden / logits out
  // The fused draft chain (kernels/cuda/mtp_chain.cuh; CudaBackendOptions::fused_draft_chain):
  // its arguments but the per-call ones, set at load when the MTP block's shapes and types take
  // it (mtp_chain_.blocks > 0), and its blocks' argmax partials.
  MtpChainArgs mtp_chain_;
  int32_t* mtp_chain_best_ = nullptr;
  int64_t fused_chains_ = 0;
  int64_t judged_chains_ = 0;
  absl::Status SetUpFusedDraftChain();
  int MtpAttnSplits() const;  // most position splits of the MTP attention (partials' size)
  KvCacheView MtpKvView() const;  // the MTP layer's f16 K/V plane of the paged pool
  absl::Status CheckMtp(int slot, int32_t pos0, int n) const;
  // One MTP pass over r rows (mtp.cc): every per-call value on the device.
  absl::Status MtpPass(const int32_t* d_tok, const int32_t* d_slot, const int32_t* d_pos, int r,
                       bool last, const float* hid, const int32_t* hid_rows);
  // The last row's residual u after a row-parallel projection: Σ over the TP group (a rank that
  // computed nothing contributes zeros: rank 0 keeps u, the others clear it). Without TP: nothing.
  absl::Status MtpReduceResidual(float* u, bool contributes);
  // The pass after the attention: MLP, shared_head_norm into mtp_hid_, the head's logits.
  absl::Status MtpTail(float* u);

  void DropSpeculation(int slot);  // forget its speculative chain and MTP rows (reset, load)
};

}  // namespace ds::cuda
