// CudaBackend (see cuda_backend.h). One stream; host work per step is building small index
// arrays; every tensor op is a kernel from kernels/cuda.
#include "worker/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>

#include "absl/strings/str_format.h"
#include "common/collective/collective.h"
#include "common/gguf/gguf.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/gdn.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/sampling.cuh"
#include "worker/model/weights.h"

namespace ds {

std::string CudaMemoryPlan::ToString() const {
  auto gib = [](uint64_t b) { return static_cast<double>(b) / (1ull << 30); };
  return absl::StrFormat("weights %.2f GiB + KV cache %.2f GiB + recurrent state %.2f GiB + "
                         "workspace %.2f GiB = %.2f GiB",
                         gib(weights), gib(kv_cache), gib(recurrent), gib(workspace), gib(total()));
}

namespace cuda {
namespace {

constexpr uint64_t kAlign = 256;
uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

struct DMat {
  GgmlType type = GgmlType::F32;
  const void* d = nullptr;  // [rows, row_bytes] on the device; tiled: kernels/cuda/gemv_tiled.cuh
  int rows = 0, cols = 0;
  uint64_t bytes = 0;
  bool tiled = false;       // Q6_K repacked into 16-row mma tiles at upload
};

struct DLayer {
  bool rec = false;
  const float* attn_norm = nullptr;  // [H]
  const float* post_norm = nullptr;  // [H]
  // GDN
  DMat qkv, gate, beta, alpha, ssm_out;
  GdnLayerParams gdn;
  float* ring = nullptr;   // [n_slots, 4, C]
  float* state = nullptr;  // [n_slots, Hv, dk, dv]
  // attention
  DMat q, k, v, o;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  uint8_t* kc = nullptr;  // [n_pages, page, n_kv, row_bytes] (KvCacheView: f16 or q8_0/q4_0 blocks)
  uint8_t* vc = nullptr;
  // FFN
  DMat ffn_gate, ffn_up, ffn_down;
};

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

class CudaBackend final : public CudaBackendApi {
 public:
  ~CudaBackend() override;
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const std::string& path,
                                                             const BackendOptions& opts,
                                                             const CudaBackendOptions& copts);

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  const ModelConfig& config() const override { return cfg_; }
  int n_slots() const override { return n_slots_; }
  int slot_ctx() const override { return slot_ctx_; }
  absl::Status Forward(std::span<const SeqStep> batch, const StepOptions& opts,
                       StepOutput* out) override;
  // Tensor parallel ranks keep the host path (the executor samples on rank 0 and broadcasts).
  bool SupportsDeviceSampling() const override { return coll_ == nullptr; }
  void ResetSlot(int slot) override;
  int32_t SlotLength(int slot) const override { return slot >= 0 && slot < n_slots_ ? len_[slot] : 0; }
  absl::StatusOr<SlotSnapshot> Snapshot(int slot) const override;
  absl::Status Restore(int slot, const SlotSnapshot& snap) override;

  absl::Status ForwardGreedy(std::span<const SeqStep> batch, std::vector<int32_t>* tokens,
                             double* seconds) override;
  const CudaMemoryPlan& memory_plan() const override { return plan_; }
  const tp::Plan* tp_plan() const override { return tp_world_ > 1 ? &tp_plan_ : nullptr; }
  uint64_t StepWeightBytes() const override { return step_weight_bytes_; }
  void SetProfiling(bool on) override { profiling_ = on; }
  void ResetProfile() override { prof_ms_.clear(); }
  std::vector<std::pair<std::string, double>> ProfileTotals() const override {
    return {prof_ms_.begin(), prof_ms_.end()};
  }

 private:
  CudaBackend() = default;
  absl::Status Init(const std::string& path, const BackendOptions& opts,
                    const CudaBackendOptions& copts);
  absl::Status Validate(std::span<const SeqStep> batch) const;

  // One micro-step: a list of (seq, token range) pieces with <= max_step_tokens rows.
  struct Piece {
    int seq;     // index into the caller's batch
    int t0, n;   // token range of that sequence
    bool last;   // contains the sequence's last token
  };
  // Runs the micro-step; logits of `n_logit_rows` rows end in logits_ (device).
  absl::Status RunMicro(std::span<const SeqStep> batch, const std::vector<Piece>& pieces,
                        int* n_logit_rows);
  absl::Status Layers(int R, bool pure_decode);
  // Tensor parallelism: h_ ← Σ over ranks after a row-parallel projection (docs/tp.md §8).
  absl::Status AllReduceResidual(int R);
  // Row-parallel projections accumulate into the residual h_ on rank 0 only; the other ranks
  // store their partial product there. The all-reduce then gives every rank h + Σ_r y_r with no
  // extra buffer or add kernel, and without a collective (or at world 1) the arithmetic is
  // exactly the single-GPU path's h += y.
  bool ResidualOnThisRank() const { return tp_rank_ == 0; }
  // A TP rank that owns no units of a kind (e.g. more ranks than KV heads) skips that block and
  // contributes zeros to its all-reduce: rank 0 leaves h_ as it is, the others clear it.
  absl::Status ContributeNothing(int R);
  // Norm of the logit rows into hn_ and this rank's lm_head rows into logits_ (logits_part_ when
  // the lm_head is vocab-parallel). Inside the decode graphs.
  absl::Status Head(int n_logit_rows);
  // Vocab-parallel TP: all-gathers every rank's logits into logits_ [n_logit_rows, n_vocab].
  // A blocking collective, so it runs after the step (outside any graph) on every path.
  absl::Status GatherLogits(int n_logit_rows);
  bool VocabParallel() const {
    return tp_world_ > 1 && tp_plan_.lm_head == tp::LmHead::kVocabParallel;
  }
  // Whether this rank ends a step with the full logits: all ranks, except with the lm_head on
  // rank 0 only (BackendOptions::tp_lm_head_rank0), where the others return none (as on CPU).
  bool HasLogits() const { return tp_world_ == 1 || VocabParallel() || tp_rank_ == 0; }
  // Samples the kSample rows among `rows` ([nl], the micro-step's logit rows in logits_) on the
  // device and copies their tokens ([nl], -1 for other rows) to `tokens` (host).
  absl::Status SampleOnDevice(std::span<const DeviceSampleRow> rows, int nl, int32_t* tokens);
  absl::Status Linear(const DMat& w, const float* x, int R, float* y, bool accumulate);
  absl::Status LinearSiluPair(const DMat& g, const DMat& u, const float* x, int R, float* y);
  absl::Status GemvColumns(const DMat& w, const DMat* w2, const float* x, int R, float* y,
                           GemvEpilogue epilogue);
  // Several matrices on the same input x (store epilogue): one GemvMulti launch per column chunk
  // when they share type and K, else one Linear each.
  absl::Status LinearMulti(std::initializer_list<std::pair<const DMat*, float*>> mats,
                           const float* x, int R);
  // a_ = RMSNorm(h_) * w; for GEMV-sized steps fused with the int8 quantization of a_.
  absl::Status NormToA(const float* w, int R);
  absl::Status EnsureQuantized(const float* x, int R, int K);
  absl::Status EnsureHalf(const float* x, int R, int K);
  // The int8 / 16-bit copies of an activation are reused by the matmuls that share it; call this
  // whenever a buffer that may be cached gets new contents.
  void InvalidateX() {
    xq_src_ = nullptr;
    xh_src_ = nullptr;
  }
  // Blocking copy between host and device (either way) ordered on stream_. Every transfer of
  // the backend goes through it: stream_ is non-blocking, so a plain cudaMemcpy (legacy stream)
  // is not ordered with its kernels, and a pageable host->device cudaMemcpy may return before
  // its DMA lands (that raced the repack of the tiled weights against their staging copy).
  absl::Status Copy(void* dst, const void* src, size_t n) const {
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream_));
    DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  void ProfBegin(const char* cls);
  void ProfEnd();
  absl::Status FlushProfile();
  int AttnSplits(int n_dec) const;

  ModelConfig cfg_;
  std::unique_ptr<gguf::File> file_;
  // TP collective (caller-owned, stream-ordered, e.g. NCCL); null = no reduction at all.
  Collective* coll_ = nullptr;
  int tp_rank_ = 0;
  int tp_world_ = 1;
  tp::Plan tp_plan_;       // this group's plan when tp_world_ > 1 (the CPU backend's, MakeTpPlan)
  int n_vocab_local_ = 0;  // lm_head rows on this rank (n_vocab without TP)
  int device_ = 0, n_slots_ = 0, slot_ctx_ = 0;
  CudaBackendOptions copts_;
  bool bf16_ = true;  // 16-bit GEMM operand type: bf16 on sm_80+, f16 below
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
  int max_pages_ = 0;
  uint64_t kv_token_bytes_ = 0;  // one token's K (or V) over all KV heads, in copts_.kv_type
  std::vector<int32_t> len_;

  // Workspace (device), sized for max_step_tokens rows.
  int T_max_ = 0, max_k_ = 0, logit_rows_max_ = 64;
  // Tiled Q6_K (sm_80+; DS_TILED=0 turns it off for A/B runs): matrices repacked at upload run
  // the int8 tensor-core kernel for steps of up to tiled_max_rows_ rows (DS_TILED_MAX_ROWS,
  // default 32: at 64 rows dequantization + cuBLAS measured faster, 54 vs 84 ms per x64 step).
  bool tiled_ = false;
  // Prefill pieces of at least this many tokens run the chunked GDN form (DS_GDN_CHUNK_MIN;
  // 0 = always, a huge value = never), shorter ones the per-token recurrence.
  int gdn_chunk_min_ = 16;
  int tiled_max_rows_ = 0;
  // Rows that take a matmul on int8 activations (GEMV or tiled kernel): the xq_/xd_ capacity.
  int QuantRows() const { return std::max(copts_.gemv_max_rows, tiled_max_rows_); }
  // Whether an R-row matmul on `w` takes the column kernels (tiled mma or v2 GEMV) rather than
  // dequantization + cuBLAS.
  bool ColumnPath(const DMat& w, int R) const {
    return R <= (w.tiled ? tiled_max_rows_ : copts_.gemv_max_rows);
  }
  int32_t* d_ints_ = nullptr;  // [6, T_max]: ids, tok_slot, tok_pos, dec_rows, dec_slots, dec_pos
  int32_t* d_logit_rows_ = nullptr;  // [T_max]
  int32_t* d_argmax_ = nullptr;      // [logit_rows_max]
  int32_t* h_ints_ = nullptr;        // pinned mirror of d_ints_ + d_logit_rows_
  float* h_ = nullptr;      // [T, H] residual stream
  float* a_ = nullptr;      // [T, H] normed
  float* mixed_ = nullptr;  // [T, C]   (also attention qg [T, 2*n_head*hd])
  float* z_ = nullptr;      // [T, Hv*dv]
  float* gb_ = nullptr;     // [T, Hv]
  float* ga_ = nullptr;     // [T, Hv]
  float* gy_ = nullptr;     // [T, C]
  float* gg_ = nullptr;     // [T, Hv]
  float* gbeta_ = nullptr;  // [T, Hv]
  float* mix_out_ = nullptr;  // [T, max(Hv*dv, n_head*hd)]
  float* kx_ = nullptr;     // [T, n_kv*hd]
  float* vx_ = nullptr;     // [T, n_kv*hd]
  float* q_ = nullptr;      // [T, n_head*hd]
  uint16_t* q16_ = nullptr;  // [T, n_head*hd]
  float* ffa_ = nullptr;    // [T, n_ff]
  float* ffb_ = nullptr;    // [T, n_ff]
  int8_t* xq_ = nullptr;    // [QuantRows(), max_k]
  float* xd_ = nullptr;     // [QuantRows(), max_k/32]
  uint16_t* xh_ = nullptr;  // [T, max_k]
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
  // Device sampling (SampleOnDevice): per-row parameters and penalty pairs, staged on the host and
  // copied before each SampleRows launch; device buffers grow on demand (outside the memory plan:
  // ~64 B per row plus 8 B per penalty pair).
  struct SampleBuffers {
    SampleRowParams* params = nullptr;  // [logit_rows_max]
    int32_t* tokens = nullptr;          // [logit_rows_max]
    PenaltyPair* pairs = nullptr;       // [pairs_cap]
    size_t pairs_cap = 0;
    ~SampleBuffers() {
      cudaFree(params);
      cudaFree(tokens);
      cudaFree(pairs);
    }
  } sample_;
  std::vector<SampleRowParams> h_sample_rows_;
  std::vector<PenaltyPair> h_sample_pairs_;
  const float* xq_src_ = nullptr;  // activation currently in xq_/xd_
  int xq_rows_ = 0;
  const float* xh_src_ = nullptr;  // activation currently in xh_
  int xh_rows_ = 0;

  // Current micro-step description (host).
  int n_dec_ = 0;
  struct PrefillSeq {
    int row0, n, slot, pos0;
  };
  std::vector<PrefillSeq> prefill_;

  std::map<int, cudaGraphExec_t> graphs_;  // pure-decode batch size -> graph
  std::map<int, bool> graph_failed_;
  std::map<int, int> decode_runs_;  // eager pure-decode runs per batch size (capture on the 2nd)

  bool profiling_ = false;
  std::map<std::string, double> prof_ms_;
  std::vector<std::pair<std::string, std::pair<cudaEvent_t, cudaEvent_t>>> prof_events_;
  std::vector<cudaEvent_t> event_pool_;
  size_t event_next_ = 0;
};

CudaBackend::~CudaBackend() {
  for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
  for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
  if (h_ints_) cudaFreeHost(h_ints_);
  cudaFree(weights_mem_);
  cudaFree(state_mem_);
  cudaFree(work_mem_);
  if (stream_) cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const std::string& path,
                                                                 const BackendOptions& opts,
                                                                 const CudaBackendOptions& copts) {
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  DS_RETURN_IF_ERROR(b->Init(path, opts, copts));
  return b;
}

absl::Status CudaBackend::Init(const std::string& path, const BackendOptions& opts,
                               const CudaBackendOptions& copts) {
  if (opts.n_slots < 1 || opts.slot_ctx < 1)
    return absl::InvalidArgumentError(absl::StrCat("CUDA backend: n_slots=", opts.n_slots,
                                                   " slot_ctx=", opts.slot_ctx, " must be >= 1"));
  // Tensor parallelism (docs/tp.md): with tp_world > 1 only this rank's shard is uploaded (the
  // CPU backend's plan, MakeTpPlan) and the residual is all-reduced over the collective.
  if (opts.tp_world < 1 || opts.tp_rank < 0 || opts.tp_rank >= opts.tp_world)
    return absl::InvalidArgumentError(absl::StrCat("CUDA backend: tp_rank ", opts.tp_rank,
                                                   " not in a tp_world of ", opts.tp_world));
  if (opts.tp_world > 1 && !opts.collective)
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA backend: tp_world ", opts.tp_world, " needs a collective (nccl, or staged gloo)"));
  if (opts.collective) {
    Collective* c = opts.collective;
    if (c->world() != opts.tp_world || c->rank() != opts.tp_rank)
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA backend: collective ", c->name(), " is rank ", c->rank(), " of ", c->world(),
          " but BackendOptions says rank ", opts.tp_rank, " of ", opts.tp_world));
    if (!c->supports_stream_ordered())
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA backend: collective ", c->name(),
          " cannot reduce device buffers on a stream (use nccl, or gloo through "
          "HostStagedCollective)"));
    coll_ = c;
    tp_rank_ = opts.tp_rank;
    tp_world_ = opts.tp_world;
  }
  copts_ = copts;
  if (!KvTypeSupported(copts_.kv_type))
    return absl::InvalidArgumentError(absl::StrCat("CUDA backend: KV type ",
                                                   KvTypeName(copts_.kv_type),
                                                   " (expected f16, q8_0 or q4_0)"));
  if (opts.kv_type != GgmlType::F16 && opts.kv_type != copts_.kv_type)
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA backend: BackendOptions.kv_type ", KvTypeName(opts.kv_type),
        " disagrees with CudaBackendOptions.kv_type ", KvTypeName(copts_.kv_type)));
  device_ = opts.device;
  n_slots_ = opts.n_slots;
  slot_ctx_ = opts.slot_ctx;
  DS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaDeviceProp prop;
  DS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
  bf16_ = prop.major >= 8;

  DS_ASSIGN_OR_RETURN(file_, gguf::File::Open(path));
  DS_ASSIGN_OR_RETURN(cfg_, ModelConfig::FromGguf(*file_));
  const ModelConfig& c = cfg_;
  // Local sizes: this rank's heads, FFN columns and vocabulary rows (all of them without TP).
  // State and KV stay with the heads that own them; local GDN value heads keep the tiled order,
  // so the unchanged kernels run on the shard (worker/tp/plan.h).
  int n_head = c.n_head, n_kv = c.n_head_kv, gdn_k = c.gdn_k_heads, gdn_v = c.gdn_v_heads;
  n_vocab_local_ = c.n_vocab;
  ModelWeights mw;
  if (tp_world_ > 1) {
    DS_ASSIGN_OR_RETURN(tp_plan_, MakeTpPlan(*file_, c, opts));
    const int r = tp_rank_;
    n_head = tp_plan_.q_heads(r);
    n_kv = tp_plan_.kv_heads(r);
    gdn_k = tp_plan_.gdn_k(r);
    gdn_v = tp_plan_.gdn_v(r);
    n_vocab_local_ = static_cast<int>(tp_plan_.ranks[r].vocab.size());
    DS_ASSIGN_OR_RETURN(mw, ModelWeights::Load(*file_, c, &tp_plan_, r));
  } else {
    DS_ASSIGN_OR_RETURN(mw, ModelWeights::Load(*file_, c));
  }
  gdn_shape_ = GdnShape{gdn_k, gdn_v, c.gdn_k_dim, c.gdn_v_dim, c.conv_kernel};
  if (c.n_recurrent() > 0 && gdn_k > 0) DS_RETURN_IF_ERROR(GdnShapeSupported(gdn_shape_));
  attn_shape_ = AttnShape{n_head, n_kv, c.head_dim, c.n_rot, c.rope_base, c.rms_eps};
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
  uint64_t max_mat_elems = 0;
  {
    const char* e = std::getenv("DS_TILED");
    tiled_ = TiledAvailable(device_) && !(e && std::string(e) == "0");
    const char* gc = std::getenv("DS_GDN_CHUNK_MIN");
    if (gc) gdn_chunk_min_ = std::max(0, std::atoi(gc));
    const char* m = std::getenv("DS_TILED_MAX_ROWS");
    tiled_max_rows_ = tiled_ ? std::clamp(m ? std::atoi(m) : 32, 0, kTiledMaxCols) : 0;
  }
  // Which matrices get the tiled layout: every tiled-format matrix except the embedding (read
  // by row lookups), so also the LM head unless it is tied to the embedding.
  auto tile_it = [&](const cpu::WeightView* w) {
    return tiled_ && w != &mw.token_embd && TiledSupported(w->type) && w->cols % 256 == 0;
  };
  auto mat_bytes = [&](const cpu::WeightView* w) -> uint64_t {
    return tile_it(w) ? TiledBytes(w->type, w->rows, static_cast<int>(w->cols))
                      : GgmlRowBytes(w->type, w->cols) * w->rows;
  };
  uint64_t staging_bytes = 0;  // transient upload buffer of the repack (freed before state/work)
  for (auto& [n, w] : mats) {
    if (!GemvSupported(w->type))
      return absl::UnimplementedError(absl::StrCat("CUDA backend: tensor ", n, " has type ",
                                                   std::string(GgmlInfo(w->type).name),
                                                   " which the CUDA kernels do not support"));
    plan_.weights += AlignUp(mat_bytes(w));
    if (tile_it(w))
      staging_bytes = std::max<uint64_t>(staging_bytes, std::min<uint64_t>(GgmlRowBytes(w->type, w->cols) * w->rows, 64ull << 20) + GgmlRowBytes(w->type, w->cols) * kTiledRows);
    max_k_ = std::max<int>(max_k_, static_cast<int>(w->cols));
    if (w != &mw.output && w != &mw.token_embd)
      max_mat_elems = std::max<uint64_t>(max_mat_elems, static_cast<uint64_t>(w->rows) * w->cols);
  }
  // A tied lm_head is (a row range of) the uploaded embedding: no bytes of its own.
  if (mw.tied_output) plan_.weights -= AlignUp(GgmlRowBytes(mw.output.type, mw.output.cols) * mw.output.rows);
  plan_.weights += small_floats * 4 + 64 * kAlign * c.n_layer;
  for (auto& [n, w] : mats)
    if (w != &mw.token_embd) step_weight_bytes_ += GgmlRowBytes(w->type, w->cols) * w->rows;

  max_pages_ = (slot_ctx_ + copts_.kv_page_size - 1) / copts_.kv_page_size;
  const int n_pages = max_pages_ * n_slots_;
  const uint64_t kv_layer = static_cast<uint64_t>(n_pages) * copts_.kv_page_size * kv_token_bytes_;
  plan_.kv_cache = c.n_attention() * 2 * AlignUp(kv_layer) + AlignUp(static_cast<uint64_t>(n_pages) * 4);
  const int C = c.n_recurrent() > 0 ? gdn_shape_.channels() : 0;
  const uint64_t ring_bytes = static_cast<uint64_t>(n_slots_) * 4 * C * 4;
  const uint64_t st_bytes = static_cast<uint64_t>(n_slots_) * gdn_v * c.gdn_k_dim * c.gdn_v_dim * 4;
  plan_.recurrent = c.n_recurrent() * (AlignUp(ring_bytes) + AlignUp(st_bytes));

  T_max_ = std::max(1, copts_.max_step_tokens);
  const uint64_t T = T_max_, H = c.n_embd;
  const uint64_t Vw = static_cast<uint64_t>(gdn_v) * c.gdn_v_dim;
  const uint64_t qgw = 2ull * n_head * c.head_dim, ow = static_cast<uint64_t>(n_head) * c.head_dim;
  const uint64_t kvw = static_cast<uint64_t>(n_kv) * c.head_dim;
  const int G = n_kv > 0 ? n_head / n_kv : 1;
  const uint64_t n_ff = tp_world_ > 1 ? tp_plan_.ranks[tp_rank_].ffn.size() : c.n_ff;
  // Vocab-parallel lm_head: this rank's logits [rows, V_r] and the gathered ones, rank-major.
  const bool gather = tp_world_ > 1 && tp_plan_.lm_head == tp::LmHead::kVocabParallel;
  const uint64_t part_floats = gather ? static_cast<uint64_t>(logit_rows_max_) * n_vocab_local_ : 0;
  const uint64_t gather_floats = gather ? static_cast<uint64_t>(logit_rows_max_) * c.n_vocab : 0;
  partial_floats_ = AttnDecodePartialFloats(attn_shape_, T_max_, AttnSplits(1));
  wh_elems_ = std::max<uint64_t>(max_mat_elems, static_cast<uint64_t>(c.n_embd) * 4096);
  struct Buf {
    void** p;
    uint64_t bytes;
  };
  std::vector<Buf> bufs = {
      {reinterpret_cast<void**>(&d_ints_), 6 * T * 4},
      {reinterpret_cast<void**>(&d_logit_rows_), T * 4},
      {reinterpret_cast<void**>(&d_argmax_), 64 * 4ull},
      {reinterpret_cast<void**>(&h_), T * H * 4},
      {reinterpret_cast<void**>(&a_), T * H * 4},
      {reinterpret_cast<void**>(&mixed_), T * std::max<uint64_t>(C, qgw) * 4},
      {reinterpret_cast<void**>(&z_), T * Vw * 4},
      {reinterpret_cast<void**>(&gb_), T * gdn_v * 4ull},
      {reinterpret_cast<void**>(&ga_), T * gdn_v * 4ull},
      {reinterpret_cast<void**>(&gy_), T * C * 4},
      {reinterpret_cast<void**>(&gg_), T * gdn_v * 4ull},
      {reinterpret_cast<void**>(&gbeta_), T * gdn_v * 4ull},
      {reinterpret_cast<void**>(&mix_out_), T * std::max(Vw, ow) * 4},
      {reinterpret_cast<void**>(&kx_), T * kvw * 4},
      {reinterpret_cast<void**>(&vx_), T * kvw * 4},
      {reinterpret_cast<void**>(&q_), T * ow * 4},
      {reinterpret_cast<void**>(&q16_), T * ow * 2},
      {reinterpret_cast<void**>(&ffa_), T * n_ff * 4},
      {reinterpret_cast<void**>(&ffb_), T * n_ff * 4},
      {reinterpret_cast<void**>(&xq_), static_cast<uint64_t>(QuantRows()) * max_k_},
      {reinterpret_cast<void**>(&xd_), static_cast<uint64_t>(QuantRows()) * max_k_ / 32 * 4 + 4},
      {reinterpret_cast<void**>(&xh_), T * max_k_ * 2},
      {reinterpret_cast<void**>(&wh_), wh_elems_ * 2},
      {reinterpret_cast<void**>(&kt_), static_cast<uint64_t>(slot_ctx_) * kvw * 2},
      {reinterpret_cast<void**>(&vt_), static_cast<uint64_t>(slot_ctx_) * kvw * 2},
      {reinterpret_cast<void**>(&scores_), static_cast<uint64_t>(G) * attn_tq_ * slot_ctx_ * 4},
      {reinterpret_cast<void**>(&probs_), static_cast<uint64_t>(G) * attn_tq_ * slot_ctx_ * 2},
      {reinterpret_cast<void**>(&partials_), static_cast<uint64_t>(partial_floats_) * 4},
      {reinterpret_cast<void**>(&hn_), static_cast<uint64_t>(logit_rows_max_) * H * 4},
      {reinterpret_cast<void**>(&logits_), static_cast<uint64_t>(logit_rows_max_) * c.n_vocab * 4},
      {reinterpret_cast<void**>(&logits_part_), part_floats * 4},
      {reinterpret_cast<void**>(&logits_gather_), gather_floats * 4},
  };
  for (auto& b : bufs) plan_.workspace += AlignUp(b.bytes);
  plan_.workspace += 64ull << 20;  // cuBLAS workspace and CUDA context slack

  size_t free_b = 0, total_b = 0;
  DS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  if (plan_.total() > free_b || plan_.weights + staging_bytes > free_b)
    return absl::ResourceExhaustedError(absl::StrFormat(
        "CUDA backend: model needs %s (+ %.2f GiB transient upload staging) but device %d has "
        "%.2f GiB free (n_slots=%d, slot_ctx=%d, kv_type=%s); lower --slots/--ctx or "
        "--max-step-tokens, or quantize the KV cache (--kv-type q8_0 / q4_0)",
        plan_.ToString(), static_cast<double>(staging_bytes) / (1ull << 30), device_,
        static_cast<double>(free_b) / (1ull << 30), n_slots_, slot_ctx_,
        KvTypeName(copts_.kv_type)));

  // ---- allocate and upload ----
  DS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DS_ASSIGN_OR_RETURN(CublasGemm * g, CublasGemm::Create());
  gemm_.reset(g);
  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&weights_mem_, plan_.weights));
  Arena wa{static_cast<uint8_t*>(weights_mem_), plan_.weights, 0};
  void* staging = nullptr;
  if (staging_bytes) DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&staging, staging_bytes));
  std::unique_ptr<void, cudaError_t (*)(void*)> staging_owner(staging, cudaFree);
  auto up_mat = [&](const cpu::WeightView& w, DMat* m) -> absl::Status {
    m->type = w.type;
    m->rows = static_cast<int>(w.rows);
    m->cols = static_cast<int>(w.cols);
    m->tiled = tile_it(&w);
    m->bytes = mat_bytes(&w);
    uint8_t* d = wa.Take<uint8_t>(m->bytes);
    m->d = d;
    if (!m->tiled) {
      DS_RETURN_IF_ERROR(Copy(d, w.data, m->bytes));
      return absl::OkStatus();
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
    return absl::OkStatus();
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
  staging_owner.reset();  // before the state and workspace allocations (checked in the plan)

  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&state_mem_, plan_.kv_cache + plan_.recurrent));
  Arena sa{static_cast<uint8_t*>(state_mem_), plan_.kv_cache + plan_.recurrent, 0};
  // Zero KV and recurrent state first: the block table lives in the same arena (it used to be
  // zeroed after its upload, which mapped every page of every slot to page 0).
  DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(state_mem_, 0, plan_.kv_cache + plan_.recurrent, stream_));
  int32_t* table = sa.Take<int32_t>(n_pages);
  {
    std::vector<int32_t> t(n_pages);
    for (int i = 0; i < n_pages; ++i) t[i] = i;  // slot s owns pages [s*max_pages, (s+1)*max_pages)
    DS_RETURN_IF_ERROR(Copy(table, t.data(), n_pages * 4));
  }
  kv_base_ = KvCacheView{nullptr, nullptr,   table,     copts_.kv_page_size,
                         max_pages_, n_kv, c.head_dim, copts_.kv_type};
  for (DLayer& D : layers_) {
    if (D.rec) {
      D.ring = sa.Take<float>(ring_bytes / 4);
      D.state = sa.Take<float>(st_bytes / 4);
    } else {
      D.kc = sa.Take<uint8_t>(kv_layer);
      D.vc = sa.Take<uint8_t>(kv_layer);
    }
  }

  uint64_t work_bytes = 0;
  for (auto& b : bufs) work_bytes += AlignUp(b.bytes);
  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&work_mem_, work_bytes));
  Arena ka{static_cast<uint8_t*>(work_mem_), work_bytes, 0};
  for (auto& b : bufs) *b.p = ka.Take<uint8_t>(b.bytes);
  DS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&h_ints_, 7 * T * 4));
  len_.assign(n_slots_, 0);
  return absl::OkStatus();
}

int CudaBackend::AttnSplits(int n_dec) const {
  // Enough blocks to fill ~2 waves of 132 SMs, but no split shorter than 256 tokens.
  const int want = std::max(1, 264 / std::max(1, attn_shape_.n_kv * n_dec));
  return std::min(want, std::max(1, (slot_ctx_ + 255) / 256));
}

void CudaBackend::ProfBegin(const char* cls) {
  if (!profiling_) return;
  if (event_next_ + 2 > event_pool_.size()) {
    for (int i = 0; i < 64; ++i) {
      cudaEvent_t e;
      cudaEventCreate(&e);
      event_pool_.push_back(e);
    }
  }
  cudaEvent_t a = event_pool_[event_next_++], b = event_pool_[event_next_++];
  cudaEventRecord(a, stream_);
  prof_events_.push_back({cls, {a, b}});
}
void CudaBackend::ProfEnd() {
  if (!profiling_ || prof_events_.empty()) return;
  cudaEventRecord(prof_events_.back().second.second, stream_);
}
absl::Status CudaBackend::FlushProfile() {
  if (prof_events_.empty()) return absl::OkStatus();
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  for (auto& [cls, ev] : prof_events_) {
    float ms = 0;
    DS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev.first, ev.second));
    prof_ms_[cls] += ms;
  }
  prof_events_.clear();
  event_next_ = 0;
  return absl::OkStatus();
}

absl::Status CudaBackend::EnsureQuantized(const float* x, int R, int K) {
  if (xq_src_ == x && xq_rows_ == R) return absl::OkStatus();
  DS_RETURN_IF_ERROR(QuantizeActivations(x, R, K, xq_, xd_, stream_));
  xq_src_ = x;
  xq_rows_ = R;
  return absl::OkStatus();
}
absl::Status CudaBackend::EnsureHalf(const float* x, int R, int K) {
  if (xh_src_ == x && xh_rows_ == R) return absl::OkStatus();
  DS_RETURN_IF_ERROR(ConvertF32ToHalf(x, static_cast<int64_t>(R) * K, xh_, bf16_, stream_));
  xh_src_ = x;
  xh_rows_ = R;
  return absl::OkStatus();
}

// The GEMV path for R <= gemv_max_rows rows: kGemvMaxCols activation columns per weight read.
// `w2` is the second matrix of a kSiluMul pair (same type and shape as w), else nullptr.
absl::Status CudaBackend::GemvColumns(const DMat& w, const DMat* w2, const float* x, int R,
                                      float* y, GemvEpilogue epilogue) {
  const bool qx = w.tiled || GemvWantsQuantizedX(w.type, w.cols);
  if (qx) DS_RETURN_IF_ERROR(EnsureQuantized(x, R, w.cols));
  const int max_cols = w.tiled ? kTiledMaxCols : kGemvMaxCols;
  for (int c0 = 0; c0 < R; c0 += max_cols) {
    GemvArgs a;
    a.type = w.type;
    a.w = w.d;
    if (w2) a.w2 = w2->d;
    a.M = w.rows;
    a.K = w.cols;
    a.nc = std::min(max_cols, R - c0);
    a.x = x + static_cast<int64_t>(c0) * w.cols;
    if (qx) {
      a.xq = xq_ + static_cast<int64_t>(c0) * w.cols;
      a.xd = xd_ + static_cast<int64_t>(c0) * (w.cols / 32);
    }
    a.y = y + static_cast<int64_t>(c0) * w.rows;
    a.epilogue = epilogue;
    DS_RETURN_IF_ERROR(w.tiled ? TiledGemvMulti(&a, 1, stream_) : Gemv(a, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Linear(const DMat& w, const float* x, int R, float* y, bool accumulate) {
  if (ColumnPath(w, R))
    return GemvColumns(w, nullptr, x, R, y,
                       accumulate ? GemvEpilogue::kAccumulate : GemvEpilogue::kStore);
  if (w.type == GgmlType::F32)
    return gemm_->RunF32(static_cast<const float*>(w.d), x, y, w.rows, w.cols, R, w.rows,
                         accumulate ? 1.f : 0.f, stream_);
  DS_RETURN_IF_ERROR(EnsureHalf(x, R, w.cols));
  const uint64_t rb = GgmlRowBytes(w.type, w.cols);
  const int chunk = static_cast<int>(std::min<uint64_t>(w.rows, wh_elems_ / w.cols));
  for (int m0 = 0; m0 < w.rows; m0 += chunk) {
    const int mc = std::min(chunk, w.rows - m0);
    if (w.tiled)
      DS_RETURN_IF_ERROR(DequantizeTiledRows(w.type, w.d, m0, mc, w.cols, wh_, bf16_, stream_));
    else
      DS_RETURN_IF_ERROR(DequantizeRows(w.type, static_cast<const uint8_t*>(w.d) + m0 * rb, mc,
                                        w.cols, wh_, bf16_, stream_));
    DS_RETURN_IF_ERROR(gemm_->Run(wh_, xh_, y + m0, mc, w.cols, R, w.rows, bf16_,
                                  accumulate ? 1.f : 0.f, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::LinearMulti(std::initializer_list<std::pair<const DMat*, float*>> mats,
                                      const float* x, int R) {
  const DMat& m0 = *mats.begin()->first;
  bool same = ColumnPath(m0, R) &&
              static_cast<int>(mats.size()) <= kGemvMaxSegs;
  for (auto& [m, y] : mats)
    same = same && m->type == m0.type && m->cols == m0.cols && m->tiled == m0.tiled;
  if (!same) {
    for (auto& [m, y] : mats) DS_RETURN_IF_ERROR(Linear(*m, x, R, y, false));
    return absl::OkStatus();
  }
  const bool qx = m0.tiled || GemvWantsQuantizedX(m0.type, m0.cols);
  if (qx) DS_RETURN_IF_ERROR(EnsureQuantized(x, R, m0.cols));
  const int max_cols = m0.tiled ? kTiledMaxCols : kGemvMaxCols;
  for (int c0 = 0; c0 < R; c0 += max_cols) {
    GemvArgs segs[kGemvMaxSegs];
    int n = 0;
    for (auto& [m, y] : mats) {
      GemvArgs& a = segs[n++];
      a.type = m->type;
      a.w = m->d;
      a.M = m->rows;
      a.K = m->cols;
      a.nc = std::min(max_cols, R - c0);
      a.x = x + static_cast<int64_t>(c0) * m->cols;
      if (qx) {
        a.xq = xq_ + static_cast<int64_t>(c0) * m->cols;
        a.xd = xd_ + static_cast<int64_t>(c0) * (m->cols / 32);
      }
      a.y = y + static_cast<int64_t>(c0) * m->rows;
      a.epilogue = GemvEpilogue::kStore;
    }
    DS_RETURN_IF_ERROR(m0.tiled ? TiledGemvMulti(segs, n, stream_) : GemvMulti(segs, n, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::NormToA(const float* w, int R) {
  const int H = cfg_.n_embd;
  InvalidateX();
  if (R <= QuantRows() && H % 32 == 0) {
    DS_RETURN_IF_ERROR(RmsNormQuantize(h_, w, a_, xq_, xd_, R, H, cfg_.rms_eps, stream_));
    xq_src_ = a_;
    xq_rows_ = R;
    return absl::OkStatus();
  }
  return RmsNormRows(h_, H, nullptr, w, a_, R, H, cfg_.rms_eps, stream_);
}

absl::Status CudaBackend::LinearSiluPair(const DMat& g, const DMat& u, const float* x, int R,
                                         float* y) {
  if (g.type == u.type && g.tiled == u.tiled && ColumnPath(g, R))
    return GemvColumns(g, &u, x, R, y, GemvEpilogue::kSiluMul);
  DS_RETURN_IF_ERROR(Linear(g, x, R, y, false));
  DS_RETURN_IF_ERROR(Linear(u, x, R, ffb_, false));
  return SiluMul(y, ffb_, y, static_cast<int64_t>(R) * g.rows, stream_);
}

absl::Status CudaBackend::Layers(int R, bool pure_decode) {
  const ModelConfig& c = cfg_;
  const int H = c.n_embd;
  const int32_t* d_ids = d_ints_;
  const int32_t* d_tok_slot = d_ints_ + T_max_;
  const int32_t* d_tok_pos = d_ints_ + 2 * T_max_;
  const int32_t* d_dec_rows = d_ints_ + 3 * T_max_;
  const int32_t* d_dec_slots = d_ints_ + 4 * T_max_;
  const int32_t* d_dec_pos = d_ints_ + 5 * T_max_;
  InvalidateX();
  ProfBegin("embed");
  DS_RETURN_IF_ERROR(EmbedRows(token_embd_.type, token_embd_.d, H, d_ids, R, h_, stream_));
  ProfEnd();
  const int n_splits = AttnSplits(std::max(1, n_dec_));
  for (const DLayer& L : layers_) {
    ProfBegin("norm");
    DS_RETURN_IF_ERROR(NormToA(L.attn_norm, R));
    ProfEnd();
    if ((L.rec && gdn_shape_.k_heads == 0) || (!L.rec && attn_shape_.n_kv == 0)) {
      DS_RETURN_IF_ERROR(ContributeNothing(R));  // TP rank without heads of this mixer
      DS_RETURN_IF_ERROR(AllReduceResidual(R));
    } else if (L.rec) {
      const GdnShape& s = gdn_shape_;
      const int C = s.channels(), Vw = s.v_heads * s.v_dim;
      ProfBegin("gdn_proj");
      DS_RETURN_IF_ERROR(LinearMulti({{&L.qkv, mixed_}, {&L.gate, z_}}, a_, R));
      DS_RETURN_IF_ERROR(LinearMulti({{&L.beta, gb_}, {&L.alpha, ga_}}, a_, R));
      ProfEnd();
      ProfBegin("gdn_core");
      if (n_dec_ > 0) {
        GdnDecodeArgs a;
        a.shape = s; a.p = L.gdn; a.n_seqs = n_dec_;
        a.rows = d_dec_rows; a.slots = d_dec_slots; a.pos = d_dec_pos;
        a.mixed = mixed_; a.z = z_; a.b = gb_; a.alpha = ga_;
        a.conv_ring = L.ring; a.state = L.state; a.out = mix_out_;
        DS_RETURN_IF_ERROR(GdnDecode(a, stream_));
      }
      for (const PrefillSeq& p : prefill_) {
        GdnPrefillArgs a;
        a.shape = s; a.p = L.gdn; a.T = p.n; a.slot = p.slot; a.pos0 = p.pos0;
        a.mixed = mixed_ + static_cast<int64_t>(p.row0) * C;
        a.z = z_ + static_cast<int64_t>(p.row0) * Vw;
        a.b = gb_ + static_cast<int64_t>(p.row0) * s.v_heads;
        a.alpha = ga_ + static_cast<int64_t>(p.row0) * s.v_heads;
        a.conv_ring = L.ring; a.state = L.state;
        a.y = gy_; a.g = gg_; a.beta = gbeta_;
        a.out = mix_out_ + static_cast<int64_t>(p.row0) * Vw;
        a.chunk = p.n >= gdn_chunk_min_ ? kGdnChunk : 0;
        DS_RETURN_IF_ERROR(GdnPrefill(a, stream_));
      }
      ProfEnd();
      ProfBegin("gdn_proj");
      InvalidateX();
      DS_RETURN_IF_ERROR(Linear(L.ssm_out, mix_out_, R, h_, ResidualOnThisRank()));
      ProfEnd();
      DS_RETURN_IF_ERROR(AllReduceResidual(R));
    } else {
      const AttnShape& s = attn_shape_;
      ProfBegin("attn_proj");
      DS_RETURN_IF_ERROR(LinearMulti({{&L.q, mixed_}, {&L.k, kx_}, {&L.v, vx_}}, a_, R));
      ProfEnd();
      ProfBegin("attn_core");
      KvCacheView kv = kv_base_;
      kv.k = L.kc;
      kv.v = L.vc;
      QkvPrepArgs pa;
      pa.shape = s; pa.T = R; pa.tok_slot = d_tok_slot; pa.tok_pos = d_tok_pos;
      pa.qg = mixed_; pa.k = kx_; pa.v = vx_; pa.q_norm = L.q_norm; pa.k_norm = L.k_norm;
      pa.q_out = q_; pa.q16 = prefill_.empty() ? nullptr : q16_; pa.kv = kv;
      DS_RETURN_IF_ERROR(QkvPrep(pa, stream_));
      if (n_dec_ > 0) {
        AttnDecodeArgs a;
        a.shape = s; a.n_seqs = n_dec_; a.rows = d_dec_rows; a.slots = d_dec_slots; a.pos = d_dec_pos;
        a.q = q_; a.qg = mixed_; a.kv = kv; a.n_splits = n_splits; a.partials = partials_;
        a.out = mix_out_;
        DS_RETURN_IF_ERROR(AttnDecode(a, stream_));
      }
      const int64_t ow = static_cast<int64_t>(s.n_head) * s.hd, qgw = 2 * ow;
      for (const PrefillSeq& p : prefill_) {
        AttnPrefillArgs a;
        a.shape = s; a.T = p.n; a.pos0 = p.pos0; a.slot = p.slot;
        a.q16 = q16_ + p.row0 * ow; a.qg = mixed_ + p.row0 * qgw; a.kv = kv;
        a.k_tmp = kt_; a.v_tmp = vt_; a.scores = scores_; a.probs = probs_; a.tq = attn_tq_;
        a.out = mix_out_ + p.row0 * ow;
        DS_RETURN_IF_ERROR(AttnPrefill(a, gemm_.get(), stream_));
      }
      ProfEnd();
      ProfBegin("attn_proj");
      InvalidateX();
      DS_RETURN_IF_ERROR(Linear(L.o, mix_out_, R, h_, ResidualOnThisRank()));
      ProfEnd();
      DS_RETURN_IF_ERROR(AllReduceResidual(R));
    }
    ProfBegin("norm");
    DS_RETURN_IF_ERROR(NormToA(L.post_norm, R));
    ProfEnd();
    ProfBegin("ffn");
    if (L.ffn_gate.rows == 0) {  // TP rank without FFN columns
      DS_RETURN_IF_ERROR(ContributeNothing(R));
    } else {
      DS_RETURN_IF_ERROR(LinearSiluPair(L.ffn_gate, L.ffn_up, a_, R, ffa_));
      InvalidateX();
      DS_RETURN_IF_ERROR(Linear(L.ffn_down, ffa_, R, h_, ResidualOnThisRank()));
    }
    ProfEnd();
    DS_RETURN_IF_ERROR(AllReduceResidual(R));
  }
  (void)pure_decode;
  return absl::OkStatus();
}

absl::Status CudaBackend::AllReduceResidual(int R) {
  if (!coll_) return absl::OkStatus();
  // Enqueued on stream_ after the projection, no host sync: it orders like a kernel and is
  // captured into the decode graphs like one (the first pure-decode step of a batch size runs
  // eagerly, so NCCL's lazy connection setup never happens during capture).
  ProfBegin("allreduce");
  absl::Status st =
      coll_->AllReduceSumOnStream(h_, static_cast<size_t>(R) * cfg_.n_embd, stream_);
  ProfEnd();
  return st;
}

absl::Status CudaBackend::ContributeNothing(int R) {
  InvalidateX();
  if (ResidualOnThisRank()) return absl::OkStatus();
  DS_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(h_, 0, static_cast<size_t>(R) * cfg_.n_embd * sizeof(float), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Head(int n_logit_rows) {
  // Leading micro-steps of a long prefill produce no logits: nothing to do (and a zero-row launch
  // is an invalid configuration).
  if (n_logit_rows == 0) return absl::OkStatus();
  ProfBegin("lm_head");
  DS_RETURN_IF_ERROR(RmsNormRows(h_, cfg_.n_embd, d_logit_rows_, output_norm_, hn_, n_logit_rows,
                                 cfg_.n_embd, cfg_.rms_eps, stream_));
  InvalidateX();
  // Under TP with the lm_head on rank 0 only, the other ranks hold no rows of it.
  if (n_vocab_local_ > 0)
    DS_RETURN_IF_ERROR(
        Linear(output_, hn_, n_logit_rows, VocabParallel() ? logits_part_ : logits_, false));
  ProfEnd();
  return absl::OkStatus();
}

absl::Status CudaBackend::GatherLogits(int n_logit_rows) {
  if (!VocabParallel() || n_logit_rows == 0) return absl::OkStatus();
  // The gather takes device buffers but is not stream-ordered (NCCL runs it on its own stream,
  // the staged collective through host copies): the local logits must be complete first.
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  const int64_t n = n_logit_rows;
  std::vector<size_t> counts(tp_world_);
  for (int r = 0; r < tp_world_; ++r) counts[r] = n * tp_plan_.ranks[r].vocab.size();
  DS_RETURN_IF_ERROR(coll_->AllGatherV(logits_part_, counts, logits_gather_));
  // [r][n][V_r] rank-major → [n][V]: rank r's block is an n × V_r matrix that lands in columns
  // [v0_r, v1_r) of every row (one strided copy per rank).
  const float* src = logits_gather_;
  for (int r = 0; r < tp_world_; ++r) {
    const tp::Range v = tp_plan_.ranks[r].vocab;
    if (v.size() > 0)
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
          logits_ + v.begin, static_cast<size_t>(cfg_.n_vocab) * sizeof(float), src,
          static_cast<size_t>(v.size()) * sizeof(float), static_cast<size_t>(v.size()) * sizeof(float),
          static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream_));
    src += n * v.size();
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::SampleOnDevice(std::span<const DeviceSampleRow> rows, int nl,
                                         int32_t* tokens) {
  h_sample_rows_.clear();
  h_sample_pairs_.clear();
  bool any = false;
  for (int r = 0; r < nl; ++r) {
    const DeviceSampleRow& d = rows[r];
    const bool sample = d.mode == DeviceSampleRow::Mode::kSample && d.params != nullptr;
    static const sampling::SamplingParams kNone;
    PackSampleRow(sample ? *d.params : kNone, d.history, cfg_.n_vocab, d.uniform, !sample,
                  &h_sample_rows_, &h_sample_pairs_);
    any |= sample;
  }
  if (!any) {
    std::fill(tokens, tokens + nl, -1);
    return absl::OkStatus();
  }
  if (sample_.params == nullptr) {
    DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&sample_.params, logit_rows_max_ * sizeof(SampleRowParams)));
    DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&sample_.tokens, logit_rows_max_ * sizeof(int32_t)));
  }
  if (h_sample_pairs_.size() > sample_.pairs_cap) {
    // The previous launch may still read the old buffer: cudaFree synchronizes the device.
    cudaFree(sample_.pairs);
    sample_.pairs = nullptr;
    sample_.pairs_cap = 0;
    const size_t cap = std::max<size_t>(h_sample_pairs_.size() * 2, 4096);
    DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&sample_.pairs, cap * sizeof(PenaltyPair)));
    sample_.pairs_cap = cap;
  }
  // Pageable sources: the copies are staged before cudaMemcpyAsync returns, so the host vectors
  // may be reused at once.
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sample_.params, h_sample_rows_.data(),
                                          nl * sizeof(SampleRowParams), cudaMemcpyHostToDevice,
                                          stream_));
  if (!h_sample_pairs_.empty())
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sample_.pairs, h_sample_pairs_.data(),
                                            h_sample_pairs_.size() * sizeof(PenaltyPair),
                                            cudaMemcpyHostToDevice, stream_));
  ProfBegin("sample");
  DS_RETURN_IF_ERROR(SampleRows(logits_, cfg_.n_vocab, nl, cfg_.n_vocab, sample_.params,
                                sample_.pairs, sample_.tokens, stream_));
  ProfEnd();
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tokens, sample_.tokens, nl * sizeof(int32_t),
                                          cudaMemcpyDeviceToHost, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Validate(std::span<const SeqStep> batch) const {
  if (batch.empty()) return absl::InvalidArgumentError("Forward: empty batch");
  std::vector<bool> seen(n_slots_, false);
  for (const SeqStep& s : batch) {
    if (s.slot < 0 || s.slot >= n_slots_)
      return absl::InvalidArgumentError(absl::StrCat("Forward: slot ", s.slot, " outside [0, ", n_slots_, ")"));
    if (seen[s.slot]) return absl::InvalidArgumentError(absl::StrCat("Forward: slot ", s.slot, " appears twice"));
    seen[s.slot] = true;
    if (s.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("Forward: slot ", s.slot, " has no tokens"));
    if (s.pos0 != len_[s.slot])
      return absl::InvalidArgumentError(absl::StrCat("Forward: slot ", s.slot, " pos0 ", s.pos0,
                                                     " != slot length ", len_[s.slot]));
    if (static_cast<int64_t>(s.pos0) + s.tokens.size() > static_cast<uint64_t>(slot_ctx_))
      return absl::OutOfRangeError(absl::StrCat("Forward: slot ", s.slot, " would hold ",
                                                s.pos0 + s.tokens.size(), " tokens > slot_ctx ", slot_ctx_));
    for (int32_t t : s.tokens)
      if (t < 0 || t >= cfg_.n_vocab)
        return absl::InvalidArgumentError(absl::StrCat("Forward: token id ", t, " outside [0, ", cfg_.n_vocab, ")"));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::RunMicro(std::span<const SeqStep> batch, const std::vector<Piece>& pieces,
                                   int* n_logit_rows) {
  // Host index arrays: token rows in piece order; decode = pieces of one token.
  int32_t* ids = h_ints_;
  int32_t* tslot = h_ints_ + T_max_;
  int32_t* tpos = h_ints_ + 2 * T_max_;
  int32_t* drow = h_ints_ + 3 * T_max_;
  int32_t* dslot = h_ints_ + 4 * T_max_;
  int32_t* dpos = h_ints_ + 5 * T_max_;
  int32_t* lrows = h_ints_ + 6 * T_max_;
  int R = 0, nl = 0;
  n_dec_ = 0;
  prefill_.clear();
  bool pure_decode = true;
  for (const Piece& p : pieces) {
    const SeqStep& s = batch[p.seq];
    const int slot = s.slot, pos0 = s.pos0 + p.t0;
    for (int t = 0; t < p.n; ++t) {
      ids[R + t] = s.tokens[p.t0 + t];
      tslot[R + t] = slot;
      tpos[R + t] = pos0 + t;
      if (s.all_logits || (p.last && t == p.n - 1)) lrows[nl++] = R + t;
    }
    if (p.n == 1) {
      drow[n_dec_] = R;
      dslot[n_dec_] = slot;
      dpos[n_dec_] = pos0;
      ++n_dec_;
    } else {
      prefill_.push_back({R, p.n, slot, pos0});
      pure_decode = false;
    }
    if (s.all_logits || !p.last) pure_decode = false;
    R += p.n;
  }
  if (nl > logit_rows_max_)
    return absl::UnimplementedError(absl::StrCat("Forward: ", nl, " logit rows in one micro-step > ", logit_rows_max_));
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_ints_, h_ints_, 6ull * T_max_ * 4, cudaMemcpyHostToDevice, stream_));
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_logit_rows_, lrows, static_cast<size_t>(std::max(nl, 1)) * 4,
                                          cudaMemcpyHostToDevice, stream_));
  *n_logit_rows = nl;

  // The first pure-decode step of a batch size runs eagerly so that lazy library state (cuBLAS
  // workspaces for the R > gemv_max_rows path) exists before capture; the second one captures.
  // A collective that cannot be captured (the host-staged one) keeps every step eager.
  const bool graph = pure_decode && copts_.use_graphs && !profiling_ &&
                     (!coll_ || coll_->graph_capturable()) && !graph_failed_[R] &&
                     decode_runs_[R]++ > 0;
  if (graph) {
    auto it = graphs_.find(R);
    if (it == graphs_.end()) {
      cudaGraph_t g = nullptr;
      DS_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      absl::Status st = Layers(R, true);
      if (st.ok()) st = Head(nl);
      cudaError_t e = cudaStreamEndCapture(stream_, &g);
      cudaGraphExec_t exec = nullptr;
      if (st.ok() && e == cudaSuccess && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess) {
        it = graphs_.emplace(R, exec).first;
      } else {
        std::fprintf(stderr, "cuda backend: graph capture for batch %d failed (%s); running eagerly\n",
                     R, st.ok() ? cudaGetErrorString(e) : st.ToString().c_str());
        cudaGetLastError();
        graph_failed_[R] = true;
      }
      if (g) cudaGraphDestroy(g);
    }
    if (it != graphs_.end()) {
      DS_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_));
      return GatherLogits(nl);
    }
  }
  DS_RETURN_IF_ERROR(Layers(R, pure_decode));
  DS_RETURN_IF_ERROR(Head(nl));
  return GatherLogits(nl);
}

absl::Status CudaBackend::Forward(std::span<const SeqStep> batch, const StepOptions& opts,
                                  StepOutput* out) {
  DS_RETURN_IF_ERROR(Validate(batch));
  // Device sampling: one entry per output row; logits cross PCIe only if a row asks for them.
  const std::span<const DeviceSampleRow> dev = opts.device_sample;
  bool host_logits = true;
  if (!dev.empty()) {
    if (!SupportsDeviceSampling())
      return absl::InvalidArgumentError("Forward: device sampling is not available under TP");
    size_t n_out = 0;
    for (const SeqStep& s : batch) n_out += s.all_logits ? s.tokens.size() : 1;
    if (dev.size() != n_out)
      return absl::InvalidArgumentError(absl::StrCat("Forward: ", dev.size(),
                                                     " device_sample rows for ", n_out, " output rows"));
    host_logits = false;
    for (const DeviceSampleRow& d : dev) host_logits |= d.mode == DeviceSampleRow::Mode::kLogits;
  }
  const auto t0 = std::chrono::steady_clock::now();
  out->logits.clear();
  out->hidden.clear();
  out->tokens.assign(dev.size(), -1);
  out->n_rows = 0;
  std::vector<Piece> pieces;
  int rows = 0;
  auto flush = [&]() -> absl::Status {
    if (pieces.empty()) return absl::OkStatus();
    int nl = 0;
    DS_RETURN_IF_ERROR(RunMicro(batch, pieces, &nl));
    if (nl > 0) {
      if (!dev.empty())
        DS_RETURN_IF_ERROR(SampleOnDevice(dev.subspan(out->n_rows, nl), nl,
                                          out->tokens.data() + out->n_rows));
      if (host_logits && HasLogits()) {
        const size_t old = out->logits.size();
        out->logits.resize(old + static_cast<size_t>(nl) * cfg_.n_vocab);
        DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->logits.data() + old, logits_,
                                                static_cast<size_t>(nl) * cfg_.n_vocab * 4,
                                                cudaMemcpyDeviceToHost, stream_));
      }
      if (opts.want_hidden) {
        const size_t oh = out->hidden.size();
        out->hidden.resize(oh + static_cast<size_t>(nl) * cfg_.n_embd);
        DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->hidden.data() + oh, hn_,
                                                static_cast<size_t>(nl) * cfg_.n_embd * 4,
                                                cudaMemcpyDeviceToHost, stream_));
      }
      DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      out->n_rows += nl;
    }
    DS_RETURN_IF_ERROR(FlushProfile());
    pieces.clear();
    rows = 0;
    return absl::OkStatus();
  };
  for (int i = 0; i < static_cast<int>(batch.size()); ++i) {
    const int n = static_cast<int>(batch[i].tokens.size());
    // all_logits rows are limited by the logits buffer: cap pieces at logit_rows_max_ then.
    const int cap = batch[i].all_logits ? logit_rows_max_ : T_max_;
    for (int t0 = 0; t0 < n;) {
      int take = std::min({n - t0, cap, T_max_ - rows});
      int logit_rows_now = 0;
      for (const Piece& p : pieces) logit_rows_now += batch[p.seq].all_logits ? p.n : (p.last ? 1 : 0);
      if (batch[i].all_logits)
        take = std::min(take, logit_rows_max_ - logit_rows_now);
      else if (t0 + take == n && logit_rows_now >= logit_rows_max_)
        take = 0;  // the last piece needs a logit row too (e.g. 64 all_logits rows + this one)
      if (take <= 0) {
        DS_RETURN_IF_ERROR(flush());
        continue;
      }
      pieces.push_back({i, t0, take, t0 + take == n});
      rows += take;
      t0 += take;
      if (rows == T_max_) DS_RETURN_IF_ERROR(flush());
    }
  }
  DS_RETURN_IF_ERROR(flush());
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  for (const SeqStep& s : batch) len_[s.slot] += static_cast<int32_t>(s.tokens.size());
  out->forward_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return absl::OkStatus();
}

absl::Status CudaBackend::ForwardGreedy(std::span<const SeqStep> batch, std::vector<int32_t>* tokens,
                                        double* seconds) {
  DS_RETURN_IF_ERROR(Validate(batch));
  for (const SeqStep& s : batch)
    if (s.all_logits) return absl::InvalidArgumentError("ForwardGreedy: all_logits not supported");
  const auto t0 = std::chrono::steady_clock::now();
  tokens->clear();
  std::vector<Piece> pieces;
  int rows = 0;
  auto flush = [&]() -> absl::Status {
    if (pieces.empty()) return absl::OkStatus();
    int nl = 0;
    DS_RETURN_IF_ERROR(RunMicro(batch, pieces, &nl));
    if (nl > 0 && HasLogits()) {  // TP, lm_head on rank 0 only: the other ranks sample nothing
      ProfBegin("sample");
      DS_RETURN_IF_ERROR(ArgmaxRows(logits_, cfg_.n_vocab, nl, cfg_.n_vocab, d_argmax_, stream_));
      ProfEnd();
      const size_t old = tokens->size();
      tokens->resize(old + nl);
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tokens->data() + old, d_argmax_, nl * 4ull,
                                              cudaMemcpyDeviceToHost, stream_));
      DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    DS_RETURN_IF_ERROR(FlushProfile());
    pieces.clear();
    rows = 0;
    return absl::OkStatus();
  };
  for (int i = 0; i < static_cast<int>(batch.size()); ++i) {
    const int n = static_cast<int>(batch[i].tokens.size());
    for (int t0 = 0; t0 < n;) {
      const int take = std::min(n - t0, T_max_ - rows);
      if (take <= 0 || (static_cast<int>(pieces.size()) >= logit_rows_max_)) {
        DS_RETURN_IF_ERROR(flush());
        continue;
      }
      pieces.push_back({i, t0, take, t0 + take == n});
      rows += take;
      t0 += take;
      if (rows == T_max_) DS_RETURN_IF_ERROR(flush());
    }
  }
  DS_RETURN_IF_ERROR(flush());
  for (const SeqStep& s : batch) len_[s.slot] += static_cast<int32_t>(s.tokens.size());
  if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return absl::OkStatus();
}

void CudaBackend::ResetSlot(int slot) {
  if (slot < 0 || slot >= n_slots_) return;
  const int C = gdn_shape_.channels();
  const size_t ring = 4ull * C, st = static_cast<size_t>(gdn_shape_.v_heads) * gdn_shape_.k_dim * gdn_shape_.v_dim;
  for (DLayer& L : layers_) {
    if (!L.rec) continue;
    cudaMemsetAsync(L.ring + slot * ring, 0, ring * 4, stream_);
    cudaMemsetAsync(L.state + slot * st, 0, st * 4, stream_);
  }
  cudaStreamSynchronize(stream_);
  len_[slot] = 0;
}

absl::StatusOr<SlotSnapshot> CudaBackend::Snapshot(int slot) const {
  if (slot < 0 || slot >= n_slots_) return absl::InvalidArgumentError(absl::StrCat("Snapshot: bad slot ", slot));
  SlotSnapshot snap;
  snap.n_past = len_[slot];
  const int C = gdn_shape_.channels();
  const size_t ring = 4ull * C * 4, st = static_cast<size_t>(gdn_shape_.v_heads) * gdn_shape_.k_dim * gdn_shape_.v_dim * 4;
  const size_t page_bytes = kv_token_bytes_ * copts_.kv_page_size;
  const int pages = (snap.n_past + copts_.kv_page_size - 1) / copts_.kv_page_size;
  size_t total = 0;
  for (const DLayer& L : layers_) total += L.rec ? ring + st : 2 * pages * page_bytes;
  snap.bytes.resize(total);
  uint8_t* p = snap.bytes.data();
  for (const DLayer& L : layers_) {
    if (L.rec) {
      DS_RETURN_IF_ERROR(Copy(p, reinterpret_cast<uint8_t*>(L.ring) + slot * ring, ring));
      p += ring;
      DS_RETURN_IF_ERROR(Copy(p, reinterpret_cast<uint8_t*>(L.state) + slot * st, st));
      p += st;
    } else {
      // Slot pages are contiguous (identity block table): copy the used pages of K then V.
      const size_t off = static_cast<size_t>(slot) * max_pages_ * page_bytes;
      DS_RETURN_IF_ERROR(Copy(p, reinterpret_cast<uint8_t*>(L.kc) + off, pages * page_bytes));
      p += pages * page_bytes;
      DS_RETURN_IF_ERROR(Copy(p, reinterpret_cast<uint8_t*>(L.vc) + off, pages * page_bytes));
      p += pages * page_bytes;
    }
  }
  return snap;
}

absl::Status CudaBackend::Restore(int slot, const SlotSnapshot& snap) {
  if (slot < 0 || slot >= n_slots_) return absl::InvalidArgumentError(absl::StrCat("Restore: bad slot ", slot));
  if (snap.n_past < 0 || snap.n_past > slot_ctx_)
    return absl::InvalidArgumentError(absl::StrCat("Restore: n_past ", snap.n_past, " outside [0, ", slot_ctx_, "]"));
  const int C = gdn_shape_.channels();
  const size_t ring = 4ull * C * 4, st = static_cast<size_t>(gdn_shape_.v_heads) * gdn_shape_.k_dim * gdn_shape_.v_dim * 4;
  const size_t page_bytes = kv_token_bytes_ * copts_.kv_page_size;
  const int pages = (snap.n_past + copts_.kv_page_size - 1) / copts_.kv_page_size;
  size_t total = 0;
  for (const DLayer& L : layers_) total += L.rec ? ring + st : 2 * pages * page_bytes;
  if (snap.bytes.size() != total)
    return absl::InvalidArgumentError(absl::StrCat("Restore: snapshot has ", snap.bytes.size(), " bytes, expected ", total));
  const uint8_t* p = snap.bytes.data();
  for (DLayer& L : layers_) {
    if (L.rec) {
      DS_RETURN_IF_ERROR(Copy(reinterpret_cast<uint8_t*>(L.ring) + slot * ring, p, ring));
      p += ring;
      DS_RETURN_IF_ERROR(Copy(reinterpret_cast<uint8_t*>(L.state) + slot * st, p, st));
      p += st;
    } else {
      const size_t off = static_cast<size_t>(slot) * max_pages_ * page_bytes;
      DS_RETURN_IF_ERROR(Copy(reinterpret_cast<uint8_t*>(L.kc) + off, p, pages * page_bytes));
      p += pages * page_bytes;
      DS_RETURN_IF_ERROR(Copy(reinterpret_cast<uint8_t*>(L.vc) + off, p, pages * page_bytes));
      p += pages * page_bytes;
    }
  }
  len_[slot] = snap.n_past;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackendApi>> CreateCudaBackendApi(
    const std::string& path, const BackendOptions& opts, const CudaBackendOptions& copts) {
  DS_ASSIGN_OR_RETURN(auto b, CudaBackend::Create(path, opts, copts));
  return std::unique_ptr<CudaBackendApi>(std::move(b));
}

}  // namespace cuda

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const std::string& path,
                                                           const BackendOptions& opts) {
  CudaBackendOptions copts;
  copts.kv_type = opts.kv_type;
  DS_ASSIGN_OR_RETURN(auto b, cuda::CreateCudaBackendApi(path, opts, copts));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace ds
