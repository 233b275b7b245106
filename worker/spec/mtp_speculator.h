// MTP speculative decoding over a Backend (issue #15; spec/model.md §8.3): the model's own MTP
// head drafts k tokens per sequence, one Forward of the main model verifies every sequence's
// drafts at once, and each sequence keeps the longest accepted prefix plus one token of the main
// model — 1 to k + 1 tokens per step, with the output distribution of plain decoding.
//
// Per sequence and step:
//   verify   SeqStep{tokens = [pending, d_1..d_k], all_logits, speculative} (decode path: the
//            rows are computed as k + 1 decode steps would), hidden states of every row;
//   accept   d_i is kept while it equals the main model's token at row i - 1, sampled with the
//            sequence's own sampler (greedy: the argmax; sampling: the uniform of the row's
//            position), then the main model's token after the last kept draft (the bonus token):
//            the standard rule for deterministic drafts (speculative_rule.h), so the tokens are
//            plain decoding's, per seed too;
//   rollback Backend::CommitSpeculative(slot, kept + 1): the recurrent state after the last kept
//            token, without recomputing anything; the attention KV past it is dead;
//   draft    MtpStep over the accepted positions (h_p with the token after it) fills the MTP
//            layer's KV, the last one gives d'_1, and d'_j = MTP(d'_{j-1}, h'_{j-1}) for j <= k;
//            each draft is the MTP logits' argmax after the request's penalties.
// Sequences without penalties on a backend with draft chains (Backend::SupportsDraftChain, e.g.
// CUDA) take a fast path: the verify rows are sampled where the logits are (device sampling, each
// row with its position's uniform) and the catch-up + drafts run there from the verify's hidden
// states (Backend::MtpDraftGreedy: the raw argmax, which is the draft when nothing penalizes), so
// only token ids cross to the host and both halves replay as graphs.
// The prompt is prefilled with every row's hidden state, so the MTP KV covers it too.
//
// Not thread-safe; one caller drives it (like the Backend under it).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "common/sampling/sampler.h"
#include "common/util/status.h"
#include "worker/model/backend.h"
#include "worker/spec/draft_cost.h"
#include "worker/spec/draft_policy.h"
#include "worker/spec/speculative_rule.h"

namespace ds::spec {

// A sequence's drafts for its next verify step.
struct Drafts {
  std::vector<int32_t> tokens;
  // The values are still with the backend (Backend::MtpDraftDeferred): `tokens` holds as many
  // placeholders (-1) until the verify that reads them returns them.
  bool on_device = false;
  void clear() {
    tokens.clear();
    on_device = false;
  }
};

// Acceptance over a run: drafts offered and kept at each draft position (1-based in the text,
// index 0 here), and steps.
struct SpecStats {
  std::vector<int64_t> offered, accepted;  // [k]
  int64_t steps = 0;
  int64_t tokens = 0;  // emitted by the verify steps
  double mean_accepted_length() const { return steps ? static_cast<double>(tokens) / steps : 0; }
  void Add(const SpecStats& o) {
    Resize(static_cast<int>(o.offered.size()));
    for (size_t i = 0; i < o.offered.size(); ++i) {
      offered[i] += o.offered[i];
      accepted[i] += o.accepted[i];
    }
    steps += o.steps;
    tokens += o.tokens;
  }
  void Resize(int k) {
    if (static_cast<int>(offered.size()) < k) {
      offered.resize(k, 0);
      accepted.resize(k, 0);
    }
  }
};

// The two halves of a speculative step that do not depend on how the batch was built, shared by
// MtpSpeculator and the worker's step executor. Keeps scratch buffers; not thread-safe.
class MtpDrafter {
 public:
  explicit MtpDrafter(const ModelConfig& cfg);

  // Fills the MTP layer's KV for positions [p0, p0 + n_rows) — row i pairs hidden row i (the
  // main model's final-normed state at p0 + i) with tokens[p0 + i + 1] — and drafts n_drafts
  // tokens from the last one, chaining the MTP's own hidden state. n_drafts 0: KV only.
  absl::Status Draft(Backend& be, int slot, std::span<const int32_t> tokens, int32_t p0,
                     std::span<const float> hidden, int n_rows, int n_drafts,
                     sampling::Sampler& sampler, Drafts* out);

  // Judges `drafts` against the main model's logits rows [drafts + 1][n_vocab] (row i predicts
  // the token after tokens.back() + the first i drafts) and appends the kept drafts and the bonus
  // token to *tokens. Returns how many drafts were kept. Counts into *stats when not null.
  int Accept(sampling::Sampler& sampler, std::span<const float> logits, const Drafts& drafts,
             std::vector<int32_t>* tokens, SpecStats* stats);
  // Acceptance from the main model's own tokens y [drafts + 1] (row i's token, sampled on the
  // device with the sampler's uniform of its position): the drafts equal to y[i] while they
  // match, then y[kept]. The same verdict as Accept over those rows' logits.
  static int AcceptTokens(std::span<const int32_t> y, const Drafts& drafts,
                          std::vector<int32_t>* tokens, SpecStats* stats);
  // The draft chain on the backend (Backend::MtpDraftGreedy; the catch-up rows `catch_up` at p0,
  // hidden rows from output row out_row0 of the last Forward): n drafts into *out, or with
  // `deferred` left on the backend (Backend::MtpDraftDeferred) and n placeholders in *out.
  static absl::Status DraftChain(Backend& be, int slot, int32_t p0,
                                 std::span<const int32_t> catch_up, int out_row0, int n,
                                 bool deferred, Drafts* out);
  // After a verify: d's share of StepOutput::chain_drafts, from *at on (advanced), when d was
  // deferred. False when the verify returned fewer than d ran with.
  static bool TakeChainDrafts(std::span<const int32_t> chain_drafts, size_t* at, Drafts* d);
  // A chain queued with its n drafts left on the backend (MtpDraftDeferred, or the Forward's
  // StepOptions::chain_after): n placeholders in *out.
  static void ChainQueued(int n, Drafts* out);

 private:
  int n_vocab_ = 0, n_embd_ = 0;
  std::vector<float> mtp_logits_, mtp_hidden_, chain_hidden_;
  std::vector<int32_t> history_;
};

// One sequence decoded with drafts. The caller owns it and its sampler.
struct SpecSequence {
  int slot = 0;
  // Prompt, then every generated token; the last one is pending (not yet in the backend's state)
  // once the sequence started.
  std::vector<int32_t> tokens;
  sampling::Sampler* sampler = nullptr;
  int max_new = 1 << 30;  // drafts never reach past this many generated tokens
  // Filled by the speculator.
  int n_prompt = 0;
  Drafts drafts;  // for the next step
  DraftPolicy policy;  // `auto`: this sequence's drafts from its acceptance
  int n_generated() const { return static_cast<int>(tokens.size()) - n_prompt; }
};

// Drafts a sequence may use: a verify step emits at most drafts + 1 tokens (max_new counts them)
// and its last row must stay inside the slot.
int DraftBudget(int k, int n_generated, int max_new, int32_t len, int slot_ctx);

// No penalties: a row's token depends on its logits and its position's uniform only, and the
// draft is the raw argmax, so a device may pick both (verify rows sampled on the device, drafts
// chained there: Backend::MtpDraftGreedy).
bool DraftsOnDevice(const sampling::SamplingParams& p);

struct MtpSpeculatorOptions {
  // Drafts per step, 1..backend.max_speculative_tokens() - 1 (the cap under `automatic`).
  int k = 3;
  // false keeps every sequence on the host path (A/B, tests).
  bool draft_chain = true;
  // `--mtp auto`: each sequence drafts what its DraftPolicy picks, a lone sequence at the cost
  // this speculator times from its own steps (draft_cost.h), as the worker's step executor does.
  bool automatic = false;
  // Draft chains leave their drafts with the backend (Backend::MtpDraftDeferred) and the next
  // verify reads them there: the host waits once per cycle (for the verify) instead of twice
  // (`--deferred-drafts on`, the default). The same tokens and drafts either way.
  bool deferred_drafts = true;
};

class MtpSpeculator {
 public:
  // The backend must implement MtpStep and speculative steps.
  static absl::StatusOr<MtpSpeculator> Create(Backend* backend, const MtpSpeculatorOptions& o);

  // Prefills each sequence's prompt (its tokens; the slot must be empty), samples its first
  // token and drafts. Appends one token to every sequence.
  absl::Status Start(std::span<SpecSequence* const> seqs);
  // One verify step for every sequence: appends 1..k+1 tokens to each.
  absl::Status Step(std::span<SpecSequence* const> seqs);

  const SpecStats& stats() const { return stats_; }
  // Draft chains the verify's Forward queued itself (StepOptions::chain_after), since Create.
  int64_t chains_after_verify() const { return chains_after_verify_; }
  int k() const { return k_; }

 private:
  MtpSpeculator(Backend* backend, const MtpSpeculatorOptions& o);
  absl::Status Draft(SpecSequence& s, int32_t p0, std::span<const float> hidden, int n_rows);
  // Drafts for s's next step: k, or under `auto` its policy's choice (alone: at the measured
  // cost, with a plain step now and then to keep it measured).
  int DraftsFor(SpecSequence& s);
  // `auto`: a verify of s kept `kept` of the `offered` drafts.
  void Judged(SpecSequence& s, int offered, int kept);
  // The fast path for sequences without penalties on a backend with draft chains: the verify rows'
  // tokens are picked where the logits are (no logits or hidden states to the host) and the
  // drafts are chained there too; only token ids cross. Same tokens as the host path.
  bool UseDraftChain(std::span<SpecSequence* const> seqs) const;
  absl::Status StepOnDevice(std::span<SpecSequence* const> seqs);
  absl::Status StepBatch(std::span<SpecSequence* const> seqs);  // Step without the timing
  // The drafts s takes after a verify that keeps `kept` of its drafts (DraftsFor after it).
  int DraftsAfter(const SpecSequence& s, int kept) const;
  // StepOnDevice's chains that the verify's Forward queues itself (StepOptions::chain_after):
  // deferred drafts, a fixed k (not `auto`, whose choice follows the verdict) and a draft count
  // the verdict cannot change (DraftsAfter the same for every kept). chain_after_ lists them,
  // chain_planned_[i] their draft counts (-1: the sequence's chain is queued after the Forward).
  void PlanChainsAfter(std::span<SpecSequence* const> seqs);
  // After a verify: the deferred drafts it ran with (StepOutput::chain_drafts) into each
  // sequence's Drafts, so that acceptance judges their values.
  absl::Status ReadChainDrafts(std::span<SpecSequence* const> seqs);

  Backend* be_;
  int k_ = 0;
  bool draft_chain_ = true;
  bool automatic_ = false;
  bool deferred_drafts_ = false;
  bool alone_ = false;  // the current step has one sequence
  DraftCostEstimator cost_;
  int n_vocab_ = 0, n_embd_ = 0;
  SpecStats stats_;
  MtpDrafter drafter_;
  std::vector<SeqStep> batch_;
  StepOutput out_;
  std::vector<DeviceSampleRow> sample_rows_;
  std::vector<ChainAfterVerify> chain_after_;
  std::vector<int> chain_planned_;
  int64_t chains_after_verify_ = 0;
};

}  // namespace ds::spec
