// StepRunner (step_runner.h), its MTP half: the MTP block's own steps (MtpStep, MtpRows), the
// greedy draft chains on the device (MtpDraftGreedy, MtpDraftDeferred and the deferred drafts a
// later Forward takes), and the chains a verify's Forward queues itself (StepOptions::chain_after).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/runner/step_runner.h"

namespace ds {

absl::Status StepRunner::MtpAvailable() const {
  if (cfg_.n_nextn < 1)
    return absl::FailedPreconditionError(
        "the model file has no MTP block (nextn_predict_layers = 0)");
  if (tp_.world > 1 && !VocabParallel())
    return absl::UnimplementedError(
        "MTP under tensor parallelism needs the vocab-parallel lm_head: the MTP head is cut "
        "like it (docs/tp.md §10), not kept on rank 0");
  if (dev_->limits().max_spec_tokens == 0)
    return absl::UnimplementedError(absl::StrCat(
        "device ", name(), " holds no MTP block (created without room for speculative steps)"));
  return absl::OkStatus();
}

absl::Status StepRunner::MtpRows(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                 std::span<const float> hidden, std::vector<float>* logits,
                                 std::vector<float>* hidden_out) {
  DS_RETURN_IF_ERROR(MtpAvailable());
  if (slot < 0 || slot >= n_slots())
    return absl::InvalidArgumentError(
        absl::StrCat("MtpRows: slot ", slot, " out of range [0, ", n_slots(), ")"));
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0 || static_cast<int64_t>(hidden.size()) != n * cfg_.n_embd)
    return absl::InvalidArgumentError(absl::StrCat("MtpRows: ", tokens.size(), " tokens with ",
                                                   hidden.size(), " hidden values (n_embd ",
                                                   cfg_.n_embd, ")"));
  if (pos0 < 0 || pos0 + n > slot_ctx_)
    return absl::OutOfRangeError(absl::StrCat("MtpRows: positions [", pos0, ", ", pos0 + n,
                                              ") out of range [0, ", slot_ctx_, ")"));
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg_.n_vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("MtpRows: token id ", t, " out of range [0, ", cfg_.n_vocab, ")"));
  if (!logits || !hidden_out) return absl::InvalidArgumentError("MtpRows: null output");
  const int32_t dv = Dev(slot);
  if (dv < 0)
    return absl::FailedPreconditionError(
        absl::StrCat("MtpRows: slot ", slot, " holds no sequence"));
  // A device may keep the MTP layer's K/V in the slot's pages (one more attention plane): draft
  // positions past the slot's length need their pages mapped first.
  DS_RETURN_IF_ERROR(GrowPagesTo(dv, static_cast<int64_t>(pos0) + n));
  return dev_->MtpRows(dv, pos0, tokens, hidden, cfg_.n_embd, logits, hidden_out);
}

absl::Status StepRunner::CheckDraftChain(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                         int out_row0, int n_drafts) {
  if (!SupportsDraftChain())
    return absl::UnimplementedError(absl::StrCat("MtpDraftGreedy: not available on ", name(),
                                                 tp_.world > 1 ? " under tensor parallelism" : ""));
  if (slot < 0 || slot >= n_slots() || Dev(slot) < 0)
    return absl::FailedPreconditionError(
        absl::StrCat("MtpDraftGreedy: slot ", slot, " holds no sequence"));
  const int n = static_cast<int>(tokens.size());
  if (n < 1 || n_drafts < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("MtpDraftGreedy: ", n, " rows, ", n_drafts, " drafts"));
  // The last pass writes the MTP row of the last draft but one: rows [pos0, pos0 + n + d - 1).
  const int64_t end = static_cast<int64_t>(pos0) + n + std::max(0, n_drafts - 1);
  if (pos0 < 0 || end > slot_ctx_)
    return absl::OutOfRangeError(absl::StrCat("MtpDraftGreedy: positions [", pos0, ", ", end,
                                              ") out of range [0, ", slot_ctx_, ")"));
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg_.n_vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("MtpDraftGreedy: token id ", t, " out of range [0, ", cfg_.n_vocab, ")"));
  if (last_out_row0_ < 0 || out_row0 < last_out_row0_ ||
      out_row0 + n > last_out_row0_ + last_out_rows_)
    return absl::FailedPreconditionError(absl::StrCat(
        "MtpDraftGreedy: output rows [", out_row0, ", ", out_row0 + n,
        ") are not in the last micro-step of the last Forward (rows [", last_out_row0_, ", ",
        last_out_row0_ + last_out_rows_, ")): use MtpRows with the hidden states"));
  // Whatever the slot's last chain left for its next step is stale now (its MTP rows rewritten).
  deferred_[slot].n = 0;
  return GrowPagesTo(Dev(slot), end);
}

absl::Status StepRunner::MtpDraftGreedy(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                        int out_row0, int n_drafts, std::vector<int32_t>* drafts) {
  if (!drafts) return absl::InvalidArgumentError("MtpDraftGreedy: drafts is null");
  DS_RETURN_IF_ERROR(CheckDraftChain(slot, pos0, tokens, out_row0, n_drafts));
  drafts->assign(static_cast<size_t>(n_drafts), -1);
  return dev_->MtpDraftGreedy(Dev(slot), pos0, tokens, out_row0 - last_out_row0_, last_out_rows_,
                              cfg_.n_embd, n_drafts, drafts->data());
}

absl::Status StepRunner::MtpDraftDeferred(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                          int out_row0, int n_drafts) {
  DS_RETURN_IF_ERROR(CheckDraftChain(slot, pos0, tokens, out_row0, n_drafts));
  DeferredDrafts& d = deferred_[slot];
  const bool on_device = dev_->KeepsDeferredDrafts() && n_drafts > 0;
  d.host.assign(on_device ? 0 : static_cast<size_t>(n_drafts), -1);
  DS_RETURN_IF_ERROR(dev_->MtpDraftGreedy(Dev(slot), pos0, tokens, out_row0 - last_out_row0_,
                                          last_out_rows_, cfg_.n_embd, n_drafts,
                                          on_device ? nullptr : d.host.data()));
  d.n = n_drafts;
  return absl::OkStatus();
}

absl::Status StepRunner::CheckChainsAfter(std::span<const SeqStep> batch, const StepOptions& opts) {
  if (opts.chain_after.empty()) return absl::OkStatus();
  if (!SupportsChainAfterVerify())
    return absl::InvalidArgumentError(
        absl::StrCat("Forward: chain_after needs draft chains and device sampling (", name(), ")"));
  out_row_of_.assign(batch.size(), 0);
  for (size_t i = 0, row = 0; i < batch.size(); ++i) {
    out_row_of_[i] = static_cast<int32_t>(row);
    row += batch[i].all_logits ? batch[i].tokens.size() : 1;
  }
  for (size_t j = 0; j < opts.chain_after.size(); ++j) {
    const ChainAfterVerify& c = opts.chain_after[j];
    bool twice = false;  // the lists are a few entries long: no set to allocate per step
    for (size_t e = 0; e < j; ++e) twice |= opts.chain_after[e].seq == c.seq;
    if (c.seq < 0 || c.seq >= static_cast<int>(batch.size()) || twice || c.n_drafts < 1)
      return absl::InvalidArgumentError(absl::StrCat("Forward: chain_after for sequence ", c.seq,
                                                     " of ", batch.size(), " with ", c.n_drafts,
                                                     " drafts (one per sequence, at least one)"));
    const SeqStep& s = batch[c.seq];
    if (!s.all_logits || (!s.speculative && s.tokens.size() != 1) || Dev(s.slot) < 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "Forward: chain_after for sequence ", c.seq,
          ", which is not a verify (all_logits, speculative unless one token) of a held slot"));
    for (size_t r = 0; r < s.tokens.size(); ++r) {
      const size_t row = out_row_of_[c.seq] + r;
      if (row >= opts.device_sample.size() ||
          opts.device_sample[row].mode != DeviceSampleRow::Mode::kSample)
        return absl::InvalidArgumentError(absl::StrCat("Forward: chain_after for sequence ", c.seq,
                                                       ", whose row ", r,
                                                       " is not sampled on the device"));
    }
    if (ChainAfterEnd(s, c) > slot_ctx_)
      return absl::OutOfRangeError(absl::StrCat("Forward: chain_after for sequence ", c.seq,
                                                " would write MTP rows up to ", ChainAfterEnd(s, c),
                                                " past the slot's ", slot_ctx_));
  }
  return absl::OkStatus();
}

absl::Status StepRunner::QueueChainsAfter(std::span<const SeqStep> batch, const StepOptions& opts,
                                          int row0, int n_rows, StepOutput* out) {
  // The device's Finish waits only for what was queued before its chains, so nothing the host
  // needs may follow them: a step that also fills MTP rows (FillMtp, after this, uploads from a
  // pinned buffer the host rewrites after the wait) leaves its chains to the runner.
  for (const SeqStep& s : batch)
    if (s.fill_mtp) return absl::OkStatus();
  for (size_t j = 0; j < opts.chain_after.size(); ++j) {
    const ChainAfterVerify& c = opts.chain_after[j];
    const SeqStep& s = batch[c.seq];
    const int first = out_row_of_[c.seq], n = static_cast<int>(s.tokens.size());
    if (first < row0 || first + n > row0 + n_rows) continue;  // another micro-step's rows
    // The chain's pages after the step's own (as after the step without chain_after): where the
    // pool has none left, the runner's route below meets the same refusal and the caller drafts
    // as it would have (StepOutput::chains_after 0).
    if (absl::Status g = GrowPagesTo(Dev(s.slot), ChainAfterEnd(s, c)); !g.ok()) {
      if (absl::IsResourceExhausted(g)) continue;
      return g;
    }
    DS_ASSIGN_OR_RETURN(const bool queued,
                        dev_->QueueChainAfterVerify(Dev(s.slot), s.pos0, first - row0, n,
                                                    s.chain_drafts, c.n_drafts));
    out->chains_after[j] = queued;
  }
  return absl::OkStatus();
}

absl::Status StepRunner::FinishChainsAfter(std::span<const SeqStep> batch, const StepOptions& opts,
                                           StepOutput* step_out) {
  const StepOutput& out = *step_out;
  for (size_t j = 0; j < opts.chain_after.size(); ++j) {
    const ChainAfterVerify& c = opts.chain_after[j];
    const SeqStep& s = batch[c.seq];
    const int first = out_row_of_[c.seq], offered = static_cast<int>(s.tokens.size()) - 1;
    // Where its drafts start in out.chain_drafts (TakeChainDrafts' order: batch order).
    size_t drafts_at = 0;
    for (int i = 0; i < c.seq; ++i)
      if (batch[i].chain_drafts) drafts_at += batch[i].tokens.size() - 1;
    auto draft = [&](int i) {  // d_(i+1), as the step ran it
      return s.chain_drafts ? out.chain_drafts[drafts_at + i] : s.tokens[1 + i];
    };
    int kept = 0;
    while (kept < offered && draft(kept) == out.tokens[first + kept]) ++kept;
    if (out.chains_after[j]) {  // queued by the device (QueueChainsAfter)
      dev_->ChainAfterVerifyKept(Dev(s.slot), s.pos0, kept, c.n_drafts);
      DeferredDrafts& d = deferred_[s.slot];
      d.n = c.n_drafts;
      d.host.clear();
      continue;
    }
    // The chain reads the hidden rows the device still holds: the last micro-step's only.
    if (first < last_out_row0_ || first + kept + 1 > last_out_row0_ + last_out_rows_) continue;
    catch_up_.clear();
    for (int i = 0; i < kept; ++i) catch_up_.push_back(draft(i));
    catch_up_.push_back(out.tokens[first + kept]);
    if (absl::Status st = MtpDraftDeferred(s.slot, s.pos0, catch_up_, first, c.n_drafts);
        !st.ok()) {
      if (absl::IsResourceExhausted(st)) continue;  // no pages for it: the caller's to decide
      return st;
    }
    step_out->chains_after[j] = 1;
  }
  return absl::OkStatus();
}

std::span<const SeqStep> StepRunner::FillChainDrafts(std::span<const SeqStep> batch) {
  if (dev_->KeepsDeferredDrafts()) return batch;  // Prepare puts them in (MicroStep::chain_tokens)
  bool any = false;
  for (const SeqStep& s : batch) any |= s.chain_drafts;
  if (!any) return batch;
  batch_filled_.assign(batch.begin(), batch.end());
  for (SeqStep& s : batch_filled_) {
    if (!s.chain_drafts) continue;
    const std::vector<int32_t>& h = deferred_[s.slot].host;  // Validate matched the counts
    std::copy(h.begin(), h.end(), s.tokens.begin() + 1);
    s.chain_drafts = false;
  }
  return batch_filled_;
}

absl::Status StepRunner::TakeChainDrafts(std::span<const SeqStep> batch,
                                         std::vector<int32_t>* out) {
  absl::Status st;
  for (const SeqStep& s : batch) {
    DeferredDrafts& d = deferred_[s.slot];
    if (s.chain_drafts && d.n > 0) {
      const size_t old = out->size();
      out->resize(old + d.n, -1);
      if (!d.host.empty()) {
        std::copy(d.host.begin(), d.host.end(), out->begin() + old);
      } else if (st.ok()) {
        st = dev_->DeferredDrafts(Dev(s.slot), d.n, out->data() + old);
      }
    }
    d.n = 0;
  }
  return st;
}

absl::Status StepRunner::MtpStep(int slot, int32_t token, int32_t pos,
                                 std::span<const float> hidden, std::vector<float>* logits,
                                 std::vector<float>* hidden_out) {
  // One MTP row: the same checks, page mapping and device call as MtpRows of one token.
  return MtpRows(slot, pos, std::span<const int32_t>(&token, 1), hidden, logits, hidden_out);
}

}  // namespace ds
