// The worker side of the scheduler -> worker protocol (proto/deltaserve/internal/cluster.proto,
// as the plain types of step_types.h): keeps every active slot's known tokens and sampler, turns
// one `Step` (releases, starts, slot work diffs) into one Backend::Forward and samples where
// asked: on the device when the backend offers it (Backend::SupportsDeviceSampling, no TP) and the
// request wants no logprobs, else on the host from the returned logits. Both give the same token
// for the same seed.
//
// The scheduler sends a sequence's full tokens once (SequenceStart); afterwards a SlotWork only
// names [pos0, pos0 + n_tokens) of the slot's known tokens, and the tokens this executor samples
// are appended to them (the scheduler appends the same ids on its side when it applies the result).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "common/collective/collective.h"
#include "common/sampling/json_constraint.h"
#include "common/sampling/sampler.h"
#include "worker/model/backend.h"
#include "worker/runner/checkpoint_store.h"
#include "worker/process/step_types.h"
#include "worker/spec/draft_cost.h"
#include "worker/spec/draft_policy.h"
#include "worker/spec/mtp_setting.h"
#include "worker/spec/mtp_speculator.h"

namespace ds::worker {

class StepExecutor {
 public:
  // `backend` must outlive the executor. Slots [0, n_usable) are the scheduler's; any slot above
  // (the warmup scratch slot) is never touched by Run().
  StepExecutor(Backend* backend, int n_usable);

  // Applies released -> started -> work. A malformed step (unknown slot, a range outside the known
  // tokens) or a backend error answers with StepResult::error and leaves every slot as it was
  // before the Forward (the backend validates before it touches state). handle_seconds is left 0.
  // Work that follows (SlotWork::follows, sent ahead with MTP) continues its slot from the
  // pending token: pos0 = known - 1, one token, sampled.
  StepResult Run(const Step& step);

  // Tensor parallelism (docs/tp.md §6): every rank runs the same steps; only rank 0 of `group`
  // samples, then broadcasts the sampled ids over `group` so every rank appends the same tokens.
  // Ranks > 0 answer with no tokens. `group` must outlive the executor.
  void SetGroup(Collective* group) { group_ = group; }
  // A collective failed during a step: the group is unusable (the worker must leave it).
  bool group_broken() const { return group_broken_; }

  // MTP speculative decoding (issue #15, worker/spec/README.md): a sampled slot keeps drafts
  // from the model's MTP head, and its next decode verifies them inside the step's one Forward
  // (a speculative SeqStep beside the other slots' prefill chunks and decodes); the slot then
  // answers with its kept drafts plus the model's own token. Off (the default) or when the
  // backend cannot: one token per sampled slot. Requests that want logprobs are not speculated.
  // Under tensor parallelism (docs/tp.md §10; SetGroup first) every rank accepts and drafts for
  // a speculated slot itself, from the same gathered logits and seeded draws, so that the ranks
  // run the same MTP passes; rank 0's broadcast checks that they kept the same tokens.
  absl::Status SetMtp(const spec::MtpSetting& setting);
  // Draft chains leave their drafts on the backend (Backend::MtpDraftDeferred) and the slot's
  // next verify takes them there (SeqStep::chain_drafts): no host wait per slot for its drafts,
  // which come back with the verify (`worker --deferred-drafts on`). The same tokens either way.
  void SetDeferredDrafts(bool on) { deferred_drafts_ = on; }
  // Verifies whose next draft chain their own Forward queued (StepOptions::chain_after: deferred
  // drafts, device sampling, a fixed K whose draft count the verdict cannot change; on CUDA the
  // chain judges the drafts on the device behind the sampling), since construction.
  int64_t chains_after_verify() const { return chains_after_verify_; }
  const spec::SpecStats& mtp_stats() const { return mtp_stats_; }
  // The last Run's share of mtp_stats() and the tokens each of its verify steps kept (1 +
  // accepted drafts), for metrics.
  const spec::SpecStats& last_mtp_stats() const { return step_stats_; }
  const std::vector<int>& last_verify_tokens() const { return verify_tokens_; }

  // Prefix cache (issue #17): the store that Step::saves, SlotWork::checkpoint and
  // SequenceStart::resume_checkpoint go to; null (the default) = the worker has none, and a
  // step that names a checkpoint is refused. `store` must outlive the executor.
  // Under TP every rank keeps its own shard's checkpoints under the scheduler's ids; the ranks
  // agree (one small all-reduce where a step saves or resumes) so that a checkpoint exists on
  // all ranks or none, and a resume happens on all ranks or none (a rank that cannot load it
  // makes every rank compute the prefix: the same rows run everywhere).
  void SetCheckpointStore(CheckpointStore* store) { store_ = store; }
  CheckpointStore* checkpoint_store() const { return store_; }

  // response_format json_object (SamplingParams::json_object): where the model's token table
  // comes from (worker/process/json_vocab.h), called once, when the first such request starts.
  // Such a slot is sampled on the host with its logits masked (json_constraint.h) and is not
  // speculated; a replay re-applies its generated tokens, so masks and tokens are the same.
  // Without a loader (or when it fails) a step starting such a request fails with the reason.
  using JsonVocabLoader = std::function<absl::StatusOr<std::shared_ptr<sampling::JsonVocab>>()>;
  void SetJsonVocabLoader(JsonVocabLoader load) { json_loader_ = std::move(load); }

  // Tokens the worker knows for a slot (for tests); empty when the slot is free.
  const std::vector<int32_t>& known(int slot) const { return slots_[slot].known; }
  bool active(int slot) const { return slots_[slot].active; }

 private:
  StepResult RunResolved(const Step& step);

  struct SlotState {
    bool active = false;
    uint64_t request_id = 0;
    std::vector<int32_t> known;  // [n_known] prompt + generated so far
    std::optional<sampling::Sampler> sampler;
    bool want_logprob = false;  // chosen token's logprob + the sampler's n_logprobs top ones
    // MTP: whether this sequence is speculated, the generated tokens it may have in all, and
    // its drafts for the next decode (empty: a plain decode).
    bool mtp = false;
    int mtp_cap = 0;  // the request's own bound on drafts (SamplingParams::mtp_drafts > 0), else 0
    int n_prompt = 0;
    int max_new = 0;
    spec::Drafts drafts;
    spec::DraftPolicy policy;  // `--mtp auto`: drafts from this sequence's acceptance
    std::optional<sampling::JsonConstraint> json;  // response_format json_object
  };
  // Drafts from the hidden rows [p0, p0 + n_rows) the last Forward gave for `slot`; when drafting
  // fails the request goes on without drafts.
  // out_row0: the first of those rows in the Forward's output (a draft chain reads them where
  // they are, Backend::MtpDraftGreedy, for plain greedy sequences). alone: the step's one
  // sequence on an ungrouped `auto` worker (drafts at this worker's measured cost, draft_cost.h).
  void DraftAfter(int slot, int32_t p0, int out_row0, std::span<const float> hidden, int n_rows,
                  int n_mtp_slots, bool alone);

  absl::Status Validate(const Step& step) const;
  // TP prefix cache: the checkpoints `ids` this rank tried to save in this step (failures in
  // result->checkpoints_failed) and the resumes of `resumed` slots (missed_ holds the local
  // misses): one all-reduce of the failures; a checkpoint that failed on any rank is dropped on
  // all and reported failed, a resume missed on any rank is undone on all (the slot computes its
  // prefix). False when the collective failed (the group is broken, result->error says why).
  bool AgreeWithGroup(std::span<const uint64_t> ids, std::span<const uint32_t> resumed,
                      StepResult* result);
  // Saves `slot` as checkpoint `id` when it holds exactly n_past positions; records the outcome
  // (saved / evicted / failed) in *result. Never fails the step.
  void SaveCheckpoint(int slot, uint64_t id, int32_t n_past, std::span<const uint64_t> pinned,
                      StepResult* result);

  Backend* backend_;
  bool deferred_drafts_ = false;
  std::vector<SlotState> slots_;  // [n_usable]
  std::vector<SeqStep> batch_;    // reused between steps
  Step resolved_;  // Run: a step whose following work got its positions
  std::vector<DeviceSampleRow> dev_rows_;  // [work_size] device sampling requests, reused
  // Reused every step: its logits buffer (1 MB at vocab 248320) keeps its capacity, so a step does
  // not allocate, fault in and free it again (measured: part of the per-step control overhead).
  StepOutput out_;
  Collective* group_ = nullptr;   // TP group, or null
  CheckpointStore* store_ = nullptr;  // prefix cache, or null
  std::vector<uint64_t> pinned_;      // checkpoints this step restores (not evicted by its saves)
  std::vector<uint32_t> missed_;      // slots of this step whose resume could not load
  std::vector<uint64_t> tried_;       // TP: checkpoint ids this step tried to save, reused
  std::vector<uint32_t> resumed_;     // TP: slots this step resumed, reused
  std::vector<float> agree_;          // TP: failure flags summed over the group, reused
  bool group_broken_ = false;
  std::vector<int32_t> shared_;   // TP: [n sampled][2 + K] blocks broadcast from rank 0
  std::vector<int32_t> mine_;     // TP: this rank's blocks before the broadcast, reused
  std::vector<float> spec_veto_;  // [work] ranks that cannot verify the slot's drafts (TP: summed)
  spec::MtpSetting mtp_;
  std::optional<spec::MtpDrafter> drafter_;
  spec::SpecStats mtp_stats_;
  // `--mtp auto` on an ungrouped worker: what a draft costs here, from the steps of one sequence
  // (draft_cost.h).
  spec::DraftCostEstimator draft_cost_;
  spec::SpecStats step_stats_;  // the last Run's
  std::vector<int> out_row_;      // [work + 1] first output row of each work item
  // Chains the Forward queues after a verify (StepOptions::chain_after) and, per work item, the
  // draft count of its queued chain (-1: none; DraftAfter runs it after the Forward).
  std::vector<ChainAfterVerify> chain_after_;
  std::vector<int> chain_planned_;
  int64_t chains_after_verify_ = 0;
  // The drafts DraftAfter gives slot_index's next step after a verify that keeps `kept` of the
  // `offered` drafts (k for the batch and the request's cap, then the budget: not `auto`).
  int FixedDraftsAfter(int slot_index, int kept, int n_mtp_slots) const;
  std::vector<int> verify_tokens_;  // [verify steps of the last Run] tokens kept
  JsonVocabLoader json_loader_;
  std::shared_ptr<sampling::JsonVocab> json_vocab_;  // loaded on first use
  std::vector<float> masked_;                        // [n_vocab] a json_object row, masked
};

}  // namespace ds::worker
