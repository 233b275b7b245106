// CPU reference backend: the whole qwen35 forward pass (spec/model.md §2–§8) in f32 over weights
// used in place from the mmapped GGUF. Slow but exact; every other backend is tested against it.
//
// Per slot it keeps: GDN conv state [n_gdn][K-1][C] and delta-rule state [n_gdn][Hv][dk][dv] (f32),
// attention K/V [n_attn][slot_ctx][n_kv*hd] (f32, post-norm/rope K), and the MTP layer's own K/V
// [slot_ctx][n_kv*hd] with a per-row validity mask.
//
// Tensor parallelism (BackendOptions::tp_world > 1, docs/tp.md): the backend holds rank tp_rank's
// shard (worker/tp/plan.h): its attention q/kv heads, GDN key heads with their tiled value heads,
// FFN columns and lm_head rows, and only the state/KV of those heads. Each layer's mixer output
// projection and ffn_down produce partial sums that are all-reduced (two all-reduces per layer);
// the residual stream, norms and embedding lookup are replicated. MTP is not sharded yet
// (MtpStep returns Unimplemented under TP).
//
// MTP position convention (spec §8.3, vLLM style): MtpStep(slot, x_{t+1}, t, h_t) pairs the
// main-model hidden state at position t with the token that follows it and stores the MTP K/V row
// at index t, with RoPE position t; draft step j uses position t + j. Writing row t discards all MTP
// rows > t (rollback of rejected drafts); rows never written (gaps) are masked out of attention.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/util/thread_pool.h"
#include "worker/model/backend.h"
#include "worker/model/weights.h"
#include "worker/tp/plan.h"

namespace ds {

class CpuBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const std::string& path,
                                                            const BackendOptions& opts);
  // Takes ownership of an already-opened file.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(std::unique_ptr<gguf::File> file,
                                                            const BackendOptions& opts);

  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return cfg_; }
  int n_slots() const override { return static_cast<int>(slots_.size()); }
  int slot_ctx() const override { return slot_ctx_; }

  absl::Status Forward(std::span<const SeqStep> batch, const StepOptions& opts,
                       StepOutput* out) override;
  void ResetSlot(int slot) override;
  int32_t SlotLength(int slot) const override;
  absl::StatusOr<SlotSnapshot> Snapshot(int slot) const override;
  absl::Status Restore(int slot, const SlotSnapshot& snap) override;
  absl::Status MtpStep(int slot, int32_t token, int32_t pos, std::span<const float> hidden,
                       std::vector<float>* logits, std::vector<float>* hidden_out) override;

  // Chunk size of the chunked GDN form used for multi-token steps (default 64). 0 = use the
  // per-token recurrence for prefill too (tests compare the two).
  void set_gdn_chunk(int chunk) { gdn_chunk_ = chunk; }
  const ModelWeights& weights() const { return w_; }
  const gguf::File& file() const { return *file_; }
  // TP: the plan this rank was loaded with (nullptr without TP) and its rank.
  const tp::Plan* tp_plan() const { return tp_world_ > 1 ? &plan_ : nullptr; }
  int tp_rank() const { return tp_rank_; }

 private:
  struct Slot {
    int32_t n_past = 0;
    std::vector<float> conv;   // [n_gdn][K-1][C]
    std::vector<float> ssm;    // [n_gdn][Hv][dk][dv]
    std::vector<float> k, v;   // [n_attn][slot_ctx][n_kv*hd]
    int32_t mtp_len = 0;       // MTP rows [0, mtp_len) may be valid
    std::vector<float> mtp_k, mtp_v;   // [slot_ctx][n_kv*hd]
    std::vector<uint8_t> mtp_valid;    // [slot_ctx]
  };
  // One sequence's rows in a stacked step, and where its attention cache lives.
  struct SeqRun {
    int64_t row0 = 0;
    int64_t n = 0;
    int32_t pos0 = 0;
    float* k_cache = nullptr;
    float* v_cache = nullptr;
    const uint8_t* valid = nullptr;
  };

  // This rank's head / column counts (the config's own without TP).
  struct Local {
    int n_head = 0, n_head_kv = 0, gdn_k_heads = 0, gdn_v_heads = 0;
    int64_t n_ff = 0, n_vocab = 0;
  };

  CpuBackend() = default;
  // Sums a partial [n] result over the TP group (no-op without TP); adds the time to step_comm_.
  absl::Status AllReduce(float* y, int64_t n);
  void AttnMixer(const AttnLayerWeights& w, const float* a, int64_t N,
                 const std::vector<SeqRun>& seqs, float* y);
  void Mlp(const LayerWeights& w, const float* f, int64_t N, float* y);
  size_t SnapshotBytes(int32_t n_past, int32_t mtp_len) const;

  std::unique_ptr<gguf::File> file_;
  ModelConfig cfg_;
  ModelWeights w_;
  int slot_ctx_ = 0;
  int gdn_chunk_ = 64;
  std::vector<int> gdn_index_, attn_index_;  // [n_layer] index among GDN / attention layers or -1
  int n_gdn_ = 0, n_attn_ = 0;
  int64_t conv_elems_ = 0, ssm_elems_ = 0, kv_width_ = 0;  // per GDN layer / per KV row
  std::vector<Slot> slots_;
  Local lc_;
  int tp_rank_ = 0, tp_world_ = 1;
  bool lm_head_rank0_ = false;
  tp::Plan plan_;
  Collective* coll_ = nullptr;
  double step_comm_ = 0;  // seconds inside collectives during the current Forward
  std::unique_ptr<ThreadPool> own_pool_;
  ThreadPool* pool_ = nullptr;
};

}  // namespace ds
