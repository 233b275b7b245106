#include "worker/spec/mtp_speculator.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/metrics/draft_positions.h"

namespace ds::spec {

int DraftBudget(int k, int n_generated, int max_new, int32_t len, int slot_ctx) {
  return std::max(0, std::min({k, max_new - n_generated - 1, slot_ctx - len}));
}

bool DraftsOnDevice(const sampling::SamplingParams& p) {
  return p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f;
}

MtpDrafter::MtpDrafter(const ModelConfig& cfg) : n_vocab_(cfg.n_vocab), n_embd_(cfg.n_embd) {}

namespace {

// Acceptance statistics of one verify (common/metrics/draft_positions.h).
void Count(int n, int kept, SpecStats* stats) {
  if (!stats) return;
  stats->Resize(n);
  metrics::CountDraftPositions(n, kept, stats->offered, stats->accepted);
  ++stats->steps;
  stats->tokens += kept + 1;
}

}  // namespace

absl::Status MtpDrafter::Draft(Backend& be, int slot, std::span<const int32_t> tokens, int32_t p0,
                               std::span<const float> hidden, int n_rows, int n_drafts,
                               sampling::Sampler& sampler, Drafts* out) {
  out->clear();
  // The MTP layer's KV for these positions (rewriting the rows of rejected drafts), in one call.
  if (n_rows > 0)
    DS_RETURN_IF_ERROR(be.MtpRows(slot, p0, tokens.subspan(p0 + 1, n_rows),
                                  hidden.first(static_cast<size_t>(n_rows) * n_embd_),
                                  &mtp_logits_, &mtp_hidden_));
  if (n_drafts <= 0 || n_rows <= 0) return absl::OkStatus();
  history_.assign(tokens.begin(), tokens.end());
  const int32_t t_last = p0 + n_rows - 1;
  for (int j = 0; j < n_drafts; ++j) {
    if (j > 0) {
      chain_hidden_ = mtp_hidden_;
      DS_RETURN_IF_ERROR(be.MtpStep(slot, out->tokens.back(), t_last + j, chain_hidden_,
                                    &mtp_logits_, &mtp_hidden_));
    }
    const int32_t d = sampler.Argmax(mtp_logits_, history_);
    out->tokens.push_back(d);
    history_.push_back(d);
  }
  return absl::OkStatus();
}

int MtpDrafter::Accept(sampling::Sampler& sampler, std::span<const float> logits,
                       const Drafts& drafts, std::vector<int32_t>* tokens, SpecStats* stats) {
  auto row_token = [&](int r) {
    return sampler.Sample(logits.subspan(static_cast<size_t>(r) * n_vocab_, n_vocab_), *tokens)
        .token;
  };
  const int kept = KeepMatchingDrafts(drafts.tokens, row_token, tokens);
  Count(static_cast<int>(drafts.tokens.size()), kept, stats);
  return kept;
}

int MtpDrafter::AcceptTokens(std::span<const int32_t> y, const Drafts& drafts,
                             std::vector<int32_t>* tokens, SpecStats* stats) {
  const int kept = KeepMatchingDrafts(drafts.tokens, [&](int r) { return y[r]; }, tokens);
  Count(static_cast<int>(drafts.tokens.size()), kept, stats);
  return kept;
}

absl::Status MtpDrafter::DraftChain(Backend& be, int slot, int32_t p0,
                                    std::span<const int32_t> catch_up, int out_row0, int n,
                                    bool deferred, Drafts* out) {
  out->clear();
  if (!deferred) return be.MtpDraftGreedy(slot, p0, catch_up, out_row0, n, &out->tokens);
  DS_RETURN_IF_ERROR(be.MtpDraftDeferred(slot, p0, catch_up, out_row0, n));
  ChainQueued(n, out);
  return absl::OkStatus();
}

void MtpDrafter::ChainQueued(int n, Drafts* out) {
  out->tokens.assign(static_cast<size_t>(n), -1);
  out->on_device = n > 0;
}

bool MtpDrafter::TakeChainDrafts(std::span<const int32_t> chain_drafts, size_t* at, Drafts* d) {
  if (!d->on_device) return true;
  const size_t n = d->tokens.size();
  if (*at + n > chain_drafts.size()) return false;
  std::copy(chain_drafts.begin() + *at, chain_drafts.begin() + *at + n, d->tokens.begin());
  d->on_device = false;
  *at += n;
  return true;
}

absl::StatusOr<MtpSpeculator> MtpSpeculator::Create(Backend* backend,
                                                    const MtpSpeculatorOptions& o) {
  if (!backend) return absl::InvalidArgumentError("MtpSpeculator: null backend");
  if (backend->config().n_nextn < 1)
    return absl::FailedPreconditionError(
        "MTP: the model file has no MTP block (nextn_predict_layers = 0)");
  const int max_tokens = backend->max_speculative_tokens();
  if (max_tokens < 2)
    return absl::UnimplementedError(
        absl::StrCat("MTP: backend ", backend->name(), " cannot run speculative steps"));
  if (o.k < 1 || o.k > max_tokens - 1)
    return absl::InvalidArgumentError(absl::StrCat("MTP: ", o.k, " drafts per step; backend ",
                                                   backend->name(), " verifies 1..",
                                                   max_tokens - 1));
  return MtpSpeculator(backend, o);
}

MtpSpeculator::MtpSpeculator(Backend* backend, const MtpSpeculatorOptions& o)
    : be_(backend),
      k_(o.k),
      draft_chain_(o.draft_chain),
      automatic_(o.automatic),
      deferred_drafts_(o.deferred_drafts),
      n_vocab_(backend->config().n_vocab),
      n_embd_(backend->config().n_embd),
      drafter_(backend->config()) {
  stats_.Resize(o.k);
}

int MtpSpeculator::DraftsAfter(const SpecSequence& s, int kept) const {
  // The verify appends kept + 1 tokens (DraftsFor's arguments after it).
  return DraftBudget(k_, s.n_generated() + kept + 1, s.max_new,
                     static_cast<int32_t>(s.tokens.size()) + kept + 1, be_->slot_ctx());
}

void MtpSpeculator::PlanChainsAfter(std::span<SpecSequence* const> seqs) {
  chain_after_.clear();
  chain_planned_.assign(seqs.size(), -1);
  if (!deferred_drafts_ || automatic_ || !be_->SupportsChainAfterVerify() ||
      !be_->SupportsDeviceSampling())
    return;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SpecSequence& s = *seqs[i];
    const int n = DraftsAfter(s, 0);
    if (n < 1 || DraftsAfter(s, static_cast<int>(s.drafts.tokens.size())) != n) continue;
    chain_after_.push_back({static_cast<int>(i), n});
    chain_planned_[i] = n;
  }
}

int MtpSpeculator::DraftsFor(SpecSequence& s) {
  const int k = automatic_ ? AutoDrafts(s.policy, cost_, k_, alone_) : k_;
  return DraftBudget(k, s.n_generated(), s.max_new, static_cast<int32_t>(s.tokens.size()),
                     be_->slot_ctx());
}

void MtpSpeculator::Judged(SpecSequence& s, int offered, int kept) {
  if (automatic_) s.policy.Record(offered, kept);
}

absl::Status MtpSpeculator::Draft(SpecSequence& s, int32_t p0, std::span<const float> hidden,
                                  int n_rows) {
  const int n = DraftsFor(s);
  return drafter_.Draft(*be_, s.slot, s.tokens, p0, hidden, n_rows, n, *s.sampler, &s.drafts);
}

absl::Status MtpSpeculator::Start(std::span<SpecSequence* const> seqs) {
  alone_ = false;  // a prefill is not timed: its first drafts take the default cost
  batch_.assign(seqs.size(), SeqStep{});
  for (size_t i = 0; i < seqs.size(); ++i) {
    SpecSequence& s = *seqs[i];
    if (s.tokens.empty() || !s.sampler)
      return absl::InvalidArgumentError("MTP: a sequence needs a prompt and a sampler");
    if (be_->SlotLength(s.slot) != 0)
      return absl::FailedPreconditionError(
          absl::StrCat("MTP: slot ", s.slot, " is not empty"));
    s.n_prompt = static_cast<int>(s.tokens.size());
    batch_[i].slot = s.slot;
    batch_[i].pos0 = 0;
    batch_[i].tokens = s.tokens;
    // The MTP layer's KV over the prompt is written inside the Forward; its last row waits for
    // the sampled token (the Draft below).
    batch_[i].fill_mtp = true;
    batch_[i].mtp_next = -1;
  }
  StepOptions opts;
  opts.want_hidden = true;
  DS_RETURN_IF_ERROR(be_->Forward(batch_, opts, &out_));
  for (size_t i = 0; i < seqs.size(); ++i) {
    SpecSequence& s = *seqs[i];
    const int32_t last = static_cast<int32_t>(s.tokens.size()) - 1;
    s.tokens.push_back(
        s.sampler->Sample(std::span<const float>(out_.logits).subspan(i * n_vocab_, n_vocab_),
                          s.tokens)
            .token);
    DS_RETURN_IF_ERROR(
        Draft(s, last, std::span<const float>(out_.hidden).subspan(i * n_embd_, n_embd_), 1));
  }
  return absl::OkStatus();
}

bool MtpSpeculator::UseDraftChain(std::span<SpecSequence* const> seqs) const {
  if (!draft_chain_ || !be_->SupportsDraftChain()) return false;
  // The drafts read the verify rows' hidden states from the Forward's last micro-step: keep the
  // verify to rows that one micro-step holds on every device (CUDA: 64 logit rows).
  size_t rows = 0;
  for (const SpecSequence* s : seqs) {
    if (!DraftsOnDevice(s->sampler->params())) return false;
    rows += 1 + s->drafts.tokens.size();
  }
  return rows <= 32;
}

absl::Status MtpSpeculator::StepOnDevice(std::span<SpecSequence* const> seqs) {
  StepOptions opts;  // no hidden states: the drafts take them where they are
  const bool device_sample = be_->SupportsDeviceSampling();
  if (device_sample) {
    // Every row sampled where the logits are, with the uniform of its position; no logits
    // cross. Without penalties the history does not change a row's token (the executor does the
    // same).
    sample_rows_.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      DeviceSampleRow d;
      d.mode = DeviceSampleRow::Mode::kSample;
      d.params = &seqs[i]->sampler->params();
      d.history = seqs[i]->tokens;
      for (size_t r = 0; r < batch_[i].tokens.size(); ++r) {
        d.uniform = d.params->temperature > 0.0f ? seqs[i]->sampler->UniformAt(d.history.size() + r)
                                                 : 0.0;
        sample_rows_.push_back(d);
      }
    }
    opts.device_sample = sample_rows_;
    // Chains the Forward queues behind the verify's sampling (judged on the device where it can).
    PlanChainsAfter(seqs);
    opts.chain_after = chain_after_;
  } else {
    chain_after_.clear();
    chain_planned_.assign(seqs.size(), -1);
  }
  DS_RETURN_IF_ERROR(be_->Forward(batch_, opts, &out_));
  DS_RETURN_IF_ERROR(ReadChainDrafts(seqs));
  // A chain the Forward could not queue is made below as without chain_after.
  for (size_t j = 0; j < chain_after_.size(); ++j)
    if (j >= out_.chains_after.size() || !out_.chains_after[j])
      chain_planned_[chain_after_[j].seq] = -1;
  size_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    SpecSequence& s = *seqs[i];
    const size_t rows = batch_[i].tokens.size();
    const int kept =
        device_sample
            ? MtpDrafter::AcceptTokens(std::span<const int32_t>(out_.tokens).subspan(row, rows),
                                       s.drafts, &s.tokens, &stats_)
            : drafter_.Accept(
                  *s.sampler,
                  std::span<const float>(out_.logits.data() + row * n_vocab_, rows * n_vocab_),
                  s.drafts, &s.tokens, &stats_);
    Judged(s, static_cast<int>(rows) - 1, kept);
    const int32_t p0 = batch_[i].pos0;
    const int n = DraftsFor(s);
    if (chain_planned_[i] >= 0) {  // the Forward queued it (StepOptions::chain_after)
      if (n != chain_planned_[i])
        return absl::InternalError(absl::StrCat("MTP: ", n, " drafts after the verify, ",
                                                chain_planned_[i], " queued with it"));
      MtpDrafter::ChainQueued(n, &s.drafts);
      ++chains_after_verify_;
      if (batch_[i].speculative) DS_RETURN_IF_ERROR(be_->CommitSpeculative(s.slot, kept + 1));
      row += rows;
      continue;
    }
    // Deferred: the next verify reads the drafts where they are made. The chain is queued
    // before the rollback's state copies: it reads no recurrent state, and the device then
    // starts it without waiting for the host to issue those copies (on the demo model ~12 us
    // of the ~45 us between a verify and its chain, docs/perf/h200.md); the copies run during
    // or after it, before the next verify.
    DS_RETURN_IF_ERROR(MtpDrafter::DraftChain(
        *be_, s.slot, p0, std::span<const int32_t>(s.tokens).subspan(p0 + 1, kept + 1),
        static_cast<int>(row), n, deferred_drafts_, &s.drafts));
    if (batch_[i].speculative) DS_RETURN_IF_ERROR(be_->CommitSpeculative(s.slot, kept + 1));
    row += rows;
  }
  return absl::OkStatus();
}

absl::Status MtpSpeculator::Step(std::span<SpecSequence* const> seqs) {
  // `auto` with one sequence: the step's time against its drafts verified and made (draft_cost.h).
  alone_ = automatic_ && seqs.size() == 1;
  const auto t0 = std::chrono::steady_clock::now();
  const int offered = alone_ ? static_cast<int>(seqs[0]->drafts.tokens.size()) : 0;
  DS_RETURN_IF_ERROR(StepBatch(seqs));
  if (alone_)
    cost_.Record(offered, static_cast<int>(seqs[0]->drafts.tokens.size()),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return absl::OkStatus();
}

absl::Status MtpSpeculator::ReadChainDrafts(std::span<SpecSequence* const> seqs) {
  size_t at = 0;
  for (SpecSequence* s : seqs)
    if (!MtpDrafter::TakeChainDrafts(out_.chain_drafts, &at, &s->drafts))
      return absl::InternalError(absl::StrCat("MTP: the verify returned ", out_.chain_drafts.size(),
                                              " deferred drafts, fewer than its sequences ran"));
  return absl::OkStatus();
}

absl::Status MtpSpeculator::StepBatch(std::span<SpecSequence* const> seqs) {
  batch_.assign(seqs.size(), SeqStep{});
  for (size_t i = 0; i < seqs.size(); ++i) {
    SpecSequence& s = *seqs[i];
    SeqStep& q = batch_[i];
    q.slot = s.slot;
    q.pos0 = static_cast<int32_t>(s.tokens.size()) - 1;
    q.tokens.assign(1, s.tokens.back());
    q.tokens.insert(q.tokens.end(), s.drafts.tokens.begin(), s.drafts.tokens.end());
    q.all_logits = true;
    q.speculative = !s.drafts.tokens.empty();
    q.decode_path = true;
    q.chain_drafts = s.drafts.on_device;
  }
  if (UseDraftChain(seqs)) return StepOnDevice(seqs);
  StepOptions opts;
  opts.want_hidden = true;
  DS_RETURN_IF_ERROR(be_->Forward(batch_, opts, &out_));
  DS_RETURN_IF_ERROR(ReadChainDrafts(seqs));
  size_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    SpecSequence& s = *seqs[i];
    const size_t rows = batch_[i].tokens.size();
    const int kept = drafter_.Accept(
        *s.sampler,
        std::span<const float>(out_.logits.data() + row * n_vocab_, rows * n_vocab_), s.drafts,
        &s.tokens, &stats_);
    if (batch_[i].speculative) DS_RETURN_IF_ERROR(be_->CommitSpeculative(s.slot, kept + 1));
    Judged(s, static_cast<int>(rows) - 1, kept);
    DS_RETURN_IF_ERROR(Draft(s, batch_[i].pos0,
                             std::span<const float>(out_.hidden.data() + row * n_embd_,
                                                    static_cast<size_t>(kept + 1) * n_embd_),
                             kept + 1));
    row += rows;
  }
  return absl::OkStatus();
}

}  // namespace ds::spec
