#include "worker/process/step_executor.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"

namespace ds::worker {
namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The sampler's parameters for a start: n_logprobs within what the sampler returns, and a seed.
sampling::SamplingParams Seeded(sampling::SamplingParams s) {
  s.n_logprobs = std::clamp(s.n_logprobs, 0, sampling::kMaxLogprobs);
  if (s.seed == 0) {
    // 0 = random: two draws from the OS entropy source, so concurrent workers never collide.
    std::random_device rd;
    s.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (s.seed == 0) s.seed = 1;
  }
  return s;
}

}  // namespace

StepExecutor::StepExecutor(Backend* backend, int n_usable)
    : backend_(backend), slots_(static_cast<size_t>(n_usable)) {}

absl::Status StepExecutor::SetMtp(const spec::MtpSetting& setting) {
  if (setting.drafts == 0) {
    mtp_ = {};
    drafter_.reset();
    return absl::OkStatus();
  }
  if (absl::Status m = backend_->MtpAvailable(); !m.ok())
    return absl::Status(m.code(), absl::StrCat("--mtp: ", m.message()));
  const int max_tokens = backend_->max_speculative_tokens();
  if (max_tokens < 2)
    return absl::UnimplementedError(absl::StrCat("--mtp: backend ", backend_->name(),
                                                 " cannot run speculative steps"));
  if (setting.drafts > max_tokens - 1)
    return absl::InvalidArgumentError(absl::StrCat("--mtp ", setting.drafts, ": backend ",
                                                   backend_->name(), " verifies at most ",
                                                   max_tokens - 1, " drafts"));
  mtp_ = setting;
  drafter_.emplace(backend_->config());
  mtp_stats_.Resize(setting.drafts);
  return absl::OkStatus();
}

int StepExecutor::FixedDraftsAfter(int slot_index, int kept, int n_mtp_slots) const {
  const SlotState& slot = slots_[slot_index];
  int k = spec::DraftsForBatch(mtp_, n_mtp_slots);
  if (slot.mtp_cap > 0) k = std::min(k, slot.mtp_cap);
  const int known = static_cast<int>(slot.known.size()) + kept + 1;  // after the verify
  return spec::DraftBudget(k, known - slot.n_prompt, slot.max_new, known, backend_->slot_ctx());
}

void StepExecutor::DraftAfter(int slot_index, int32_t p0, int out_row0,
                              std::span<const float> hidden, int n_rows, int n_mtp_slots,
                              bool alone) {
  SlotState& slot = slots_[slot_index];
  int k = spec::DraftsForBatch(mtp_, n_mtp_slots);
  if (slot.mtp_cap > 0) k = std::min(k, slot.mtp_cap);
  // One sequence alone on an ungrouped worker: this worker's own cost figure, and now and then a
  // plain step to keep it measured; a TP group keeps the default, so that every rank drafts the
  // same.
  if (mtp_.automatic) k = spec::AutoDrafts(slot.policy, draft_cost_, k, alone);
  const int n = spec::DraftBudget(k,
                                  static_cast<int>(slot.known.size()) - slot.n_prompt,
                                  slot.max_new, static_cast<int32_t>(slot.known.size()),
                                  backend_->slot_ctx());
  // No penalties, on a backend with draft chains: the drafts are made where the model ran, from
  // the hidden rows it still holds (the rows must be in the Forward's last micro-step; else the
  // host path below, from the copied hidden states).
  if (spec::DraftsOnDevice(slot.sampler->params()) && backend_->SupportsDraftChain()) {
    // Deferred: left on the backend for the slot's next verify (SeqStep::chain_drafts).
    const absl::Status cs = spec::MtpDrafter::DraftChain(
        *backend_, slot_index, p0, std::span<const int32_t>(slot.known).subspan(p0 + 1, n_rows),
        out_row0, n, deferred_drafts_ && group_ == nullptr, &slot.drafts);
    if (cs.ok()) return;
    slot.drafts.clear();
    if (!absl::IsFailedPrecondition(cs)) {
      slot.mtp = false;
      return;
    }
  }
  if (!drafter_->Draft(*backend_, slot_index, slot.known, p0, hidden, n_rows, n, *slot.sampler,
                       &slot.drafts)
           .ok()) {
    slot.mtp = false;
    slot.drafts.clear();
  }
}

void StepExecutor::SaveCheckpoint(int slot, uint64_t id, int32_t n_past,
                                  std::span<const uint64_t> pinned, StepResult* result) {
  // The scheduler names the length it expects; a slot that holds another (a speculative step
  // kept other tokens, a failed start) is not saved rather than saved under the wrong prefix.
  if (backend_->SlotLength(slot) != n_past) {
    result->checkpoints_failed.push_back(id);
    return;
  }
  absl::StatusOr<uint64_t> bytes = store_->Save(id, slot, pinned, &result->checkpoints_evicted);
  if (bytes.ok()) {
    result->checkpoints_saved.push_back(CheckpointSaved{id, *bytes});
  } else {
    result->checkpoints_failed.push_back(id);
  }
}

bool StepExecutor::AgreeWithGroup(std::span<const uint64_t> ids,
                                  std::span<const uint32_t> resumed, StepResult* result) {
  auto failed_here = [&](uint64_t id) {
    return std::find(result->checkpoints_failed.begin(), result->checkpoints_failed.end(), id) !=
           result->checkpoints_failed.end();
  };
  agree_.assign(ids.size() + resumed.size(), 0.0f);
  for (size_t i = 0; i < ids.size(); ++i) agree_[i] = failed_here(ids[i]) ? 1.0f : 0.0f;
  for (size_t j = 0; j < resumed.size(); ++j)
    agree_[ids.size() + j] =
        std::find(missed_.begin(), missed_.end(), resumed[j]) != missed_.end() ? 1.0f : 0.0f;
  if (absl::Status s = group_->AllReduceSum(agree_.data(), agree_.size()); !s.ok()) {
    group_broken_ = true;
    result->error = "tp agreement on the prefix cache: " + s.ToString();
    return false;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (agree_[i] == 0.0f || failed_here(ids[i])) continue;
    // Saved here, failed on another rank: no rank keeps it.
    store_->Drop(ids[i]);
    std::erase_if(result->checkpoints_saved,
                  [&](const CheckpointSaved& c) { return c.id == ids[i]; });
    result->checkpoints_failed.push_back(ids[i]);
  }
  for (size_t j = 0; j < resumed.size(); ++j) {
    const uint32_t slot = resumed[j];
    if (agree_[ids.size() + j] == 0.0f ||
        std::find(missed_.begin(), missed_.end(), slot) != missed_.end())
      continue;
    backend_->ResetSlot(static_cast<int>(slot));  // loaded here, not everywhere: start over
    missed_.push_back(slot);
  }
  return true;
}

absl::Status StepExecutor::Validate(const Step& step) const {
  const int n = static_cast<int>(slots_.size());
  const bool cache = store_ != nullptr && store_->enabled();
  for (const CheckpointSave& c : step.saves) {
    if (!cache)
      return absl::FailedPreconditionError("step saves a checkpoint but the prefix cache is off");
    if (c.slot >= static_cast<uint32_t>(n) || !slots_[c.slot].active)
      return absl::InvalidArgumentError(absl::StrCat("checkpoint save of idle slot ", c.slot));
  }
  for (const SlotWork& w : step.work)
    if (w.checkpoint != 0 && !cache)
      return absl::FailedPreconditionError("step saves a checkpoint but the prefix cache is off");
  for (const SequenceStart& st : step.started) {
    if (st.resume_checkpoint == 0) continue;
    if (!cache)
      return absl::FailedPreconditionError(
          absl::StrCat("request ", st.request_id, " resumes from a checkpoint but the prefix cache is off"));
    // The store holds it, or this step's saves (applied first) make it. Under TP a rank may have
    // lost one its peers hold (stores evict on their own): not an error there, the ranks agree
    // on a miss instead (AgreeWithGroup), so every rank runs the same rows.
    bool known = group_ != nullptr ||
                 store_->Length(st.resume_checkpoint) == static_cast<int32_t>(st.resume_len);
    for (const CheckpointSave& c : step.saves)
      known |= c.id == st.resume_checkpoint && c.n_past == st.resume_len;
    if (st.resume_len == 0 || st.resume_len >= st.tokens.size() || !known)
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", st.request_id, " resumes from checkpoint ", st.resume_checkpoint, " of ",
          st.resume_len, " positions (the cache holds ", store_->Length(st.resume_checkpoint),
          ") with ", st.tokens.size(), " known tokens"));
  }
  for (uint32_t s : step.released)
    if (s >= static_cast<uint32_t>(n))
      return absl::InvalidArgumentError(absl::StrCat("released slot ", s, " >= n_slots ", n));
  std::vector<bool> started(n, false);
  for (const SequenceStart& st : step.started) {
    if (st.slot >= static_cast<uint32_t>(n))
      return absl::InvalidArgumentError(absl::StrCat("started slot ", st.slot, " >= n_slots ", n));
    if (st.tokens.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("request ", st.request_id, " started with no tokens"));
    started[st.slot] = true;
  }
  std::vector<bool> seen(n, false);
  for (const SlotWork& w : step.work) {
    if (w.slot >= static_cast<uint32_t>(n))
      return absl::InvalidArgumentError(absl::StrCat("work slot ", w.slot, " >= n_slots ", n));
    if (seen[w.slot])
      return absl::InvalidArgumentError(absl::StrCat("slot ", w.slot, " twice in one step"));
    seen[w.slot] = true;
    if (w.follows && started[w.slot])
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", w.slot, " started and continued from its pending token at once"));
    const bool active = started[w.slot] || slots_[w.slot].active;
    if (!active) return absl::InvalidArgumentError(absl::StrCat("work for idle slot ", w.slot));
    // Known length after this step's starts (a start replaces the slot's tokens).
    size_t n_known = slots_[w.slot].known.size();
    if (started[w.slot])
      for (const SequenceStart& st : step.started)
        if (st.slot == w.slot) n_known = st.tokens.size();
    if (w.n_tokens == 0 || uint64_t{w.pos0} + w.n_tokens > n_known)
      return absl::InvalidArgumentError(absl::StrCat("slot ", w.slot, " work [", w.pos0, ", ",
                                                     w.pos0 + w.n_tokens, ") outside its ",
                                                     n_known, " known tokens"));
    if (w.sample && uint64_t{w.pos0} + w.n_tokens != n_known)
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", w.slot, " asks to sample before the end of its known tokens"));
  }
  return absl::OkStatus();
}

StepResult StepExecutor::Run(const Step& step) {
  const auto follows = [](const SlotWork& w) { return w.follows; };
  if (std::none_of(step.work.begin(), step.work.end(), follows)) return RunResolved(step);
  // Sent ahead with MTP: the scheduler did not know how many tokens the previous answer held;
  // the slot does. (Steps sent ahead start nothing; an unknown or idle slot stays as named, for
  // Validate to refuse.)
  resolved_ = step;
  for (SlotWork& w : resolved_.work) {
    if (!w.follows || w.slot >= slots_.size() || slots_[w.slot].known.empty()) continue;
    w.pos0 = static_cast<uint32_t>(slots_[w.slot].known.size() - 1);
    w.n_tokens = 1;
    w.sample = true;
  }
  return RunResolved(resolved_);
}

StepResult StepExecutor::RunResolved(const Step& step) {
  verify_tokens_.clear();
  step_stats_ = {};
  StepResult result;
  result.step_id = step.step_id;
  if (absl::Status s = Validate(step); !s.ok()) {
    result.error = std::string(s.message());
    return result;
  }
  // Prefix cache: finished sequences are saved before their slots are released; the checkpoints
  // this step restores are pinned (a save never evicts them).
  const double tc0 = SteadySeconds();
  pinned_.clear();
  missed_.clear();
  tried_.clear();
  resumed_.clear();
  for (const SequenceStart& st : step.started)
    if (st.resume_checkpoint != 0) pinned_.push_back(st.resume_checkpoint);
  for (const CheckpointSave& c : step.saves) {
    SaveCheckpoint(static_cast<int>(c.slot), c.id, static_cast<int32_t>(c.n_past), pinned_,
                   &result);
    tried_.push_back(c.id);
  }
  // json_object: the token table is loaded before anything changes, so a failure leaves every
  // slot as it was.
  for (const SequenceStart& st : step.started) {
    if (!st.sampling.json_object || json_vocab_) continue;
    absl::StatusOr<std::shared_ptr<sampling::JsonVocab>> v =
        json_loader_ ? json_loader_()
                     : absl::FailedPreconditionError("this worker has no JSON token table");
    if (!v.ok()) {
      result.error = absl::StrCat("request ", st.request_id, " (json_object): ", v.status().message());
      return result;
    }
    json_vocab_ = std::move(*v);
  }
  // Releases first: a slot freed and re-bound in the same step is reset exactly once here.
  for (uint32_t s : step.released) {
    backend_->ResetSlot(static_cast<int>(s));
    slots_[s] = SlotState{};
  }
  for (const SequenceStart& st : step.started) {
    SlotState& slot = slots_[st.slot];
    backend_->ResetSlot(static_cast<int>(st.slot));
    slot = SlotState{};
    if (st.resume_checkpoint != 0) {
      // Validated above. When the load fails anyway (this step's save of it failed, no free
      // pages, a device error) the slot stays empty and the work below computes the prefix
      // too: slower, never wrong.
      if (store_->Length(st.resume_checkpoint) != static_cast<int32_t>(st.resume_len) ||
          !store_->Restore(st.resume_checkpoint, static_cast<int>(st.slot)).ok()) {
        backend_->ResetSlot(static_cast<int>(st.slot));
        missed_.push_back(st.slot);
      }
      resumed_.push_back(st.slot);
    }
    slot.active = true;
    slot.request_id = st.request_id;
    slot.known.assign(st.tokens.begin(), st.tokens.end());
    // The public API's `logprobs = n` asks for the chosen token's logprob plus the top n.
    slot.want_logprob = st.sampling.n_logprobs > 0;
    // A replay goes on with the stream it had: the sampler's uniforms are keyed by position
    // (sampling::UniformAt), with MTP too (worker/spec/speculative_rule.h).
    slot.sampler.emplace(Seeded(st.sampling));
    slot.n_prompt = static_cast<int>(st.tokens.size() - std::min<size_t>(st.n_generated, st.tokens.size()));
    slot.max_new = static_cast<int>(st.max_new_tokens);
    // Under TP every rank accepts and drafts for itself (Run, below), so a sampled sequence must
    // draw the same uniforms on every rank: one without a seed (each rank would draw its own)
    // is not speculated. The scheduler gives every request a seed.
    const bool same_draws = group_ == nullptr || st.sampling.temperature <= 0.0f ||
                            st.sampling.seed != 0;
    slot.mtp = drafter_.has_value() && !slot.want_logprob && st.max_new_tokens > 0 &&
               st.sampling.mtp_drafts != 0 && same_draws;
    slot.mtp_cap = std::max(0, st.sampling.mtp_drafts);
    if (st.sampling.json_object) {
      slot.mtp = false;  // drafts would need masks at every position
      slot.json.emplace(json_vocab_);
      // A replay: the generated tokens came through the same masks, so they are taken again.
      for (size_t i = static_cast<size_t>(slot.n_prompt); i < slot.known.size(); ++i)
        if (!slot.json->Accept(slot.known[i]).ok()) break;
    }
  }
  if (group_ && (!tried_.empty() || !resumed_.empty()) &&
      !AgreeWithGroup(tried_, resumed_, &result))
    return result;
  result.checkpoint_seconds = SteadySeconds() - tc0;
  if (step.work.empty()) return result;
  const int n_vocab = backend_->config().n_vocab;
  const int n_work = static_cast<int>(step.work.size());

  // MTP: which sampled slots verify their drafts in this Forward (speculative SeqSteps, every row
  // through the head). Bounded by the backend's speculative entries and by free KV pages (a
  // verify writes KV for its drafts too; drafts are dropped rather than fail the step).
  int n_mtp_slots = 0;
  bool want_hidden = false;
  if (drafter_)
    for (const SlotState& slot : slots_) n_mtp_slots += slot.active && slot.mtp;
  int spec_seqs_left = drafter_ ? backend_->max_speculative_seqs() : 0;
  const KvPoolStats pool = drafter_ ? backend_->kv_pool() : KvPoolStats{};
  int64_t kv_left = pool.page_size > 0 ? pool.free_tokens() : INT64_MAX;
  batch_.resize(step.work.size());
  out_row_.assign(step.work.size() + 1, 0);
  spec_veto_.assign(step.work.size(), 1.0f);  // 0: this rank can verify the slot's drafts
  bool any_drafts = false;
  for (int i = 0; i < n_work; ++i) {
    const SlotWork& w = step.work[i];
    SlotState& slot = slots_[w.slot];
    const std::vector<int32_t>& known = slot.known;
    SeqStep& q = batch_[i];
    q.slot = static_cast<int>(w.slot);
    // A resume that could not load its checkpoint left the slot short of pos0: compute the
    // missing prefix in the same Forward (only the last row's logits are read either way).
    q.pos0 = static_cast<int32_t>(w.pos0);
    if (std::find(missed_.begin(), missed_.end(), w.slot) != missed_.end())
      q.pos0 = std::min(q.pos0, backend_->SlotLength(q.slot));
    q.tokens.assign(known.begin() + q.pos0, known.begin() + w.pos0 + w.n_tokens);
    q.all_logits = false;
    q.decode_path = w.decode_path;
    q.speculative = false;
    q.chain_drafts = false;
    q.fill_mtp = false;
    q.mtp_next = -1;
    if (slot.mtp && (w.n_tokens > 1 || w.pos0 + w.n_tokens < known.size())) {
      // Prompt chunks (and replays) write the MTP layer's KV as they go, so the drafts attend
      // over the whole sequence; the last row of a sampled chunk waits for its token (DraftAfter).
      q.fill_mtp = true;
      if (w.pos0 + w.n_tokens < known.size()) q.mtp_next = known[w.pos0 + w.n_tokens];
    }
    if (slot.mtp && w.sample) {
      want_hidden = true;
      const int n_drafts = static_cast<int>(slot.drafts.tokens.size());
      const int64_t kv_need = n_drafts + std::max(pool.page_size, 1);
      any_drafts |= n_drafts > 0;
      if (n_drafts > 0 && w.n_tokens == 1 && w.pos0 + 1 == known.size() && spec_seqs_left > 0 &&
          kv_left >= kv_need) {
        spec_veto_[i] = 0.0f;
        --spec_seqs_left;
        kv_left -= kv_need;
      }
    }
  }
  // Under TP the ranks' KV pools may differ in size: a slot verifies its drafts only where every
  // rank has room (the drafts themselves are the same on every rank). One small all-reduce, in
  // steps that carry drafts only.
  if (group_ && any_drafts) {
    if (absl::Status s = group_->AllReduceSum(spec_veto_.data(), spec_veto_.size()); !s.ok()) {
      group_broken_ = true;
      result.error = "tp agreement on speculative verifies: " + s.ToString();
      return result;
    }
  }
  for (int i = 0; i < n_work; ++i) {
    const SlotWork& w = step.work[i];
    SlotState& slot = slots_[w.slot];
    SeqStep& q = batch_[i];
    if (slot.mtp && w.sample) {
      if (spec_veto_[i] == 0.0f) {
        q.tokens.insert(q.tokens.end(), slot.drafts.tokens.begin(), slot.drafts.tokens.end());
        q.all_logits = true;
        q.speculative = true;
        q.decode_path = true;
        q.chain_drafts = slot.drafts.on_device;  // placeholders: the backend holds the drafts
      } else {
        slot.drafts.clear();  // stale or no room: a plain step
      }
    }
    out_row_[i + 1] = out_row_[i] + (q.all_logits ? static_cast<int>(q.tokens.size()) : 1);
  }
  const int n_rows = out_row_[n_work];
  // Device sampling (no TP, backend offers it): rows that want no logprobs are sampled where the
  // logits are, with the uniform the CPU sampler would draw (Sampler::UniformAt of the token's
  // position), so the tokens are the CPU sampler's; logprob rows keep the host path.
  const bool device = group_ == nullptr && backend_->SupportsDeviceSampling();
  StepOptions opts;
  opts.want_hidden = want_hidden;
  chain_after_.clear();
  chain_planned_.assign(step.work.size(), -1);
  if (device) {
    dev_rows_.assign(static_cast<size_t>(n_rows), DeviceSampleRow{});
    for (int i = 0; i < n_work; ++i) {
      const SlotWork& w = step.work[i];
      if (!w.sample) continue;  // kSkip
      SlotState& slot = slots_[w.slot];
      DeviceSampleRow& d = dev_rows_[out_row_[i]];
      if (slot.mtp) {
        // No penalties: every verify row is sampled where the logits are, with the uniform of
        // its position (and the drafts follow on the device: DraftAfter). Otherwise the rows
        // and the drafts read the logits on the host.
        const bool on_device = spec::DraftsOnDevice(slot.sampler->params());
        const bool draws = slot.sampler->params().temperature > 0.0f;
        for (int r = out_row_[i]; r < out_row_[i + 1]; ++r) {
          DeviceSampleRow& v = dev_rows_[r];
          v.mode = on_device ? DeviceSampleRow::Mode::kSample : DeviceSampleRow::Mode::kLogits;
          v.params = &slot.sampler->params();
          v.history = slot.known;  // no penalties: the history does not change the token
          v.uniform = draws ? slot.sampler->UniformAt(slot.known.size() + (r - out_row_[i])) : 0.0;
        }
        // The verify's Forward queues the next chain itself (judged on the device where it can)
        // when the draft count does not depend on how many drafts it keeps (not `auto`).
        if (on_device && batch_[i].speculative && deferred_drafts_ && !mtp_.automatic &&
            backend_->SupportsChainAfterVerify()) {
          const int offered = static_cast<int>(slot.drafts.tokens.size());
          const int n = FixedDraftsAfter(static_cast<int>(w.slot), 0, n_mtp_slots);
          if (n >= 1 && FixedDraftsAfter(static_cast<int>(w.slot), offered, n_mtp_slots) == n) {
            chain_after_.push_back({i, n});
            chain_planned_[i] = n;
          }
        }
        continue;
      }
      if (slot.want_logprob || slot.sampler->params().n_logprobs > 0 || slot.json) {
        d.mode = DeviceSampleRow::Mode::kLogits;  // logprobs / json masks: the host samples
        continue;
      }
      d.mode = DeviceSampleRow::Mode::kSample;
      d.params = &slot.sampler->params();
      d.history = slot.known;
      d.uniform = d.params->temperature > 0.0f ? slot.sampler->UniformAt(slot.known.size()) : 0.0;
    }
    opts.device_sample = dev_rows_;
    opts.chain_after = chain_after_;
  }
  StepOutput& out = out_;
  const bool alone = n_work == 1 && drafter_ && mtp_.automatic && group_ == nullptr;
  int single_offered = -1;  // drafts the step's one sequence verified; -1: a prefill piece
  const double t0 = SteadySeconds();
  absl::Status fs = backend_->Forward(batch_, opts, &out);
  const double t1 = SteadySeconds();
  result.forward_seconds = t1 - t0;
  // A chain the Forward could not queue is made after it (DraftAfter), as without chain_after.
  for (size_t j = 0; fs.ok() && j < chain_after_.size(); ++j)
    if (j >= out.chains_after.size() || !out.chains_after[j])
      chain_planned_[chain_after_[j].seq] = -1;
  // Validation errors are found before any collective, identically on every rank; anything else
  // under TP may have left the ranks at different collectives.
  if (!fs.ok()) {
    // A slot whose verify failed goes on without its deferred drafts (the backend drops them with
    // this step, or with the slot's next one when the step was refused before it ran).
    for (int i = 0; i < n_work; ++i)
      if (batch_[i].chain_drafts) slots_[step.work[i].slot].drafts.clear();
    if (group_ && !absl::IsInvalidArgument(fs) && !absl::IsOutOfRange(fs)) group_broken_ = true;
    result.error = absl::StrCat("backend ", backend_->name(), ": ", fs.ToString());
    return result;
  }
  const bool samples = group_ == nullptr || group_->rank() == 0;
  bool need_logits = samples || n_mtp_slots > 0;  // TP: every rank judges speculated slots
  if (device) {
    need_logits = false;
    for (const DeviceSampleRow& d : dev_rows_) need_logits |= d.mode == DeviceSampleRow::Mode::kLogits;
  }
  if (out.n_rows != n_rows ||
      (need_logits && out.logits.size() != static_cast<size_t>(out.n_rows) * n_vocab) ||
      (device && out.tokens.size() != static_cast<size_t>(out.n_rows)) ||
      (want_hidden && out.hidden.size() !=
                          static_cast<size_t>(out.n_rows) * backend_->config().n_embd)) {
    if (group_) group_broken_ = true;  // the other ranks would wait for our broadcast
    result.error = absl::StrCat("backend returned ", out.n_rows, " logit rows for ", n_rows,
                                " output rows of ", n_work, " sequences");
    return result;
  }
  // Deferred drafts: the values the verify ran with, into the slots' Drafts before they are
  // judged (StepOutput::chain_drafts, in batch order).
  size_t chain_at = 0;
  for (int i = 0; i < n_work; ++i) {
    if (batch_[i].chain_drafts &&
        !spec::MtpDrafter::TakeChainDrafts(out.chain_drafts, &chain_at,
                                           &slots_[step.work[i].slot].drafts)) {
      result.error = absl::StrCat("backend ", backend_->name(), " returned ",
                                  out.chain_drafts.size(), " deferred drafts, fewer than verified");
      return result;
    }
  }
  // Device tokens are checked before any slot changes.
  for (int i = 0; device && i < n_work; ++i) {
    const int32_t t = out.tokens[out_row_[i]];
    if (dev_rows_[out_row_[i]].mode == DeviceSampleRow::Mode::kSample && (t < 0 || t >= n_vocab)) {
      result.error = absl::StrCat("backend ", backend_->name(), " sampled token ", t, " for slot ",
                                  step.work[i].slot, " outside [0, ", n_vocab, ")");
      return result;
    }
  }
  // TP: rank 0 broadcasts what every sampled slot appended, one block per slot: [count, tokens]
  // (count 1, or 1..K+1 after a verify). The other ranks append those tokens; a speculated slot
  // they decided themselves (below), and the blocks must agree.
  const size_t block = 2 + (drafter_ ? static_cast<size_t>(mtp_.drafts) : 0);
  size_t k = 0;  // sampled slots so far (block k of shared_ is the next one's)
  if (group_) {
    shared_.clear();
    for (const SlotWork& w : step.work)
      if (w.sample) shared_.resize(shared_.size() + block, -1);
  }
  auto share = [&](size_t blk, std::span<const int32_t> appended) {
    if (!group_) return;
    int32_t* b = shared_.data() + blk * block;
    b[0] = static_cast<int32_t>(appended.size());
    std::copy(appended.begin(), appended.end(), b + 1);
  };
  const size_t H = static_cast<size_t>(backend_->config().n_embd);
  auto hidden_rows = [&](int row0, int n) {
    return std::span<const float>(out.hidden.data() + row0 * H, n * H);
  };
  for (int i = 0; i < n_work; ++i) {
    const SlotWork& w = step.work[i];
    if (!w.sample) continue;
    const size_t blk = k++;
    SlotState& slot = slots_[w.slot];
    // Under TP a speculated slot is decided on every rank, from the same gathered logits and
    // the same seeded draws, so that every rank runs the same MTP passes (collectives) in the
    // same order; the others only on rank 0.
    if (!samples && !slot.mtp) continue;
    const int row0 = out_row_[i];
    if (batch_[i].speculative) {
      // Verify: keep the drafts the rule accepts plus the model's own token, roll the slot back
      // to its last kept token, and draft again from the rows of the kept positions.
      const size_t before = slot.known.size();
      const int n_out = out_row_[i + 1] - row0;
      const int offered = static_cast<int>(slot.drafts.tokens.size());
      // Acceptance statistics (metrics) on rank 0 only: every rank of a group judges the same.
      spec::SpecStats* stats = samples ? &step_stats_ : nullptr;
      const int kept =
          device && dev_rows_[row0].mode == DeviceSampleRow::Mode::kSample
              ? spec::MtpDrafter::AcceptTokens(
                    std::span<const int32_t>(out.tokens).subspan(row0, n_out), slot.drafts,
                    &slot.known, stats)
              : drafter_->Accept(
                    *slot.sampler,
                    std::span<const float>(out.logits.data() + static_cast<size_t>(row0) * n_vocab,
                                           static_cast<size_t>(n_out) * n_vocab),
                    slot.drafts, &slot.known, stats);
      // The next drafts first, then the rollback's state copies (they read no recurrent state,
      // and the device starts the chain without waiting for the host to issue the copies:
      // worker/spec/README.md).
      slot.policy.Record(offered, kept);
      single_offered = offered;
      if (chain_planned_[i] >= 0) {  // the Forward queued the chain (StepOptions::chain_after)
        spec::MtpDrafter::ChainQueued(chain_planned_[i], &slot.drafts);
        ++chains_after_verify_;
      } else {
        DraftAfter(static_cast<int>(w.slot), batch_[i].pos0, row0, hidden_rows(row0, kept + 1),
                   kept + 1, n_mtp_slots, alone);
      }
      if (absl::Status cs = backend_->CommitSpeculative(static_cast<int>(w.slot), kept + 1);
          !cs.ok()) {
        result.tokens.clear();
        result.error = absl::StrCat("backend ", backend_->name(), ": ", cs.ToString());
        return result;
      }
      const std::span<const int32_t> appended =
          std::span<const int32_t>(slot.known).subspan(before);
      share(blk, appended);
      if (samples)
        for (int32_t t : appended) result.tokens.push_back(SampledToken{w.slot, t, std::nullopt});
      if (samples) {
        verify_tokens_.push_back(kept + 1);
        result.drafts_offered.push_back(static_cast<uint32_t>(offered));
      }
      continue;
    }
    sampling::SampleResult r;
    if (device && dev_rows_[row0].mode == DeviceSampleRow::Mode::kSample) {
      r.token = out.tokens[row0];  // range-checked above
    } else {
      std::span<const float> row(out.logits.data() + static_cast<size_t>(row0) * n_vocab,
                                 static_cast<size_t>(n_vocab));  // [n_vocab]
      if (slot.json) {  // disallowed tokens -> -inf (logprobs are then the masked ones)
        masked_.assign(row.begin(), row.end());
        slot.json->Mask(masked_);
        row = masked_;
      }
      r = slot.sampler->Sample(row, slot.known);
      if (slot.json) (void)slot.json->Accept(r.token);  // allowed: it was sampled under the mask
    }
    slot.known.push_back(r.token);
    if (batch_[i].tokens.size() == 1) single_offered = 0;  // a plain decode, not a prefill piece
    if (slot.mtp)
      DraftAfter(static_cast<int>(w.slot), static_cast<int32_t>(w.pos0 + w.n_tokens - 1), row0,
                 hidden_rows(row0, 1), 1, n_mtp_slots, alone);
    share(blk, std::span<const int32_t>(&r.token, 1));
    if (!samples) continue;
    if (drafter_) result.drafts_offered.push_back(0);  // no verify: no draft offered
    SampledToken& t = result.tokens.emplace_back();
    t.slot = w.slot;
    t.token = r.token;
    if (slot.want_logprob) {
      TokenLogprob& lp = t.logprob.emplace();
      lp.token_id = r.token;
      lp.logprob = r.logprob;
      lp.top.reserve(r.top_logprobs.size());
      for (const auto& [id, l] : r.top_logprobs) lp.top.push_back(TopLogprob{id, l});
    }
  }
  if (group_ && !shared_.empty()) {
    if (!samples) mine_ = shared_;  // what this rank decided, to compare with rank 0's
    absl::Status bs = group_->Broadcast(shared_.data(), shared_.size() * sizeof(int32_t), 0);
    if (!bs.ok()) {
      group_broken_ = true;
      result.tokens.clear();
      result.error = "tp broadcast of the sampled tokens: " + bs.ToString();
      return result;
    }
    if (!samples) {
      k = 0;
      for (const SlotWork& w : step.work) {
        if (!w.sample) continue;
        const int32_t* b = shared_.data() + k * block;
        if (mine_[k * block] >= 0) {
          // Decided here too (a speculated slot): a rank that kept other tokens holds another
          // state and ran other MTP passes, so the group cannot go on.
          if (!std::equal(b, b + block, mine_.data() + k * block)) {
            group_broken_ = true;
            result.error = absl::StrCat("tp rank ", group_->rank(), " kept other tokens than ",
                                        "rank 0 for slot ", w.slot, " (speculative step)");
            return result;
          }
        } else {
          slots_[w.slot].known.push_back(b[1]);
        }
        ++k;
      }
    }
  }
  if (step_stats_.steps > 0) mtp_stats_.Add(step_stats_);
  result.sample_seconds = SteadySeconds() - t1;
  if (alone && single_offered >= 0 && slots_[step.work[0].slot].mtp)
    draft_cost_.Record(single_offered,
                       static_cast<int>(slots_[step.work[0].slot].drafts.tokens.size()),
                       result.forward_seconds + result.sample_seconds);
  // Prefix cache: checkpoints after the work (a prompt's end, a shared prefix, a chunk boundary).
  const double tc1 = SteadySeconds();
  tried_.clear();
  for (const SlotWork& w : step.work) {
    if (w.checkpoint == 0) continue;
    SaveCheckpoint(static_cast<int>(w.slot), w.checkpoint,
                   static_cast<int32_t>(w.pos0 + w.n_tokens), pinned_, &result);
    tried_.push_back(w.checkpoint);
  }
  if (group_ && !tried_.empty() && !AgreeWithGroup(tried_, {}, &result)) {
    result.tokens.clear();
    return result;
  }
  if (!tried_.empty()) result.checkpoint_seconds += SteadySeconds() - tc1;
  return result;
}

}  // namespace ds::worker
