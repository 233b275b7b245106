// The one narrow interface between the worker and a compute backend (CPU reference or CUDA).
//
// A backend owns the weights and the per-slot sequence state (conv + recurrent state of the GDN
// layers, K/V of the attention layers) for `n_slots` slots of up to `slot_ctx` tokens each.
// The scheduler decides which slot runs which tokens; a Forward() call is one step of continuous
// batching: any mix of prefill chunks and single decode tokens over distinct slots.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/gguf/ggml_types.h"
#include "common/sampling/sampling_params.h"
#include "common/util/status.h"
#include "worker/model/config.h"
#include "worker/model/dense_weights.h"
#include "worker/tp/plan.h"

namespace ds {

class Collective;

// One sequence's share of a step.
struct SeqStep {
  int slot = 0;                  // state slot, [0, n_slots)
  int32_t pos0 = 0;              // position of tokens[0]; must equal the slot's current length
  std::vector<int32_t> tokens;   // [n] tokens to append (n >= 1)
  bool all_logits = false;       // true: logits for every token; false: only for the last one
  // Compute the tokens as n decode steps of one token would (the decode kernels, one position
  // after another), not as a prefill chunk: a failover replay of tokens that were generated one
  // by one, or a speculative verify, then reproduces the decode steps' numerics exactly. A device
  // whose prefill and decode arithmetic are the same (the CPU) may ignore it.
  bool decode_path = false;
  // Speculative verify (MTP, issue #15): keep the sequence's recurrent state after every one of
  // its tokens, so that Backend::CommitSpeculative can keep any prefix of them without computing
  // anything again. Implies decode_path. At most Backend::max_speculative_tokens() tokens.
  bool speculative = false;
  // MTP (issue #15): also write the MTP layer's K/V at these positions (spec §8.2), so the drafts
  // attend over the whole prompt: position pos0 + i pairs the main model's final-normed state
  // there with the token after it — tokens[i + 1], and mtp_next for the last token (-1 = not
  // known yet: that row is left to the next MtpRows / MtpDraftGreedy, which pairs it with the
  // sampled token). Rows past the written ones are dropped, as MtpRows does. Not with
  // speculative (a verify's rows are written by the drafts' catch-up pass). Needs a backend with
  // the MTP block on its device (Backend::SupportsDraftChain).
  bool fill_mtp = false;
  int32_t mtp_next = -1;
  // MTP drafts left where the draft chain made them (Backend::MtpDraftDeferred): tokens[1..] are
  // the slot's deferred drafts, whatever their values here, put in where the device holds them
  // before the step runs; StepOutput::chain_drafts gives them back. tokens.size() - 1 must equal
  // the number of drafts the slot's last deferred chain made.
  bool chain_drafts = false;
};

// What the caller needs from one output row when it asks for device sampling
// (StepOptions::device_sample, Backend::SupportsDeviceSampling).
struct DeviceSampleRow {
  enum class Mode : uint8_t {
    kSkip,    // nothing (a prefill chunk that is not sampled)
    kLogits,  // the row's logits on the host (host-side sampling, e.g. for logprobs)
    kSample,  // sample on the device: StepOutput::tokens
  };
  Mode mode = Mode::kSkip;
  const sampling::SamplingParams* params = nullptr;  // kSample
  std::span<const int32_t> history;  // kSample: prompt + generated so far, oldest first (penalties)
  double uniform = 0.0;  // kSample: sampling::Sampler::UniformAt(the row's position); unused when greedy
};

struct StepOutput {
  // [n_rows, n_vocab]; rows in batch order: every token of an all_logits sequence, else its last.
  // Tensor parallel with the lm_head on rank 0 only (BackendOptions::tp_lm_head_rank0): empty on
  // the other ranks. With StepOptions::device_sample: filled only if some row is kLogits.
  std::vector<float> logits;
  // [n_rows] with StepOptions::device_sample: the sampled token of every kSample row, -1 elsewhere.
  std::vector<int32_t> tokens;
  // [n_rows, n_embd] final-normed hidden states of the same rows (input of the MTP head), filled
  // only when StepOptions::want_hidden.
  std::vector<float> hidden;
  // The drafts SeqStep::chain_drafts sequences ran with (tokens[1..] as the device had them), in
  // batch order, those sequences only.
  std::vector<int32_t> chain_drafts;
  // [StepOptions::chain_after] 1 where that chain was queued (its drafts deferred, as after
  // MtpDraftDeferred); 0 where it could not be (its sequence's rows were not in the step's last
  // micro-step and the device did not take it): the caller drafts after the step as before.
  std::vector<uint8_t> chains_after;
  int n_rows = 0;
  double forward_seconds = 0;    // measured by the backend
  double comm_seconds = 0;       // of which inside TP collectives (0 without TP)
};

// A deferred MTP draft chain that follows a speculative verify inside its Forward (issue #15;
// StepOptions::chain_after). For batch[seq], whose every row is sampled on the device (kSample),
// the Forward does what the caller would do after it: keep the drafts while each equals the
// token sampled at the row before it (kept of them), then MtpDraftDeferred(slot, pos0,
// [d_1..d_kept, y_kept], the sequence's first output row, n_drafts). A device that judges the
// drafts itself queues the chain right behind the sampling, before the step's wait, so the chain
// runs while the host judges the same tokens and queues the next step (one host turnaround off
// the cycle's critical path); elsewhere the runner queues it after the wait: the same tokens.
// StepOutput::chains_after says which were queued.
struct ChainAfterVerify {
  int seq = 0;       // index into the Forward's batch
  int n_drafts = 0;  // >= 1
};

struct StepOptions {
  bool want_hidden = false;
  // Draft chains after the verify (ChainAfterVerify), at most one per sequence; only where
  // Backend::SupportsChainAfterVerify().
  std::span<const ChainAfterVerify> chain_after = {};
  // [n_rows] (StepOutput row order) or empty. Only for a backend whose SupportsDeviceSampling():
  // kSample rows are sampled where the logits are (the CPU sampler's pipeline and tokens given the
  // same uniform, kernels/cuda/sampling.cuh) and only kLogits rows' logits are copied back.
  std::span<const DeviceSampleRow> device_sample = {};
};

// Copy of one slot's state (GDN conv + recurrent state and the attention KV up to n_past) in the
// versioned format of worker/runner/slot_snapshot.h.
struct SlotSnapshot {
  int32_t n_past = 0;
  std::vector<uint8_t> bytes;
};

// Prefix cache (issue #17): a slot's state at an exact position, kept where the backend restores
// it fastest (the CUDA backend: device memory, device-to-device copies). Opaque to the caller;
// released when destroyed.
struct StateCheckpoint {
  virtual ~StateCheckpoint() = default;
  int32_t n_past = 0;   // positions it holds
  uint64_t bytes = 0;   // memory it takes
};

// Bytes a backend holds on its device, by kind (reported to the scheduler and to metrics).
struct MemoryFootprint {
  uint64_t weights = 0;
  uint64_t kv_cache = 0;
  uint64_t recurrent = 0;
  uint64_t workspace = 0;
  // Kept free for prefix-cache checkpoints in device memory (the CUDA planner's share; not
  // allocated up front, so not in total()).
  uint64_t cache_reserved = 0;
  // Of weights: the 16-bit copies of the layer matrices (worker/model/dense_weights.h), and one
  // line on why they were or were not made (empty on devices without them).
  uint64_t dense_copies = 0;
  std::string dense_choice;
  uint64_t total() const { return weights + kv_cache + recurrent + workspace; }
};

// A backend's paged KV pool (issue #23; worker/runner/kv_page_pool.h): pages of page_size tokens
// shared by all slots, taken as sequences grow and returned when they end.
struct KvPoolStats {
  int page_size = 0;       // tokens per page; 0 = the backend keeps no paged pool
  int64_t total_pages = 0;
  int64_t free_pages = 0;
  int64_t total_tokens() const { return total_pages * page_size; }
  int64_t free_tokens() const { return free_pages * page_size; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;               // "cpu", "cuda:0", ...
  virtual const ModelConfig& config() const = 0;
  virtual int n_slots() const = 0;
  virtual int slot_ctx() const = 0;
  // Sequences that can hold state at once (BackendOptions::max_active_slots): the recurrent state
  // and the device's per-slot tables exist for this many, and a slot takes one of them when its
  // sequence starts and gives it back at ResetSlot. A step that would need more fails with
  // ResourceExhausted before touching any state.
  virtual int max_active_sequences() const { return n_slots(); }

  // Runs one step. Validates slots (distinct, in range), positions, token ids and capacity first
  // and returns InvalidArgument / OutOfRange without touching any state on error.
  virtual absl::Status Forward(std::span<const SeqStep> batch, const StepOptions& opts,
                               StepOutput* out) = 0;
  // True when Forward honours StepOptions::device_sample.
  virtual bool SupportsDeviceSampling() const { return false; }

  virtual void ResetSlot(int slot) = 0;               // back to an empty sequence
  virtual int32_t SlotLength(int slot) const = 0;     // tokens currently in the slot
  virtual absl::StatusOr<SlotSnapshot> Snapshot(int slot) const = 0;
  virtual absl::Status Restore(int slot, const SlotSnapshot& snap) = 0;
  virtual MemoryFootprint memory() const = 0;
  // Prefix cache, device tier (StateCheckpoint): a copy of the slot's state that stays on the
  // device, and its load into a slot (which then holds n_past positions, as after Restore).
  // Unimplemented: the caller keeps Snapshot bytes in host memory instead.
  virtual bool SupportsDeviceCheckpoints() const { return false; }
  virtual absl::StatusOr<std::unique_ptr<StateCheckpoint>> SaveCheckpoint(int slot) {
    return absl::UnimplementedError("device checkpoints are not implemented by backend " + name());
  }
  virtual absl::Status LoadCheckpoint(int slot, const StateCheckpoint& checkpoint) {
    return absl::UnimplementedError("device checkpoints are not implemented by backend " + name());
  }
  // The paged KV pool: a step whose slots need more pages than are free fails with
  // ResourceExhausted before touching any state (the scheduler preempts and retries).
  virtual KvPoolStats kv_pool() const { return {}; }

  // Speculative verify (SeqStep::speculative): the most tokens one speculative sequence may have
  // in a Forward, and how many speculative sequences one Forward may hold; 0 = not supported.
  virtual int max_speculative_tokens() const { return 0; }
  virtual int max_speculative_seqs() const { return 0; }
  // After a Forward in which `slot` ran n speculative tokens from pos0: keep the first n_keep of
  // them (1 <= n_keep <= n). The slot's length becomes pos0 + n_keep and its recurrent state the
  // one after token n_keep - 1 (rollback without recompute); its attention KV rows past the new
  // length are dead and are overwritten by the next tokens. Every speculative slot of a Forward
  // must be committed before the next Forward, Snapshot or Restore of any slot
  // (FailedPrecondition otherwise); ResetSlot drops a pending speculation.
  virtual absl::Status CommitSpeculative(int slot, int32_t n_keep) {
    return absl::UnimplementedError("speculative decoding is not implemented by backend " + name());
  }

  // Whether MtpStep / MtpRows / SeqStep::fill_mtp can run here (the model has an MTP block, the
  // device holds it, a TP group places it); otherwise why not.
  virtual absl::Status MtpAvailable() const {
    return absl::UnimplementedError("MTP not implemented by backend " + name());
  }
  // MTP draft step (spec §8.2) for one slot's MTP KV; hidden = [n_embd] final-normed main-model
  // state at position pos, token = the token following it. Writes [n_vocab] logits and the
  // draft hidden state [n_embd]. Unimplemented backends return Unimplemented.
  virtual absl::Status MtpStep(int slot, int32_t token, int32_t pos, std::span<const float> hidden,
                               std::vector<float>* logits, std::vector<float>* hidden_out) {
    return absl::UnimplementedError("MTP not implemented by backend " + name());
  }
  // n MTP rows of one slot at once, as n MtpStep calls in order would run them: row i pairs
  // hidden row i ([n, n_embd], the main model's state at pos0 + i) with tokens[i] (the token after
  // it) at position pos0 + i, writing the MTP K/V rows [pos0, pos0 + n) (and dropping rows past
  // them). Only the last row's logits [n_vocab] and draft hidden state [n_embd] come back. The
  // default runs MtpStep row by row; a device may batch the rows.
  virtual absl::Status MtpRows(int slot, int32_t pos0, std::span<const int32_t> tokens,
                               std::span<const float> hidden, std::vector<float>* logits,
                               std::vector<float>* hidden_out) {
    const size_t H = static_cast<size_t>(config().n_embd);
    if (tokens.empty() || hidden.size() != tokens.size() * H)
      return absl::InvalidArgumentError("MtpRows: need one hidden row per token");
    for (size_t i = 0; i < tokens.size(); ++i)
      DS_RETURN_IF_ERROR(MtpStep(slot, tokens[i], pos0 + static_cast<int32_t>(i),
                                 hidden.subspan(i * H, H), logits, hidden_out));
    return absl::OkStatus();
  }
  // Greedy drafts that stay where the model runs (MTP's fast path): MtpRows over `tokens` at
  // pos0 whose hidden rows are output rows [out_row0, out_row0 + n) of the last Forward — they
  // never cross to the host — then n_drafts chained drafts, each the argmax of the MTP logits
  // (lowest id on ties, no penalties). Only the draft tokens come back (*drafts, n_drafts of
  // them). The rows must come from the last micro-step of the last Forward (FailedPrecondition
  // otherwise: use MtpRows with the hidden states).
  virtual bool SupportsDraftChain() const { return false; }
  virtual absl::Status MtpDraftGreedy(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                      int out_row0, int n_drafts, std::vector<int32_t>* drafts) {
    return absl::UnimplementedError("MTP draft chains are not implemented by backend " + name());
  }
  // MtpDraftGreedy without waiting for the drafts (issue #15: one host round trip per MTP cycle
  // instead of two): the chain is queued and its n_drafts drafts stay with the backend for the
  // slot, until its next Forward takes them (SeqStep::chain_drafts) or drops them (a Forward of
  // the slot without chain_drafts, ResetSlot, Restore). So the verify that reads them is queued
  // behind the chain without the host waiting in between, and the drafts come back with the
  // verify's own wait (StepOutput::chain_drafts). The same drafts and tokens as MtpDraftGreedy.
  virtual absl::Status MtpDraftDeferred(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                        int out_row0, int n_drafts) {
    return absl::UnimplementedError("deferred MTP drafts are not implemented by backend " + name());
  }
  // True when Forward honours StepOptions::chain_after.
  virtual bool SupportsChainAfterVerify() const { return false; }
};

struct BackendOptions {
  int n_slots = 1;
  int slot_ctx = 4096;
  int n_threads = 0;             // CPU: 0 = all cores
  int device = 0;                // CUDA device ordinal
  // Tensor parallelism (docs/tp.md). With tp_world > 1 the backend loads only rank tp_rank's
  // shard and runs the sharded forward: one all-reduce after the mixer output projection and one
  // after ffn_down per layer, over `collective` (caller-owned, rank/world must match).
  int tp_rank = 0;
  int tp_world = 1;
  std::vector<double> tp_split;  // [tp_world] share weights (e.g. 1,2); empty = even
  bool tp_lm_head_rank0 = false; // false: vocab-parallel lm_head + all-gather; true: rank 0 only
  // Apportion heads in groups that keep attn_output / ssm_out column slices on quant blocks
  // (tp::AlignedHeadGranules); false: single heads, unaligned slices dequantized to f32 at load.
  bool tp_align_heads = true;
  Collective* collective = nullptr;
  // KV cache element type (--kv-type, worker/model/kv_type.h): F16 (default), Q8_0 or Q4_0. Only
  // the CUDA backend stores quantized KV; the CPU backend keeps an f32 cache and rejects anything
  // but the default F16 with a clear error.
  GgmlType kv_type = GgmlType::F16;
  // CUDA: the portable (sm_70 / V100) kernel path on any GPU (CudaBackendOptions::portable,
  // --portable); the CPU backend has one path and ignores it.
  bool portable = false;
  // CUDA: 16-bit copies of the layer matrices for the GEMM path (worker/model/dense_weights.h,
  // --dense-weights on|off|auto); the CPU backend ignores it.
  DenseWeights dense_weights = DenseWeights::kAuto;
  // CUDA: false launches the decode kernels the plain way (CudaBackendOptions::early_launch,
  // --early-launch off); the CPU backend ignores it.
  bool early_launch = true;
  // CUDA: Q4_K / Q5_K / Q8_0 / IQ4_XS / IQ4_NL matrices tiled for the f16 tensor-core kernel
  // (CudaBackendOptions::tiled_f16_formats, --tiled-f16-formats off for the raw layout and the
  // v2 GEMV); the CPU backend ignores it.
  bool tiled_f16_formats = true;
  // CUDA: the f16 tensor-core matmul on wgmma where the build and GPU have it (CudaBackendOptions::
  // f16_wgmma, --f16-wgmma off for the mma.sync form: the same numbers); the CPU backend ignores it.
  bool f16_wgmma = true;
  // Prefill products on FP8: CUDA through e4m3 copies of the weights with block scales on FP8
  // tensor cores (CudaBackendOptions::prefill_fp8, --prefill-fp8 on; lossy, opt-in); the CPU
  // backend emulates it on the same e4m3 values (worker/model/fp8_prefill_emulation.h).
  bool prefill_fp8 = false;
  // With prefill_fp8: decode steps of at least this many rows on FP8 too (CudaBackendOptions::
  // fp8_decode_rows, --fp8-decode-rows N; 33 by default, 0 = never); the CPU backend's
  // emulation follows it.
  int fp8_decode_rows = 33;
  // CUDA: MTP drafts through a coarse copy of a tiled Q6_K head (CudaBackendOptions::
  // coarse_draft_head, --coarse-draft-head off to keep the full head); the CPU backend ignores it.
  bool coarse_draft_head = true;
  // CUDA: the greedy draft chain in one kernel where the MTP block takes it
  // (CudaBackendOptions::fused_draft_chain, --fused-draft off for A/B); the CPU backend ignores it.
  bool fused_draft_chain = true;
  // CUDA: deferred draft chains judged on the device, queued behind the verify's sampling
  // (CudaBackendOptions::judged_chains, --judged-chains off for A/B); the CPU backend queues
  // them after the verify either way (the same tokens).
  bool judged_chains = true;
  // CUDA: that kernel's resident form (CudaBackendOptions::draft_chain_resident, --draft-resident
  // on; off until measured); the CPU backend ignores it.
  bool draft_chain_resident = false;
  // CUDA: the fused chain with its q / k prep folded into the attention stage
  // (CudaBackendOptions::draft_chain_fold_prep, --chain-fold on; off until measured).
  bool draft_chain_fold_prep = false;
  // CUDA: the fused chain prefetching each stage's weight rows before its barrier
  // (CudaBackendOptions::draft_chain_prefetch, --chain-prefetch on; off until measured).
  bool draft_chain_prefetch = false;
  // CUDA: the GDN run kernel on one thread group per head at dk = 64
  // (CudaBackendOptions::gdn_one_group_runs, --gdn-one-group on; off until measured).
  bool gdn_one_group_runs = false;
  // The GDN recurrent state stored in bf16 between steps (worker/model/gdn_state.h,
  // `--gdn-state bf16`; issue #22, docs/quality.md). CUDA: CudaBackendOptions::gdn_state_bf16
  // (bf16 storage). CPU: an emulation, the f32 state rounded to bf16 after every step
  // (cpu::DeltaRuleArgs::state_bf16).
  bool gdn_state_bf16 = false;
  // Paged KV pool (issue #23): tokens of KV the pool holds for all slots together, and tokens per
  // page. kv_pool_tokens 0 = n_slots x slot_ctx (every slot can hold a full context: no sharing);
  // less makes the slots share it (the scheduler admits against it). kv_page_size 0 = the
  // device's default (CUDA 64, CPU 16).
  int64_t kv_pool_tokens = 0;
  int kv_page_size = 0;
  // Share of the device's memory this backend may plan for (two replicas on one GPU: 0.5 each);
  // the CUDA planner also never plans more than is free when it starts (worker/runner/memory_planner.h).
  double memory_fraction = 1.0;
  // Device memory the CUDA planner keeps free for prefix-cache checkpoints (issue #17; the
  // worker's --prefix-cache-mb with the device or auto tier): all of it when required, else at
  // most a quarter of what the smallest plan leaves. The CPU backend ignores it.
  uint64_t prefix_cache_bytes = 0;
  bool prefix_cache_required = false;
  // Token rows per device micro-step (0 = the device's default; CUDA 4096). Most of the CUDA
  // workspace is [rows, width] buffers, so a smaller value leaves more memory for the KV pool
  // (32 GB cards: docs/memory.md); longer prefills are cut into more micro-steps.
  int max_step_tokens = 0;
  // Sequences holding state at once (issue #23: recurrent state per active slot, not per possible
  // slot): 0 = n_slots. Fewer lets a worker address many slots (the scheduler's set-slots
  // headroom) while its device holds GDN state (~150 MB per sequence on the 27B) only for these.
  int max_active_slots = 0;
};

// Opens the model file and creates the CPU reference backend (worker/model/cpu_backend.h).
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const std::string& model_path,
                                                          const BackendOptions& opts);
// The same over a file that is already open (shared: the backend keeps it while it lives).
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(std::shared_ptr<const gguf::File> file,
                                                          const BackendOptions& opts);

}  // namespace ds
