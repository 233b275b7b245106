#include "worker/spec/mtp_speculator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ds::spec {

absl::StatusOr<MtpSpeculator> MtpSpeculator::Create(Backend* backend, int k) {
  if (!backend) return absl::InvalidArgumentError("MtpSpeculator: null backend");
  if (backend->config().n_nextn < 1)
    return absl::FailedPreconditionError(
        "MTP: the model file has no MTP block (nextn_predict_layers = 0)");
  const int max_tokens = backend->max_speculative_tokens();
  if (max_tokens < 2)
    return absl::UnimplementedError(
        absl::StrCat("MTP: backend ", backend->name(), " cannot run speculative steps"));
  if (k < 1 || k > max_tokens - 1)
    return absl::InvalidArgumentError(absl::StrCat("MTP: ", k, " drafts per step; backend ",
                                                   backend->name(), " verifies 1..",
                                                   max_tokens - 1));
  return MtpSpeculator(backend, k);
}

MtpSpeculator::MtpSpeculator(Backend* backend, int k)
    : be_(backend),
      k_(k),
      n_vocab_(backend->config().n_vocab),
      n_embd_(backend->config().n_embd),
      scratch_(static_cast<size_t>(backend->config().n_vocab), 0.0) {
  stats_.offered.assign(k, 0);
  stats_.accepted.assign(k, 0);
}

int32_t MtpSpeculator::DraftToken(SpecSequence& s, std::span<const float> logits,
                                  std::span<const int32_t> history, Distribution* q) {
  if (s.sampler->params().temperature <= 0.0f) {
    q->clear();
    return s.sampler->Sample(logits, history).token;  // greedy: the argmax, no random draw
  }
  *q = s.sampler->Distribution(logits, history);
  const double u = s.sampler->PeekUniform();
  s.sampler->ConsumeUniform();
  return DrawFrom(*q, u);
}

absl::Status MtpSpeculator::Draft(SpecSequence& s, int32_t p0, std::span<const float> hidden,
                                  int n_rows) {
  s.drafts.clear();
  s.draft_q.clear();
  // The MTP layer's KV for the accepted positions: row t pairs h_t with the token after it.
  for (int i = 0; i < n_rows; ++i) {
    const int32_t t = p0 + i;
    DS_RETURN_IF_ERROR(be_->MtpStep(s.slot, s.tokens[t + 1], t,
                                    hidden.subspan(static_cast<size_t>(i) * n_embd_, n_embd_),
                                    &mtp_logits_, &mtp_hidden_));
  }
  // Drafts the next verify step can use: it emits at most drafts + 1 tokens, and its last row
  // must stay inside the slot.
  const int32_t len = static_cast<int32_t>(s.tokens.size());
  const int remaining = s.max_new - s.n_generated();
  const int room = be_->slot_ctx() - len;
  const int n = std::min({k_, remaining - 1, room});
  if (n <= 0) return absl::OkStatus();
  std::vector<int32_t> history = s.tokens;
  const int32_t t_last = p0 + n_rows - 1;
  for (int j = 0; j < n; ++j) {
    if (j > 0) {
      chain_hidden_ = mtp_hidden_;
      DS_RETURN_IF_ERROR(be_->MtpStep(s.slot, s.drafts.back(), t_last + j, chain_hidden_,
                                      &mtp_logits_, &mtp_hidden_));
    }
    Distribution q;
    const int32_t d = DraftToken(s, mtp_logits_, history, &q);
    s.drafts.push_back(d);
    s.draft_q.push_back(std::move(q));
    history.push_back(d);
  }
  return absl::OkStatus();
}

absl::Status MtpSpeculator::Start(std::span<SpecSequence* const> seqs) {
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
    batch_[i].all_logits = true;  // every row's hidden state feeds the MTP layer's KV
  }
  StepOptions opts;
  opts.want_hidden = true;
  DS_RETURN_IF_ERROR(be_->Forward(batch_, opts, &out_));
  size_t row = 0;
  for (SpecSequence* sp : seqs) {
    SpecSequence& s = *sp;
    const size_t n = s.tokens.size();
    const std::span<const float> last(out_.logits.data() + (row + n - 1) * n_vocab_, n_vocab_);
    s.tokens.push_back(s.sampler->Sample(last, s.tokens).token);
    DS_RETURN_IF_ERROR(Draft(s, 0,
                             std::span<const float>(out_.hidden.data() + row * n_embd_,
                                                    n * n_embd_),
                             static_cast<int>(n)));
    row += n;
  }
  return absl::OkStatus();
}

absl::Status MtpSpeculator::Step(std::span<SpecSequence* const> seqs) {
  batch_.assign(seqs.size(), SeqStep{});
  for (size_t i = 0; i < seqs.size(); ++i) {
    SpecSequence& s = *seqs[i];
    SeqStep& q = batch_[i];
    q.slot = s.slot;
    q.pos0 = static_cast<int32_t>(s.tokens.size()) - 1;
    q.tokens.assign(1, s.tokens.back());
    q.tokens.insert(q.tokens.end(), s.drafts.begin(), s.drafts.end());
    q.all_logits = true;
    q.speculative = !s.drafts.empty();
    q.decode_path = true;
  }
  StepOptions opts;
  opts.want_hidden = true;
  DS_RETURN_IF_ERROR(be_->Forward(batch_, opts, &out_));
  size_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    SpecSequence& s = *seqs[i];
    const int32_t pos0 = batch_[i].pos0;
    const int n_drafts = static_cast<int>(s.drafts.size());
    const bool greedy = s.sampler->params().temperature <= 0.0f;
    auto logits_row = [&](int r) {
      return std::span<const float>(out_.logits.data() + (row + r) * n_vocab_, n_vocab_);
    };
    int kept = 0;
    int32_t bonus = -1;
    for (int d = 0; d < n_drafts; ++d) {
      ++stats_.offered[d];
      const int32_t draft = s.drafts[d];
      if (greedy) {
        const int32_t y = s.sampler->Sample(logits_row(d), s.tokens).token;
        if (y != draft) {
          bonus = y;
          break;
        }
      } else {
        const Distribution p = s.sampler->Distribution(logits_row(d), s.tokens);
        const double u_accept = s.sampler->PeekUniform();
        s.sampler->ConsumeUniform();
        const double u_resample = s.sampler->PeekUniform();
        const Verdict v = JudgeDraft(p, s.draft_q[d], draft, u_accept, u_resample, &scratch_);
        if (!v.accepted) {
          s.sampler->ConsumeUniform();
          bonus = v.token;
          break;
        }
      }
      ++stats_.accepted[d];
      s.tokens.push_back(draft);
      ++kept;
    }
    if (bonus < 0) bonus = s.sampler->Sample(logits_row(kept), s.tokens).token;
    s.tokens.push_back(bonus);
    ++stats_.steps;
    stats_.tokens += kept + 1;
    if (batch_[i].speculative) DS_RETURN_IF_ERROR(be_->CommitSpeculative(s.slot, kept + 1));
    DS_RETURN_IF_ERROR(Draft(s, pos0,
                             std::span<const float>(out_.hidden.data() + row * n_embd_,
                                                    static_cast<size_t>(kept + 1) * n_embd_),
                             kept + 1));
    row += batch_[i].tokens.size();
  }
  return absl::OkStatus();
}

}  // namespace ds::spec
