#include "worker/runner/step_runner.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "worker/runner/micro_steps.h"
#include "worker/runner/slot_snapshot.h"
#include "worker/tp/vocab_gather.h"

namespace ds {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

absl::StatusOr<tp::Plan> MakeTpPlan(const gguf::File& f, const ModelConfig& c,
                                    const BackendOptions& opts) {
  std::vector<double> split = opts.tp_split;
  if (split.empty()) split.assign(opts.tp_world, 1.0);
  if (static_cast<int>(split.size()) != opts.tp_world)
    return absl::InvalidArgumentError(absl::StrCat("BackendOptions.tp_split has ", split.size(),
                                                   " weights for tp_world ", opts.tp_world));
  DS_ASSIGN_OR_RETURN(const int64_t granule, tp::FfnGranule(f, c));
  tp::HeadGranules hg;
  if (opts.tp_align_heads) {
    DS_ASSIGN_OR_RETURN(hg, tp::AlignedHeadGranules(f, c));
  }
  return tp::Plan::Make(c, split, granule,
                        opts.tp_lm_head_rank0 ? tp::LmHead::kRank0 : tp::LmHead::kVocabParallel,
                        hg.attn, hg.gdn);
}

LocalShape TpPlacement::Local(const ModelConfig& c) const {
  if (world == 1) return {c.n_head, c.n_head_kv, c.gdn_k_heads, c.gdn_v_heads, c.n_ff, c.n_vocab};
  return {plan.q_heads(rank),
          plan.kv_heads(rank),
          plan.gdn_k(rank),
          plan.gdn_v(rank),
          plan.ranks[rank].ffn.size(),
          plan.ranks[rank].vocab.size()};
}

absl::StatusOr<TpPlacement> PlaceInGroup(const gguf::File& f, const ModelConfig& c,
                                         const BackendOptions& opts) {
  if (opts.n_slots < 1 || opts.n_slots > 4096)
    return absl::InvalidArgumentError(absl::StrCat("BackendOptions.n_slots = ", opts.n_slots,
                                                   " must be in [1, 4096]"));
  if (opts.slot_ctx < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("BackendOptions.slot_ctx = ", opts.slot_ctx, " must be >= 1"));
  if (opts.tp_world < 1 || opts.tp_rank < 0 || opts.tp_rank >= opts.tp_world)
    return absl::InvalidArgumentError(absl::StrCat("BackendOptions: tp_rank ", opts.tp_rank,
                                                   " not in a tp_world of ", opts.tp_world));
  if (opts.tp_world > 1 && !opts.collective)
    return absl::InvalidArgumentError(absl::StrCat("BackendOptions: tp_world ", opts.tp_world,
                                                   " needs a collective (collective is null)"));
  TpPlacement p;
  if (opts.collective) {
    Collective* coll = opts.collective;
    if (coll->world() != opts.tp_world || coll->rank() != opts.tp_rank)
      return absl::InvalidArgumentError(absl::StrCat(
          "BackendOptions: collective ", coll->name(), " is rank ", coll->rank(), " of ",
          coll->world(), " but the options say rank ", opts.tp_rank, " of ", opts.tp_world));
    p.collective = coll;
  }
  p.rank = opts.tp_rank;
  p.world = opts.tp_world;
  p.lm_head_rank0 = opts.tp_lm_head_rank0;
  if (opts.tp_world > 1) {
    DS_ASSIGN_OR_RETURN(p.plan, MakeTpPlan(f, c, opts));
  }
  return p;
}

StepRunner::StepRunner(std::unique_ptr<Device> device, std::shared_ptr<const gguf::File> file,
                       const ModelConfig& cfg, int n_slots, int slot_ctx, TpPlacement tp,
                       int n_device_slots)
    : file_(std::move(file)),
      dev_(std::move(device)),
      cfg_(cfg),
      slot_ctx_(slot_ctx),
      tp_(std::move(tp)),
      len_(static_cast<size_t>(n_slots), 0),
      spec_(static_cast<size_t>(n_slots)),
      deferred_(static_cast<size_t>(n_slots)) {
  n_device_slots_ = n_device_slots > 0 && n_device_slots < n_slots ? n_device_slots : n_slots;
  bind_lazily_ = n_device_slots_ < n_slots;
  dev_of_.assign(static_cast<size_t>(n_slots), -1);
  if (bind_lazily_) {
    for (int32_t d = 0; d < n_device_slots_; ++d) free_dev_.insert(d);
  } else {
    for (int32_t s = 0; s < n_slots; ++s) dev_of_[s] = s;
  }
  const KvPaging kp = dev_->kv_paging();
  if (kp.n_pages > 0) {
    // The device validated these figures when it allocated the pages.
    auto pool =
        KvPagePool::Create(kp.n_pages, kp.page_size, n_device_slots_, kp.max_pages_per_slot);
    if (pool.ok()) {
      pool_ = std::move(*pool);
      paged_ = true;
    }
  }
}

absl::Status StepRunner::Bind(int slot) {
  if (dev_of_[slot] >= 0) return absl::OkStatus();
  if (free_dev_.empty())
    return absl::ResourceExhaustedError(absl::StrCat(
        "slot ", slot, ": all ", n_device_slots_,
        " active sequences hold state (max_active_slots): end or preempt one and retry"));
  const int32_t d = *free_dev_.begin();
  free_dev_.erase(free_dev_.begin());
  dev_->ResetSlot(d);
  dev_of_[slot] = d;
  return absl::OkStatus();
}

void StepRunner::Unbind(int slot) {
  if (!bind_lazily_ || dev_of_[slot] < 0) return;
  free_dev_.insert(dev_of_[slot]);
  dev_of_[slot] = -1;
}

absl::Status StepRunner::NoPendingSpeculation(const char* what) const {
  if (pending_specs_ == 0) return absl::OkStatus();
  for (size_t s = 0; s < spec_.size(); ++s)
    if (spec_[s])
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": slot ", s, " has a speculative step waiting for CommitSpeculative"));
  return absl::OkStatus();
}

int StepRunner::max_speculative_seqs() const {
  const DeviceLimits& lim = dev_->limits();
  return lim.max_spec_tokens > 0 ? lim.spec_entries / lim.max_spec_tokens : 0;
}

absl::Status StepRunner::CommitSpeculative(int slot, int32_t n_keep) {
  if (slot < 0 || slot >= n_slots() || !spec_[slot])
    return absl::FailedPreconditionError(absl::StrCat(
        "CommitSpeculative: slot ", slot, " ran no speculative step in the last Forward"));
  const PendingSpec p = *spec_[slot];
  if (n_keep < 1 || n_keep > p.n)
    return absl::InvalidArgumentError(absl::StrCat("CommitSpeculative: n_keep ", n_keep,
                                                   " not in [1, ", p.n, "]"));
  DS_RETURN_IF_ERROR(dev_->CommitSpeculative(Dev(slot), p.entry0 + n_keep - 1));
  len_[slot] = p.pos0 + n_keep;
  spec_[slot].reset();
  --pending_specs_;
  return absl::OkStatus();
}

absl::Status StepRunner::Validate(std::span<const SeqStep> batch) const {
  if (batch.empty()) return absl::InvalidArgumentError("Forward: empty batch");
  DS_RETURN_IF_ERROR(NoPendingSpeculation("Forward"));
  const DeviceLimits& lim = dev_->limits();
  int spec_tokens = 0;
  int unbound = 0;  // sequences that start in this step and need a device slot
  std::vector<bool> seen(len_.size(), false);
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqStep& s = batch[i];
    if (s.slot < 0 || s.slot >= n_slots())
      return absl::InvalidArgumentError(
          absl::StrCat("batch[", i, "]: slot ", s.slot, " out of range [0, ", n_slots(), ")"));
    if (seen[s.slot])
      return absl::InvalidArgumentError(
          absl::StrCat("batch[", i, "]: slot ", s.slot, " appears more than once in the step"));
    seen[s.slot] = true;
    unbound += Dev(s.slot) < 0;
    if (s.tokens.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("batch[", i, "]: slot ", s.slot, " has no tokens"));
    if (s.pos0 != len_[s.slot])
      return absl::InvalidArgumentError(absl::StrCat("batch[", i, "]: pos0 ", s.pos0,
                                                     " != current length ", len_[s.slot],
                                                     " of slot ", s.slot));
    if (s.chain_drafts) {
      const int pending = deferred_[s.slot].n;
      if (pending < 1 || static_cast<int>(s.tokens.size()) != pending + 1)
        return absl::InvalidArgumentError(absl::StrCat(
            "batch[", i, "]: chain_drafts with ", s.tokens.size() - 1, " drafts but slot ", s.slot,
            " has ", pending, " deferred drafts (MtpDraftDeferred)"));
    }
    // A chain_drafts sequence's tokens[1..] are placeholders: its drafts come from the chain.
    const size_t checked = s.chain_drafts ? 1 : s.tokens.size();
    for (size_t j = 0; j < checked; ++j)
      if (s.tokens[j] < 0 || s.tokens[j] >= cfg_.n_vocab)
        return absl::InvalidArgumentError(absl::StrCat("batch[", i, "]: token id ", s.tokens[j],
                                                       " at index ", j, " out of range [0, ",
                                                       cfg_.n_vocab, ")"));
    if (s.speculative) {
      if (lim.max_spec_tokens == 0)
        return absl::InvalidArgumentError(absl::StrCat(
            "batch[", i, "]: speculative steps are not available on ", name()));
      if (static_cast<int>(s.tokens.size()) > lim.max_spec_tokens)
        return absl::InvalidArgumentError(absl::StrCat("batch[", i, "]: ", s.tokens.size(),
                                                       " speculative tokens > the device's ",
                                                       lim.max_spec_tokens));
      spec_tokens += static_cast<int>(s.tokens.size());
    }
    if (s.fill_mtp) {
      if (absl::Status m = MtpAvailable(); !m.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("batch[", i, "]: fill_mtp: ", m.message()));
      if (s.speculative)
        return absl::InvalidArgumentError(
            absl::StrCat("batch[", i, "]: fill_mtp with a speculative verify"));
      if (s.mtp_next < -1 || s.mtp_next >= cfg_.n_vocab)
        return absl::InvalidArgumentError(absl::StrCat("batch[", i, "]: mtp_next ", s.mtp_next,
                                                       " out of range [-1, ", cfg_.n_vocab, ")"));
    }
    const int64_t end = static_cast<int64_t>(s.pos0) + static_cast<int64_t>(s.tokens.size());
    if (end > slot_ctx_)
      return absl::OutOfRangeError(absl::StrCat("batch[", i, "]: slot ", s.slot, " would hold ",
                                                end, " tokens > slot_ctx ", slot_ctx_));
  }
  if (unbound > static_cast<int>(free_dev_.size()))
    return absl::ResourceExhaustedError(absl::StrCat(
        "Forward: ", unbound, " new sequences but ", free_dev_.size(), " of ", n_device_slots_,
        " active-sequence slots are free (max_active_slots): end or preempt one and retry"));
  if (spec_tokens > lim.spec_entries)
    return absl::InvalidArgumentError(absl::StrCat("Forward: ", spec_tokens,
                                                   " speculative tokens > the device's ",
                                                   lim.spec_entries, " speculative entries"));
  if (paged_) {
    // Slots are distinct, so the pages the step needs add up exactly.
    int64_t need = 0;
    for (const SeqStep& s : batch) {
      const int64_t end = static_cast<int64_t>(s.pos0) + s.tokens.size();
      need += Dev(s.slot) >= 0 ? pool_.PagesToGrow(Dev(s.slot), end) : pool_.PagesFor(end);
    }
    if (need > pool_.free_pages())
      return absl::ResourceExhaustedError(absl::StrCat(
          "Forward: the step needs ", need, " more KV pages (", need * pool_.page_size(),
          " tokens) but ", pool_.free_pages(), " of ", pool_.total_pages(),
          " are free (KV pool exhausted: preempt a sequence and retry)"));
  }
  return absl::OkStatus();
}

absl::Status StepRunner::GrowPages(std::span<const SeqStep> batch) {
  if (!paged_) return absl::OkStatus();
  for (const SeqStep& s : batch)
    DS_RETURN_IF_ERROR(GrowPagesTo(Dev(s.slot), static_cast<int64_t>(s.pos0) + s.tokens.size()));
  return absl::OkStatus();
}

absl::Status StepRunner::GrowPagesTo(int32_t device_slot, int64_t n_tokens) {
  if (!paged_) return absl::OkStatus();
  DS_ASSIGN_OR_RETURN(const int first, pool_.Grow(device_slot, n_tokens));
  const std::span<const int32_t> pages = pool_.pages(device_slot);
  if (first < static_cast<int>(pages.size()))
    DS_RETURN_IF_ERROR(dev_->MapPages(device_slot, first, pages.subspan(first)));
  return absl::OkStatus();
}

absl::Status StepRunner::RunMicroStep() {
  DS_RETURN_IF_ERROR(dev_->Prepare(micro_));
  auto body = [this]() -> absl::Status {
    DS_RETURN_IF_ERROR(dev_->Embed());
    for (int l = 0; l < cfg_.n_layer; ++l) DS_RETURN_IF_ERROR(dev_->Layer(l));
    return dev_->Head();
  };
  if (micro_.decode_only)
    DS_RETURN_IF_ERROR(dev_->RunCaptured(micro_, body));
  else
    DS_RETURN_IF_ERROR(body());
  if (VocabParallel() && micro_.n_logit_rows() > 0)
    DS_RETURN_IF_ERROR(GatherVocabParallelLogits(micro_.n_logit_rows()));
  return absl::OkStatus();
}

absl::Status StepRunner::RunMicroSteps(std::span<const SeqStep> batch,
                                       const std::function<absl::Status(int)>& read_outputs) {
  const DeviceLimits& lim = dev_->limits();
  last_micro_steps_ = 0;
  // New sequences take their device slots (Validate counted them free).
  batch_dev_.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    DS_RETURN_IF_ERROR(Bind(batch[i].slot));
    batch_dev_[i] = Dev(batch[i].slot);
  }
  DS_RETURN_IF_ERROR(GrowPages(batch));
  // Speculative sequences take consecutive entries, one per token, in batch order.
  spec_base_.assign(batch.size(), -1);
  bool any_spec = false;
  for (int32_t i = 0, next = 0; i < static_cast<int32_t>(batch.size()); ++i)
    if (batch[i].speculative) {
      spec_base_[i] = next;
      next += static_cast<int32_t>(batch[i].tokens.size());
      any_spec = true;
    }
  const std::span<const int32_t> spec_base =
      any_spec ? std::span<const int32_t>(spec_base_) : std::span<const int32_t>();
  last_out_row0_ = -1;
  int out_rows = 0;
  for (const auto& pieces :
       SplitIntoMicroSteps(batch, lim.max_rows, lim.max_logit_rows, lim.max_decode_rows)) {
    ++last_micro_steps_;
    BuildMicroStep(batch, pieces, &micro_, spec_base,
                   bind_lazily_ ? std::span<const int32_t>(batch_dev_) : std::span<const int32_t>());
    DS_RETURN_IF_ERROR(RunMicroStep());
    DS_RETURN_IF_ERROR(read_outputs(micro_.n_logit_rows()));
    DS_RETURN_IF_ERROR(FillMtp(batch, pieces));
    // The reads land before the next micro-step (or the caller) touches their destinations.
    DS_RETURN_IF_ERROR(dev_->Finish());
    last_out_row0_ = out_rows;
    last_out_rows_ = micro_.n_logit_rows();
    out_rows += micro_.n_logit_rows();
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqStep& s = batch[i];
    len_[s.slot] += static_cast<int32_t>(s.tokens.size());
    if (s.speculative) {
      spec_[s.slot] = PendingSpec{s.pos0, static_cast<int32_t>(s.tokens.size()), spec_base_[i]};
      ++pending_specs_;
    }
  }
  return absl::OkStatus();
}

absl::Status StepRunner::FillMtp(std::span<const SeqStep> batch,
                                 std::span<const StepPiece> pieces) {
  // BuildMicroStep made one run per piece, in piece order. A piece's last row pairs with the
  // first token of the sequence's next piece, or with the SeqStep's mtp_next after its last.
  for (size_t j = 0; j < pieces.size(); ++j) {
    const StepPiece& p = pieces[j];
    const SeqStep& s = batch[p.seq];
    if (!s.fill_mtp) continue;
    const int32_t next = p.last ? s.mtp_next : s.tokens[p.t0 + p.n];
    DS_RETURN_IF_ERROR(dev_->MtpFill(micro_.runs[j], next));
  }
  return absl::OkStatus();
}

absl::Status StepRunner::GatherVocabParallelLogits(int n_rows) {
  // The collective takes the device's buffers but is not ordered with its work (NCCL runs the
  // gather on its own stream, the staged collective through host copies): finish the head first.
  DS_RETURN_IF_ERROR(dev_->Finish());
  const LogitBuffers b = dev_->logit_buffers();
  const auto t0 = std::chrono::steady_clock::now();
  DS_RETURN_IF_ERROR(tp::GatherVocabParallel(
      *tp_.collective, tp_.plan, cfg_.n_vocab, n_rows, b.local, b.gathered, b.full,
      [this](float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t width,
             int64_t rows) { return dev_->CopyColumns(dst, ld_dst, src, ld_src, width, rows); }));
  gather_seconds_ += SecondsSince(t0);
  return absl::OkStatus();
}

absl::Status StepRunner::Forward(std::span<const SeqStep> batch, const StepOptions& opts,
                                 StepOutput* out) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!out) return absl::InvalidArgumentError("Forward: out is null");
  DS_RETURN_IF_ERROR(Validate(batch));
  // Device sampling: one entry per output row; logits cross to the host only if a row asks.
  const std::span<const DeviceSampleRow> sample = opts.device_sample;
  bool host_logits = true;
  if (!sample.empty()) {
    if (!SupportsDeviceSampling())
      return absl::InvalidArgumentError(
          absl::StrCat("Forward: device sampling is not available on ", name(),
                       tp_.world > 1 ? " under tensor parallelism" : ""));
    size_t n_out = 0;
    for (const SeqStep& s : batch) n_out += s.all_logits ? s.tokens.size() : 1;
    if (sample.size() != n_out)
      return absl::InvalidArgumentError(absl::StrCat("Forward: ", sample.size(),
                                                     " device_sample rows for ", n_out,
                                                     " output rows"));
    host_logits = false;
    for (const DeviceSampleRow& d : sample) host_logits |= d.mode == DeviceSampleRow::Mode::kLogits;
  }
  out->logits.clear();
  out->hidden.clear();
  out->chain_drafts.clear();
  out->chains_after.assign(opts.chain_after.size(), 0);
  out->tokens.assign(sample.size(), -1);
  out->n_rows = 0;
  gather_seconds_ = 0;
  dev_->TakeCommSeconds();
  DS_RETURN_IF_ERROR(CheckChainsAfter(batch, opts));
  const std::span<const SeqStep> filled = FillChainDrafts(batch);
  absl::Status run = RunMicroSteps(filled, [&](int nl) -> absl::Status {
    if (nl > 0) {
      if (!sample.empty())
        DS_RETURN_IF_ERROR(
            dev_->Sample(sample.subspan(out->n_rows, nl), out->tokens.data() + out->n_rows));
      if (host_logits && HasLogits()) {
        const size_t old = out->logits.size();
        out->logits.resize(old + static_cast<size_t>(nl) * cfg_.n_vocab);
        DS_RETURN_IF_ERROR(dev_->ReadLogits(nl, out->logits.data() + old));
      }
      if (opts.want_hidden) {
        const size_t old = out->hidden.size();
        out->hidden.resize(old + static_cast<size_t>(nl) * cfg_.n_embd);
        DS_RETURN_IF_ERROR(dev_->ReadHidden(nl, out->hidden.data() + old));
      }
      // Last: the device's Finish then waits for everything queued before the chains.
      if (!opts.chain_after.empty())
        DS_RETURN_IF_ERROR(QueueChainsAfter(batch, opts, out->n_rows, nl, out));
    }
    out->n_rows += nl;
    return absl::OkStatus();
  });
  // Every slot of the batch drops its deferred drafts, whether the step took them or not.
  absl::Status taken = TakeChainDrafts(batch, &out->chain_drafts);
  DS_RETURN_IF_ERROR(run);
  DS_RETURN_IF_ERROR(taken);
  if (!opts.chain_after.empty()) DS_RETURN_IF_ERROR(FinishChainsAfter(batch, opts, out));
  out->comm_seconds = dev_->TakeCommSeconds() + gather_seconds_;
  out->forward_seconds = SecondsSince(t0);
  return absl::OkStatus();
}

absl::Status StepRunner::ForwardGreedy(std::span<const SeqStep> batch,
                                       std::vector<int32_t>* tokens, double* seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  DS_RETURN_IF_ERROR(Validate(batch));
  for (const SeqStep& s : batch) {
    if (s.all_logits) return absl::InvalidArgumentError("ForwardGreedy: all_logits not supported");
    if (s.chain_drafts)
      return absl::InvalidArgumentError("ForwardGreedy: chain_drafts not supported (use Forward)");
  }
  for (const SeqStep& s : batch) deferred_[s.slot].n = 0;
  tokens->clear();
  DS_RETURN_IF_ERROR(RunMicroSteps(batch, [&](int nl) -> absl::Status {
    if (nl == 0 || !HasLogits()) return absl::OkStatus();  // rank0 lm_head: the others pick none
    const size_t old = tokens->size();
    tokens->resize(old + nl);
    return dev_->Argmax(nl, tokens->data() + old);
  }));
  if (seconds) *seconds = SecondsSince(t0);
  return absl::OkStatus();
}

void StepRunner::ResetSlot(int slot) {
  if (slot < 0 || slot >= n_slots()) return;
  if (spec_[slot]) {
    spec_[slot].reset();
    --pending_specs_;
  }
  deferred_[slot].n = 0;
  if (Dev(slot) >= 0) {
    dev_->ResetSlot(Dev(slot));
    if (paged_) pool_.Release(Dev(slot));  // its pages go back to the pool for the other slots
  }
  Unbind(slot);  // and its device slot (recurrent state) to the next sequence
  len_[slot] = 0;
}

int32_t StepRunner::SlotLength(int slot) const {
  return slot >= 0 && slot < n_slots() ? len_[slot] : 0;
}

absl::StatusOr<SlotSnapshot> StepRunner::Snapshot(int slot) const {
  if (slot < 0 || slot >= n_slots())
    return absl::InvalidArgumentError(
        absl::StrCat("Snapshot: slot ", slot, " out of range [0, ", n_slots(), ")"));
  DS_RETURN_IF_ERROR(NoPendingSpeculation("Snapshot"));
  if (Dev(slot) < 0)
    return absl::FailedPreconditionError(
        absl::StrCat("Snapshot: slot ", slot, " holds no sequence"));
  DS_ASSIGN_OR_RETURN(std::vector<uint8_t> payload, dev_->SaveState(Dev(slot), len_[slot]));
  SlotSnapshot snap;
  snap.n_past = len_[slot];
  snap.bytes = EncodeSlotSnapshot(dev_->state_layout(), len_[slot], payload);
  return snap;
}

absl::Status StepRunner::Restore(int slot, const SlotSnapshot& snap) {
  if (slot < 0 || slot >= n_slots())
    return absl::InvalidArgumentError(
        absl::StrCat("Restore: slot ", slot, " out of range [0, ", n_slots(), ")"));
  DS_RETURN_IF_ERROR(NoPendingSpeculation("Restore"));
  DS_ASSIGN_OR_RETURN(DecodedSlotSnapshot d, DecodeSlotSnapshot(snap.bytes));
  if (d.layout != dev_->state_layout())
    return absl::InvalidArgumentError(absl::StrCat("Restore: snapshot of state layout '",
                                                   d.layout, "' cannot be restored on '",
                                                   dev_->state_layout(), "'"));
  if (d.n_past != snap.n_past || d.n_past < 0 || d.n_past > slot_ctx_)
    return absl::InvalidArgumentError(absl::StrCat("Restore: snapshot of ", d.n_past,
                                                   " tokens (SlotSnapshot.n_past ", snap.n_past,
                                                   ") does not fit slot_ctx ", slot_ctx_));
  return RestoreInto(slot, d.n_past,
                     [&](int32_t dv) { return dev_->LoadState(dv, d.n_past, d.payload); });
}

absl::Status StepRunner::RestoreInto(int slot, int32_t n_past,
                                     const std::function<absl::Status(int32_t)>& load) {
  deferred_[slot].n = 0;  // drafts of the slot's old sequence
  DS_RETURN_IF_ERROR(Bind(slot));
  const int32_t dv = Dev(slot);
  if (paged_) {
    // The slot's old pages go back; the restored sequence takes fresh ones (refused, with the
    // slot left empty, when the pool cannot hold it).
    pool_.Release(dv);
    len_[slot] = 0;
    absl::StatusOr<int> first = pool_.Grow(dv, n_past);
    if (!first.ok()) {
      Unbind(slot);
      return first.status();
    }
    const std::span<const int32_t> pages = pool_.pages(dv);
    absl::Status st = pages.empty() ? absl::OkStatus() : dev_->MapPages(dv, 0, pages);
    if (st.ok()) st = load(dv);
    if (!st.ok()) {
      pool_.Release(dv);
      Unbind(slot);
      return st;
    }
    len_[slot] = n_past;
    return absl::OkStatus();
  }
  DS_RETURN_IF_ERROR(load(dv));
  len_[slot] = n_past;
  return absl::OkStatus();
}

namespace {

// A checkpoint the device holds (Device::SaveStateOnDevice) and the layout it was taken in.
struct DeviceStateCheckpoint : StateCheckpoint {
  std::shared_ptr<void> mem;
  std::string layout;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateCheckpoint>> StepRunner::SaveCheckpoint(int slot) {
  if (slot < 0 || slot >= n_slots())
    return absl::InvalidArgumentError(
        absl::StrCat("SaveCheckpoint: slot ", slot, " out of range [0, ", n_slots(), ")"));
  DS_RETURN_IF_ERROR(NoPendingSpeculation("SaveCheckpoint"));
  if (Dev(slot) < 0)
    return absl::FailedPreconditionError(
        absl::StrCat("SaveCheckpoint: slot ", slot, " holds no sequence"));
  auto c = std::make_unique<DeviceStateCheckpoint>();
  DS_ASSIGN_OR_RETURN(c->mem, dev_->SaveStateOnDevice(Dev(slot), len_[slot], &c->bytes));
  c->n_past = len_[slot];
  c->layout = dev_->state_layout();
  return std::unique_ptr<StateCheckpoint>(std::move(c));
}

absl::Status StepRunner::LoadCheckpoint(int slot, const StateCheckpoint& checkpoint) {
  if (slot < 0 || slot >= n_slots())
    return absl::InvalidArgumentError(
        absl::StrCat("LoadCheckpoint: slot ", slot, " out of range [0, ", n_slots(), ")"));
  DS_RETURN_IF_ERROR(NoPendingSpeculation("LoadCheckpoint"));
  const auto* c = dynamic_cast<const DeviceStateCheckpoint*>(&checkpoint);
  if (c == nullptr || c->layout != dev_->state_layout() || c->n_past < 0 || c->n_past > slot_ctx_)
    return absl::InvalidArgumentError(
        "LoadCheckpoint: not a checkpoint of this device's state layout and context");
  return RestoreInto(slot, c->n_past, [&](int32_t dv) {
    return dev_->LoadStateFromDevice(dv, c->n_past, c->mem.get(), c->bytes);
  });
}

}  // namespace ds
