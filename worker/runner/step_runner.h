// StepRunner: the host side of a step, written once for every device (worker/runner/device.h).
//
// It is the Backend the worker, the CLI, the bench and the tests talk to. Per Forward it
//   1. validates the batch (slots distinct and in range, pos0 = the slot's length, token ids,
//      capacity) before touching any state;
//   2. cuts it into micro-steps by one rule (worker/runner/micro_steps.h) from the device's limits;
//   3. per micro-step drives the device: Prepare, Embed, Layer x n_layer, Head (a pure-decode
//      step inside Device::RunCaptured, where a device replays CUDA graphs), then under tensor
//      parallelism with a vocab-parallel lm_head all-gathers every rank's logits and interleaves
//      them (the plan's vocabulary ranges), and reads back what the caller asked for: logits,
//      hidden states, tokens sampled on the device, or argmax tokens;
//   4. advances the slots' lengths, which it owns.
// It also owns the TP plan (MakeTpPlan) and the snapshot format (worker/runner/slot_snapshot.h).
//
// Not thread-safe: one caller drives a runner (the worker's step thread).
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/collective/collective.h"
#include "worker/model/backend.h"
#include "worker/model/config.h"
#include "worker/runner/device.h"
#include "worker/runner/kv_page_pool.h"
#include "worker/runner/micro_steps.h"
#include "worker/tp/plan.h"

namespace ds {

// The TP plan a backend applies for `opts` (tp_world > 1): split weights (empty = even), the FFN
// granule and, with tp_align_heads, the block-aligned head granules of the file, and the lm_head
// placement. Every device cuts a rank's shard by it, so they all cut it identically.
absl::StatusOr<tp::Plan> MakeTpPlan(const gguf::File& f, const ModelConfig& c,
                                    const BackendOptions& opts);

// This rank's head / column counts (the config's own without TP).
struct LocalShape {
  int n_head = 0, n_head_kv = 0, gdn_k_heads = 0, gdn_v_heads = 0;
  int64_t n_ff = 0, n_vocab = 0;
};

// Where a backend sits in its tensor-parallel group (world 1: alone, no plan, no collective).
struct TpPlacement {
  int rank = 0;
  int world = 1;
  tp::Plan plan;                    // when world > 1
  Collective* collective = nullptr; // caller-owned, when world > 1 (or a TP = 1 NCCL test)
  bool lm_head_rank0 = false;
  LocalShape Local(const ModelConfig& c) const;
};

// Checks the options every device shares (slots, context, TP rank/world and collective) and
// makes the placement (with the plan when tp_world > 1).
absl::StatusOr<TpPlacement> PlaceInGroup(const gguf::File& f, const ModelConfig& c,
                                         const BackendOptions& opts);

// Slots the device keeps state for: BackendOptions::max_active_slots within [1, n_slots]
// (0 = n_slots).
inline int DeviceSlots(const BackendOptions& opts) {
  return opts.max_active_slots > 0 && opts.max_active_slots < opts.n_slots ? opts.max_active_slots
                                                                          : opts.n_slots;
}

class StepRunner : public Backend {
 public:
  // The device holds state for n_device_slots sequences (0 = n_slots, the device's slots are then
  // the caller's); with fewer, a caller's slot is bound to a device slot while it holds a sequence.
  StepRunner(std::unique_ptr<Device> device, std::shared_ptr<const gguf::File> file,
             const ModelConfig& cfg, int n_slots, int slot_ctx, TpPlacement tp,
             int n_device_slots = 0);

  std::string name() const override { return dev_->name(); }
  const ModelConfig& config() const override { return cfg_; }
  int n_slots() const override { return static_cast<int>(len_.size()); }
  int slot_ctx() const override { return slot_ctx_; }
  int max_active_sequences() const override { return n_device_slots_; }

  absl::Status Forward(std::span<const SeqStep> batch, const StepOptions& opts,
                       StepOutput* out) override;
  // Device sampling needs the full logits where they are computed: not under TP.
  bool SupportsDeviceSampling() const override {
    return dev_->limits().device_sampling && tp_.world == 1;
  }
  // Forward that keeps the logits on the device and returns the argmax token of every output row
  // (the benchmark's path). all_logits sequences are refused.
  absl::Status ForwardGreedy(std::span<const SeqStep> batch, std::vector<int32_t>* tokens,
                             double* seconds);

  void ResetSlot(int slot) override;
  int32_t SlotLength(int slot) const override;
  absl::StatusOr<SlotSnapshot> Snapshot(int slot) const override;
  absl::Status Restore(int slot, const SlotSnapshot& snap) override;
  // Prefix cache, device tier (issue #17): the device keeps the copy (Device::SaveStateOnDevice).
  bool SupportsDeviceCheckpoints() const override { return dev_->HasDeviceStateCopies(); }
  absl::StatusOr<std::unique_ptr<StateCheckpoint>> SaveCheckpoint(int slot) override;
  absl::Status LoadCheckpoint(int slot, const StateCheckpoint& checkpoint) override;
  MemoryFootprint memory() const override { return dev_->memory(); }
  KvPoolStats kv_pool() const override { return paged_ ? pool_.stats() : KvPoolStats{}; }
  // Pages of every slot (tests: accounting under load); null when the device is not paged.
  const KvPagePool* page_pool() const { return paged_ ? &pool_ : nullptr; }
  absl::Status MtpStep(int slot, int32_t token, int32_t pos, std::span<const float> hidden,
                       std::vector<float>* logits, std::vector<float>* hidden_out) override;
  absl::Status MtpRows(int slot, int32_t pos0, std::span<const int32_t> tokens,
                       std::span<const float> hidden, std::vector<float>* logits,
                       std::vector<float>* hidden_out) override;
  absl::Status MtpAvailable() const override;
  // Draft chains keep the MTP logits where they are computed: not under TP (the vocab-parallel
  // head's logits are gathered on the host path, MtpRows).
  bool SupportsDraftChain() const override { return tp_.world == 1 && MtpAvailable().ok(); }
  absl::Status MtpDraftGreedy(int slot, int32_t pos0, std::span<const int32_t> tokens,
                              int out_row0, int n_drafts, std::vector<int32_t>* drafts) override;
  // On a device that keeps them (Device::KeepsDeferredDrafts) the drafts stay there; otherwise
  // the runner waits for them here and puts them into the next Forward's rows itself.
  absl::Status MtpDraftDeferred(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                int out_row0, int n_drafts) override;
  // StepOptions::chain_after: queued by the device behind the verify's sampling where it judges
  // the drafts itself (Device::QueueChainAfterVerify), otherwise by the runner after the wait.
  bool SupportsChainAfterVerify() const override {
    return SupportsDraftChain() && SupportsDeviceSampling();
  }
  int max_speculative_tokens() const override { return dev_->limits().max_spec_tokens; }
  int max_speculative_seqs() const override;
  absl::Status CommitSpeculative(int slot, int32_t n_keep) override;

  // Micro-steps the last Forward / ForwardGreedy ran (the device's limits cut it).
  int last_micro_steps() const { return last_micro_steps_; }
  // The TP plan this rank applied (null without tensor parallelism).
  const tp::Plan* tp_plan() const { return tp_.world > 1 ? &tp_.plan : nullptr; }
  int tp_rank() const { return tp_.rank; }
  const gguf::File& file() const { return *file_; }

 protected:
  Device& device() { return *dev_; }
  const Device& device() const { return *dev_; }

 private:
  absl::Status Validate(std::span<const SeqStep> batch) const;
  // The checks and page mapping MtpDraftGreedy and MtpDraftDeferred share.
  absl::Status CheckDraftChain(int slot, int32_t pos0, std::span<const int32_t> tokens,
                               int out_row0, int n_drafts);
  // SeqStep::chain_drafts on a device that does not keep them: a copy of the batch with the
  // drafts put in (batch_filled_); the batch itself otherwise.
  std::span<const SeqStep> FillChainDrafts(std::span<const SeqStep> batch);
  // After a Forward: the drafts its chain_drafts sequences ran with (StepOutput::chain_drafts);
  // every slot of the batch drops its deferred drafts.
  absl::Status TakeChainDrafts(std::span<const SeqStep> batch, std::vector<int32_t>* out);
  // StepOptions::chain_after: the checks and page mapping before the step (CheckChainsAfter),
  // the device's queueing inside the micro-step that holds a sequence's rows (QueueChainsAfter,
  // between its Sample and its Finish), and after the Forward the host's judgement: the device's
  // bookkeeping, or the chain itself where the device did not queue it (FinishChainsAfter).
  absl::Status CheckChainsAfter(std::span<const SeqStep> batch, const StepOptions& opts);
  // The end of the MTP rows c's chain writes when every draft is kept.
  static int64_t ChainAfterEnd(const SeqStep& s, const ChainAfterVerify& c) {
    return static_cast<int64_t>(s.pos0) + static_cast<int64_t>(s.tokens.size()) + c.n_drafts - 1;
  }
  absl::Status QueueChainsAfter(std::span<const SeqStep> batch, const StepOptions& opts, int row0,
                                int n_rows, StepOutput* out);
  absl::Status FinishChainsAfter(std::span<const SeqStep> batch, const StepOptions& opts,
                                 StepOutput* out);
  // Prepare + Embed + layers + Head (+ the vocab-parallel gather) for micro_.
  absl::Status RunMicroStep();
  // Every micro-step of a validated batch: runs it, lets `read_outputs(n_logit_rows)` queue the
  // reads of its outputs, waits for the device; then advances the slots' lengths.
  absl::Status RunMicroSteps(std::span<const SeqStep> batch,
                             const std::function<absl::Status(int)>& read_outputs);
  absl::Status GatherVocabParallelLogits(int n_rows);
  // SeqStep::fill_mtp: the MTP K/V of the pieces of micro_ that ask for it (Device::MtpFill).
  absl::Status FillMtp(std::span<const SeqStep> batch, std::span<const StepPiece> pieces);
  // Paged KV: gives every slot of a validated batch the pages its new tokens need and maps them
  // on the device (Validate checked that they are free).
  absl::Status GrowPages(std::span<const SeqStep> batch);
  // Paged KV: the device slot takes pages until it holds n_tokens rows; maps the new ones.
  absl::Status GrowPagesTo(int32_t device_slot, int64_t n_tokens);
  bool VocabParallel() const {
    return tp_.world > 1 && tp_.plan.lm_head == tp::LmHead::kVocabParallel;
  }
  // Whether this rank ends a step with the full logits: every rank, except with the lm_head on
  // rank 0 only (BackendOptions::tp_lm_head_rank0), where the others have none.
  bool HasLogits() const { return tp_.world == 1 || VocabParallel() || tp_.rank == 0; }

  // Declared first, destroyed last: the device's weights may be views into the file's mapping.
  std::shared_ptr<const gguf::File> file_;
  std::unique_ptr<Device> dev_;
  ModelConfig cfg_;
  int slot_ctx_ = 0;
  TpPlacement tp_;
  std::vector<int32_t> len_;  // [n_slots] tokens in each slot
  // A speculative sequence of the last Forward, waiting for CommitSpeculative.
  struct PendingSpec {
    int32_t pos0 = 0;
    int32_t n = 0;
    int32_t entry0 = 0;  // its first token's speculative entry
  };
  std::vector<std::optional<PendingSpec>> spec_;  // [n_slots]
  int pending_specs_ = 0;
  std::vector<int32_t> spec_base_;  // [batch] per Forward: first entry, or -1
  // Slots -> device slots (issue #23). Identity when the device has a slot per caller slot;
  // otherwise bound while a slot holds a sequence (lowest free device slot first).
  int n_device_slots_ = 0;
  bool bind_lazily_ = false;
  std::vector<int32_t> dev_of_;     // [n_slots] device slot or -1
  std::set<int32_t> free_dev_;      // unbound device slots
  std::vector<int32_t> batch_dev_;  // [batch] per Forward: device slot of each sequence
  int32_t Dev(int slot) const { return dev_of_[slot]; }
  // Gives `slot` a device slot (a fresh, reset one) if it has none.
  absl::Status Bind(int slot);
  void Unbind(int slot);
  absl::Status NoPendingSpeculation(const char* what) const;
  // Restore's second half, shared with LoadCheckpoint: binds the slot, gives it pages for n_past
  // positions and maps them, then `load(device_slot)` fills them; the slot is left empty when
  // any of it fails.
  absl::Status RestoreInto(int slot, int32_t n_past,
                           const std::function<absl::Status(int32_t)>& load);
  bool paged_ = false;        // the device keeps a paged KV pool; pool_ hands out its pages
  KvPagePool pool_;
  MicroStep micro_;           // reused between micro-steps
  double gather_seconds_ = 0;
  int last_micro_steps_ = 0;
  // Deferred drafts per slot (MtpDraftDeferred), until the slot's next Forward: how many, and
  // their values when the device does not keep them.
  struct DeferredDrafts {
    int n = 0;
    std::vector<int32_t> host;
  };
  std::vector<DeferredDrafts> deferred_;  // [n_slots]
  std::vector<SeqStep> batch_filled_;     // FillChainDrafts' copy
  // Per Forward with StepOptions::chain_after, [batch]: each sequence's first output row; and the
  // catch-up tokens of a chain the runner queues itself (kept: no allocation per step).
  std::vector<int32_t> out_row_of_;
  std::vector<int32_t> catch_up_;
  // Output rows of the last Forward's last micro-step: [last_out_row0_, + last_out_rows_), whose
  // final-normed states the device still holds (MtpDraftGreedy); -1 = none.
  int last_out_row0_ = -1, last_out_rows_ = 0;
};

}  // namespace ds
