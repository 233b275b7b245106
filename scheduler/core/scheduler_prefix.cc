// Scheduler (scheduler.h): the prefix cache's side of the core (issue #17; the tree is
// scheduler/core/prefix_tree.h, the design docs/prefix_cache.md): which prompts share a prefix,
// where a sequence's prefill pieces end so the worker can checkpoint them, where an admission
// resumes, and what the worker reported saved, evicted or failed.
#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "scheduler/core/scheduler.h"

namespace ds::sched {

namespace {

int32_t CommonPrefix(std::span<const int32_t> a, std::span<const int32_t> b, int32_t limit) {
  const int32_t n = std::min<int32_t>({static_cast<int32_t>(a.size()),
                                       static_cast<int32_t>(b.size()), limit});
  int32_t k = 0;
  while (k < n && a[k] == b[k]) ++k;
  return k;
}

}  // namespace

void Scheduler::SetPrefixCache(const PrefixCacheConfig& config) {
  config_.prefix_cache = config;
  prefix_stats_.budget_bytes = config.enabled ? config.budget_bytes : 0;
  if (config.enabled) return;
  // Off: the worker's store is gone (or never was); nothing may name a checkpoint again.
  tree_.Clear();
  saves_.clear();
  for (auto& [id, seq] : seqs_) seq->cuts.clear();
}

int32_t Scheduler::CachedPrefix(std::span<const int32_t> tokens) const {
  if (!PrefixOn() || tokens.size() < 2) return 0;
  const PrefixCheckpoint* c = tree_.Longest(tokens, static_cast<int32_t>(tokens.size()) - 1,
                                            PrefixCheckpoint::State::kReady);
  return c ? c->length : 0;
}

void Scheduler::AddCut(Seq& s, int32_t pos) {
  for (const auto& [p, id] : s.cuts)
    if (p == pos) return;
  const uint64_t id = tree_.Plan(std::span<const int32_t>(s.tokens), pos, s.req.id, ++tick_);
  if (id == 0) return;  // that position has a checkpoint already (saved, or planned by another)
  s.cuts.emplace_back(pos, id);
  std::sort(s.cuts.begin(), s.cuts.end());
}

void Scheduler::NotePrefix(Seq& s) {
  const std::span<const int32_t> prompt(s.tokens.data(), static_cast<size_t>(s.n_prompt));
  // The longest prefix shared with any prompt seen before: where a checkpoint serves both.
  s.shared = tree_.LongestSeen(prompt);
  tree_.Insert(prompt, ++tick_);
  const int32_t min_tokens = config_.prefix_cache.min_tokens;
  if (s.shared < min_tokens) return;
  // Requests already running whose prefill has not passed the shared prefix save a checkpoint
  // where it ends (so this one, and the ones after it, resume there); queued ones learn it for
  // their admission.
  for (auto& [id, seq] : seqs_) {
    Seq& o = *seq;
    if (&o == &s || o.zombie || o.stale || o.pending != Pending::kNone) continue;
    const int32_t lcp = CommonPrefix(prompt, std::span<const int32_t>(o.tokens),
                                     std::min(s.shared, o.n_prompt - 1));
    if (lcp < min_tokens) continue;
    if (o.slot < 0) {
      o.shared = std::max(o.shared, lcp);
    } else if (lcp > (o.plans > 0 ? o.planned_end : o.computed)) {
      AddCut(o, lcp);
    }
  }
}

const PrefixCheckpoint* Scheduler::ResumePoint(const Seq& s, const StepPlan& plan,
                                               bool* wait) const {
  *wait = false;
  if (!PrefixOn()) return nullptr;
  // At least one token is computed (its logits give the first sampled token); a replay resumes
  // within its prompt only (its generated tokens take the decode path).
  const int32_t limit =
      std::min<int32_t>(s.n_prompt, static_cast<int32_t>(s.tokens.size()) - 1);
  if (limit < config_.prefix_cache.min_tokens) return nullptr;
  const std::vector<const PrefixCheckpoint*> path =
      tree_.OnPath(std::span<const int32_t>(s.tokens), limit);
  auto saved_by_this_plan = [&](uint64_t id) {
    for (const CheckpointSave& c : plan.saves)
      if (c.id == id) return true;
    return false;
  };
  // The longest checkpoint the worker holds, or saves before this plan's starts (a finished
  // chat turn, saved as its slot is released: the next turn arrives right after it).
  const PrefixCheckpoint* best = nullptr;
  for (const PrefixCheckpoint* c : path)
    if (c->state == PrefixCheckpoint::State::kReady || saved_by_this_plan(c->id)) best = c;
  const int32_t have = best ? best->length : 0;
  for (const PrefixCheckpoint* c : path) {
    if (c->state == PrefixCheckpoint::State::kReady || saved_by_this_plan(c->id)) continue;
    if (c->length < have + config_.prefix_cache.wait_gain) continue;
    auto it = seqs_.find(c->producer);
    if (it != seqs_.end() && it->second->slot >= 0 && !it->second->zombie) *wait = true;
  }
  return best;
}

void Scheduler::PlanCuts(Seq& s) {
  const PrefixCacheConfig& pc = config_.prefix_cache;
  const int32_t last = s.n_prompt - 1;  // a repeated prompt resumes here and computes one token
  auto want = [&](int32_t pos) {
    if (pos >= pc.min_tokens && pos > s.computed && pos <= last) AddCut(s, pos);
  };
  want(last);
  want(std::min(s.shared, last));
  for (const int32_t p : s.req.checkpoint_hints) want(p);
  if (pc.interval > 0)
    for (int32_t p = pc.interval; p < last; p += pc.interval) want(p);
}

void Scheduler::DropCuts(Seq& s) {
  for (const auto& [pos, id] : s.cuts) tree_.Remove(id);
  s.cuts.clear();
}

void Scheduler::SaveOnRelease(Seq& s) {
  if (!PrefixOn() || s.slot < 0 || s.computed < config_.prefix_cache.min_tokens) return;
  const uint64_t id =
      tree_.Plan(std::span<const int32_t>(s.tokens), s.computed, s.req.id, ++tick_);
  if (id == 0) return;
  tree_.MarkSaving(id);
  saves_.push_back(CheckpointSave{s.slot, id, s.computed});
}

void Scheduler::ApplyCheckpoints(const StepPlan& plan, const StepResults& results) {
  for (const auto& [id, bytes] : results.checkpoints_saved) {
    if (!tree_.Find(id)) continue;
    tree_.Confirm(id, bytes);
    ++prefix_stats_.saves;
  }
  for (const uint64_t id : results.checkpoints_evicted) {
    tree_.Remove(id);
    ++prefix_stats_.evictions;
  }
  for (const uint64_t id : results.checkpoints_failed) {
    tree_.Remove(id);
    ++prefix_stats_.failures;
  }
  // Asked for in this plan and not answered (the step failed before the save): forgotten.
  auto unanswered = [&](uint64_t id) {
    const PrefixCheckpoint* c = id ? tree_.Find(id) : nullptr;
    if (c && c->state != PrefixCheckpoint::State::kReady) {
      tree_.Remove(id);
      ++prefix_stats_.failures;
    }
  };
  for (const PlanEntry& e : plan.entries) unanswered(e.checkpoint);
  for (const CheckpointSave& c : plan.saves) unanswered(c.id);
}

}  // namespace ds::sched
