// CPU reference device: the qwen35 forward pass (spec/model.md §2–§8) in f32 over weights used in
// place from the mapped GGUF, one layer at a time as the step runner asks (worker/runner/device.h).
// Slow but exact; every other device is tested against it.
//
// Per slot it keeps: GDN conv state [n_gdn][K-1][C] and delta-rule state [n_gdn][Hv][dk][dv] (f32),
// a page table into the shared paged KV pool, and the MTP layer's own K/V [slot_ctx][n_kv*hd]
// with a per-row validity mask. The pool (issue #23) holds attention K/V
// [n_attn][n_pages * page_size][n_kv*hd] (f32, post-norm/rope K) for all slots; the runner hands
// out its pages (worker/runner/kv_page_pool.h) and maps them here (MapPages).
//
// Tensor parallelism (docs/tp.md): the device holds rank r's shard (worker/tp/plan.h): its
// attention q/kv heads, GDN key heads with their tiled value heads, FFN columns and lm_head rows,
// and only the state/KV of those heads. Each layer's mixer output projection and ffn_down produce
// partial sums that are all-reduced here (two all-reduces per layer); the residual stream, norms
// and embedding lookup are replicated.
//
// MTP position convention (spec §8.3, vLLM style): MtpStep(slot, x_{t+1}, t, h_t) pairs the
// main-model hidden state at position t with the token that follows it and stores the MTP K/V row
// at index t, with RoPE position t; draft step j uses position t + j. Writing row t discards all MTP
// rows > t (rollback of rejected drafts); rows never written (gaps) are masked out of attention.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/util/thread_pool.h"
#include "worker/model/fp8_prefill_emulation.h"
#include "worker/model/weights.h"
#include "worker/runner/device.h"
#include "worker/runner/step_runner.h"

namespace ds {

class CpuDevice final : public Device {
 public:
  // Binds rank tp.rank's weights of `file` (which must outlive the device) and allocates the
  // state of `n_slots` slots of `slot_ctx` positions. n_threads 0 = the global pool.
  // KV pool: pool_tokens (0 = n_slots x slot_ctx) in pages of page_size (0 = 16) tokens.
  static absl::StatusOr<std::unique_ptr<CpuDevice>> Create(const gguf::File& file,
                                                           const ModelConfig& cfg,
                                                           const TpPlacement& tp, int n_slots,
                                                           int slot_ctx, int n_threads,
                                                           int page_size = 0,
                                                           int64_t pool_tokens = 0);

  std::string name() const override { return "cpu"; }
  const DeviceLimits& limits() const override { return limits_; }
  MemoryFootprint memory() const override;

  absl::Status Prepare(const MicroStep& step) override;
  absl::Status Embed() override;
  absl::Status Layer(int layer) override;
  absl::Status Head() override;

  LogitBuffers logit_buffers() override;
  absl::Status CopyColumns(float* dst, int64_t ld_dst, const float* src, int64_t ld_src,
                           int64_t width, int64_t rows) override;
  absl::Status ReadLogits(int n, float* dst) override;
  absl::Status ReadHidden(int n, float* dst) override;
  absl::Status Argmax(int n, int32_t* tokens) override;
  // The CPU twin of device sampling (limits().device_sampling, off by default; tests turn it on
  // through CpuBackend::set_device_sampling): each kSample row's token as the sampler draws it
  // with the row's uniform (sampling::Sampler::TokenWith), -1 elsewhere.
  absl::Status Sample(std::span<const DeviceSampleRow> rows, int32_t* tokens) override;
  absl::Status Finish() override { return absl::OkStatus(); }
  double TakeCommSeconds() override;

  KvPaging kv_paging() const override { return paging_; }
  absl::Status MapPages(int slot, int first, std::span<const int32_t> pages) override;
  void ResetSlot(int slot) override;
  absl::StatusOr<std::vector<uint8_t>> SaveState(int slot, int32_t n_past) const override;
  absl::Status LoadState(int slot, int32_t n_past, std::span<const uint8_t> bytes) override;
  std::string state_layout() const override;

  absl::Status MtpFill(const RowRun& run, int32_t next) override;
  absl::Status MtpStep(int slot, int32_t token, int32_t pos, std::span<const float> hidden,
                       std::vector<float>* logits, std::vector<float>* hidden_out) override;
  absl::Status MtpRows(int slot, int32_t pos0, std::span<const int32_t> tokens,
                       std::span<const float> hidden, int64_t n_embd, std::vector<float>* logits,
                       std::vector<float>* hidden_out) override;
  absl::Status CommitSpeculative(int slot, int entry) override;

  // Speculative tokens one sequence may verify in a Forward (DeviceLimits::max_spec_tokens), and
  // entries for all of a Forward's; the entries' memory is taken when first used.
  static constexpr int kMaxSpecTokens = 16;

  // Chunk size of the chunked GDN form used for multi-token pieces (default 64). 0 = use the
  // per-token recurrence for prefill too (tests compare the two).
  void set_gdn_chunk(int chunk) { gdn_chunk_ = chunk; }
  // BackendOptions::gdn_state_bf16: the delta-rule state rounded to bf16 between steps.
  void set_gdn_state_bf16(bool on) { gdn_state_bf16_ = on; }
  // BackendOptions::prefill_fp8: the layer matrices' products of prefill pieces on e4m3 values
  // (fp8_prefill_emulation.h); decode_rows: BackendOptions::fp8_decode_rows.
  void set_prefill_fp8(bool on, int decode_rows) {
    fp8_ = on ? std::make_unique<Fp8PrefillEmulation>(decode_rows) : nullptr;
  }
  // The CPU takes a whole step at once by default; smaller limits make the runner cut steps into
  // micro-steps as it does for a GPU (tests of the one splitting rule).
  void set_limits(const DeviceLimits& limits) { limits_ = limits; }
  const ModelWeights& weights() const { return w_; }

 private:
  struct Slot {
    std::vector<float> conv;   // [n_gdn][K-1][C]
    std::vector<float> ssm;    // [n_gdn][Hv][dk][dv]
    std::vector<int32_t> pages;  // [max_pages_per_slot] page table into k_pool_ / v_pool_
    int32_t mtp_len = 0;       // MTP rows [0, mtp_len) may be valid
    std::vector<float> mtp_k, mtp_v;   // [slot_ctx][n_kv*hd]
    std::vector<uint8_t> mtp_valid;    // [slot_ctx]
  };
  // One piece's rows in the stacked step, and where its attention cache lives.
  struct SeqRun {
    int64_t row0 = 0;
    int64_t n = 0;
    int32_t pos0 = 0;
    float* k_cache = nullptr;
    float* v_cache = nullptr;
    const int32_t* page_table = nullptr;  // null: k_cache / v_cache rows are contiguous
    const uint8_t* valid = nullptr;
  };

  CpuDevice() = default;
  // Sums a partial [n] result over the TP group (no-op without TP); adds the time to comm_.
  absl::Status AllReduce(float* y, int64_t n);
  // out[r] = the embedding row of ids[r] from `table` (token_embd, or the MTP block's): under TP
  // the rank's vocabulary rows, zero rows for the others' tokens, then the all-reduce.
  absl::Status EmbedRows(const cpu::WeightView& table, std::span<const int32_t> ids, float* out);
  void AttnMixer(const AttnLayerWeights& w, const float* a, int64_t N,
                 const std::vector<SeqRun>& seqs, float* y);
  void Mlp(const LayerWeights& w, const float* f, int64_t N, float* y);
  // The MTP block up to its attention (spec §8.2) for n = tokens.size() rows of `slot` at pos0:
  // row i pairs hidden row i ([n, H], final-normed) with tokens[i]; writes the MTP K/V rows
  // (mask and length as MtpStep), u = eh_proj(...) [n, H] and the attention output y [n, H] —
  // under TP this rank's partial sum (its heads), which the caller all-reduces when it uses it.
  // The vocab-parallel embedding is all-reduced here.
  absl::Status MtpAttention(int slot, int32_t pos0, std::span<const int32_t> tokens,
                            const float* hidden, float* u, float* y);
  void GdnMixer(const LayerWeights& L, int gdn_index, float* y);
  size_t StateBytes(int32_t n_past, int32_t mtp_len) const;

  ModelConfig cfg_;
  ModelWeights w_;
  TpPlacement tp_;
  LocalShape lc_;
  DeviceLimits limits_;
  int slot_ctx_ = 0;
  int gdn_chunk_ = 64;
  bool gdn_state_bf16_ = false;
  std::unique_ptr<Fp8PrefillEmulation> fp8_;  // null unless prefill_fp8
  // A layer matrix's product: cpu::MatMul, or the FP8 emulation where the CUDA path takes it.
  void LayerMatMul(const cpu::WeightView& w, const float* x, int64_t N, float* y);
  std::vector<int> gdn_index_, attn_index_;  // [n_layer] index among GDN / attention layers or -1
  int n_gdn_ = 0, n_attn_ = 0;
  int64_t conv_elems_ = 0, ssm_elems_ = 0, kv_width_ = 0;  // per GDN layer / per KV row
  std::vector<Slot> slots_;
  // Speculative entries (RowRun::spec_entry): a sequence's recurrent state after one of its
  // verified tokens, [n_gdn][K-1][C] and [n_gdn][Hv][dk][dv] like Slot::conv / Slot::ssm.
  struct SpecEntry {
    std::vector<float> conv, ssm;
  };
  std::vector<SpecEntry> spec_;
  KvPaging paging_;
  std::vector<float> k_pool_, v_pool_;  // [n_attn][n_pages * page_size][kv_width]
  // Row j of a slot's cache in its layer's pool (through the slot's page table).
  int64_t PoolRow(const Slot& s, int64_t j) const {
    return static_cast<int64_t>(s.pages[j / paging_.page_size]) * paging_.page_size +
           j % paging_.page_size;
  }
  int64_t PoolRows() const { return paging_.n_pages * paging_.page_size; }
  std::unique_ptr<ThreadPool> own_pool_;
  ThreadPool* pool_ = nullptr;
  double comm_ = 0;  // seconds inside collectives since TakeCommSeconds

  // The prepared micro-step.
  const MicroStep* step_ = nullptr;
  std::vector<SeqRun> runs_;
  std::vector<float> h_, a_, y_;     // [rows, H] residual, normed, mixer/FFN output
  std::vector<float> hn_;            // [logit rows, H] final-normed
  std::vector<float> logits_;        // [logit rows, n_vocab]
  std::vector<float> local_logits_;  // [logit rows, V_local] vocab-parallel TP
  std::vector<float> gathered_;      // [world][logit rows][V_r]
};

}  // namespace ds
