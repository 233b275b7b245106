#include "scheduler/daemon/worker_group.h"

#include <algorithm>
#include <deque>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log/log.h"
#include "deltaserve/internal/cluster.pb.h"

namespace ds::sched {

// ---- RendezvousKv ----

void RendezvousKv::Set(const std::string& key, std::string value) {
  {
    std::lock_guard<std::mutex> l(mu_);
    kv_[key] = std::move(value);
  }
  cv_.notify_all();
}

absl::StatusOr<std::string> RendezvousKv::Get(const std::string& key,
                                              std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, wait, [&] { return kv_.count(key) > 0; }))
    return absl::NotFoundError(absl::StrCat("rendezvous key '", key, "' not set yet"));
  return kv_[key];
}

void RendezvousKv::ErasePrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.rfind(prefix, 0) == 0;)
    it = kv_.erase(it);
}

size_t RendezvousKv::size() {
  std::lock_guard<std::mutex> l(mu_);
  return kv_.size();
}

// ---- the group ----

namespace {

namespace pb = deltaserve::internal;

// What the loop holds of a complete group: one link fanning out to the ranks.
class GroupLink final : public WorkerLink {
 public:
  GroupLink(std::vector<std::shared_ptr<WorkerLink>> ranks, std::string prefix,
            std::function<void()> on_close)
      : ranks_(std::move(ranks)), prefix_(std::move(prefix)), on_close_(std::move(on_close)) {}

  bool Send(const pb::SchedulerMessage& m) override {
    if (m.has_configure()) {
      pb::SchedulerMessage c = m;
      c.mutable_configure()->set_tp_prefix(prefix_);
      return SendAll(c);
    }
    return SendAll(m);
  }
  void Close(const absl::Status& why) override {
    for (auto& r : ranks_) r->Close(why);
    if (on_close_) on_close_();
  }

 private:
  bool SendAll(const pb::SchedulerMessage& m) {
    bool ok = true;
    for (auto& r : ranks_) ok = r->Send(m) && ok;
    return ok;
  }
  std::vector<std::shared_ptr<WorkerLink>> ranks_;
  std::string prefix_;
  std::function<void()> on_close_;
};

}  // namespace

struct GroupState {
  std::string name, prefix;
  int world = 0;
  std::vector<std::shared_ptr<WorkerLink>> ranks;  // [world]; null until the rank joined
  std::vector<WorkerInfo> infos;                   // [world]
  std::vector<double> heartbeat;                   // [world] steady seconds
  std::shared_ptr<GroupLink> link;                 // once complete
  bool dead = false;
  std::vector<std::optional<WarmupInfo>> warm;        // [world] answers to the warmup
  // [world] answers not merged yet, oldest first: with a step sent ahead (the loop's lookahead)
  // one rank may answer step N+1 before another's answer to N has been read here.
  std::vector<std::deque<WorkerStepResult>> step;

  int joined() const {
    return static_cast<int>(std::count_if(ranks.begin(), ranks.end(), [](auto& r) { return r; }));
  }
};

absl::StatusOr<GroupMember> WorkerGroups::Join(const TpJoin& j, const WorkerInfo& info,
                                               std::shared_ptr<WorkerLink> rank_link) {
  if (j.group.empty()) return absl::InvalidArgumentError("register.tp_group is empty");
  if (j.world < 2 || j.rank < 0 || j.rank >= j.world)
    return absl::InvalidArgumentError(
        absl::StrCat("register: tp_rank ", j.rank, " not in a tp_world of ", j.world));
  std::lock_guard<std::mutex> l(mu_);
  std::shared_ptr<GroupState>& slot = forming_or_live_[j.group];
  if (!slot) {
    slot = std::make_shared<GroupState>();
    slot->name = j.group;
    slot->prefix = absl::StrCat("tp/", j.group, "/", ++generation_[j.group], "/");
    slot->world = j.world;
    slot->ranks.resize(j.world);
    slot->infos.resize(j.world);
    slot->heartbeat.resize(j.world, 0);
    slot->warm.resize(j.world);
    slot->step.resize(j.world);
  }
  GroupState& g = *slot;
  if (g.world != j.world)
    return absl::FailedPreconditionError(absl::StrCat("tp group ", j.group, " has tp_world ",
                                                      g.world, ", this rank says ", j.world));
  if (g.ranks[j.rank])
    return absl::AlreadyExistsError(absl::StrCat("tp group ", j.group, " rank ", j.rank,
                                                 " is already registered (", g.infos[j.rank].id,
                                                 ")"));
  for (int r = 0; r < g.world; ++r)
    if (g.ranks[r] && (g.infos[r].model_fingerprint != info.model_fingerprint ||
                       g.infos[r].n_vocab != info.n_vocab))
      return absl::FailedPreconditionError(absl::StrCat(
          "tp group ", j.group, " rank ", j.rank, " serves model ", info.model_fingerprint,
          ", rank ", r, " serves ", g.infos[r].model_fingerprint));
  g.ranks[j.rank] = rank_link;
  g.infos[j.rank] = info;
  g.heartbeat[j.rank] = rank_link->last_heartbeat.load();
  DS_LOG(INFO, "tp_rank_registered", {{"group", g.name}, {"rank", j.rank}, {"world", g.world},
                                      {"worker", info.id}, {"joined", g.joined()}});
  GroupMember m{slot, j.rank, rank_link};
  if (g.joined() < g.world) return m;

  // Complete: one logical worker. Its memory figures: summed weights, the smallest budget times
  // the world (each rank holds 1/world of the state).
  WorkerInfo gi = g.infos[0];
  std::vector<std::string> ids;
  for (const WorkerInfo& w : g.infos) {
    ids.push_back(w.id);
    gi.state_budget_bytes = std::min(gi.state_budget_bytes, w.state_budget_bytes);
  }
  gi.state_budget_bytes *= static_cast<uint64_t>(g.world);
  gi.weights_bytes = 0;
  for (const WorkerInfo& w : g.infos) gi.weights_bytes += w.weights_bytes;
  gi.id = absl::StrCat(g.name, "[", absl::StrJoin(ids, ","), "]");
  gi.device = absl::StrCat(g.infos[0].device, " tp=", g.world);
  std::weak_ptr<GroupState> weak = slot;
  g.link = std::make_shared<GroupLink>(g.ranks, g.prefix, [this, weak] {
    std::lock_guard<std::mutex> l2(mu_);
    if (auto gs = weak.lock()) {
      gs->dead = true;
      auto it = forming_or_live_.find(gs->name);
      if (it != forming_or_live_.end() && it->second == gs) forming_or_live_.erase(it);
      kv_->ErasePrefix(gs->prefix);
    }
  });
  g.link->last_heartbeat.store(*std::min_element(g.heartbeat.begin(), g.heartbeat.end()));
  DS_LOG(INFO, "tp_group_complete", {{"group", g.name}, {"world", g.world}, {"prefix", g.prefix}});
  push_(WorkerJoinCmd{g.link, gi});
  return m;
}

void WorkerGroups::GoneLocked(GroupState& g, const std::string& why) {
  if (g.dead) return;
  g.dead = true;
  auto it = forming_or_live_.find(g.name);
  if (it != forming_or_live_.end() && it->second.get() == &g) forming_or_live_.erase(it);
  kv_->ErasePrefix(g.prefix);
  if (g.link) push_(WorkerGoneCmd{g.link, why});
}

void WorkerGroups::FromRank(const GroupMember& m, Command cmd) {
  std::lock_guard<std::mutex> l(mu_);
  GroupState& g = *m.group;
  if (g.dead) return;
  const std::string who = absl::StrCat("tp group ", g.name, " rank ", m.rank);
  if (auto* gone = std::get_if<WorkerGoneCmd>(&cmd)) {
    if (!g.link) return;  // not announced yet: the reader's Leave frees the rank's place
    return GoneLocked(g, absl::StrCat(who, ": ", gone->why));
  }
  if (!g.link) return GoneLocked(g, who + ": protocol error: message before the group formed");
  if (auto* w = std::get_if<WorkerWarmupCmd>(&cmd)) {
    g.warm[m.rank] = w->info;
    for (const auto& x : g.warm)
      if (!x) return;
    // Lock-step ranks measure the same group step; the slowest figure is the group's.
    WarmupInfo merged = *g.warm[0];
    merged.weights_bytes = merged.kv_bytes = merged.state_bytes = merged.workspace_bytes = 0;
    for (const auto& x : g.warm) {
      merged.decode_tps = std::min(merged.decode_tps, x->decode_tps);
      merged.prefill_tps = std::min(merged.prefill_tps, x->prefill_tps);
      merged.weights_bytes += x->weights_bytes;
      merged.kv_bytes += x->kv_bytes;
      merged.state_bytes += x->state_bytes;
      merged.workspace_bytes += x->workspace_bytes;
      // Every rank holds its heads' KV for the same tokens: the smallest pool bounds the group
      // (admitting within it keeps every rank's pool from running dry, so ranks never diverge).
      if (x->kv_pool_tokens > 0 && (merged.kv_pool_tokens <= 0 || x->kv_pool_tokens < merged.kv_pool_tokens)) {
        merged.kv_pool_tokens = x->kv_pool_tokens;
        merged.kv_page_size = x->kv_page_size;
      }
      // Each rank keeps its shard's checkpoints under the same ids: the smallest budget bounds
      // the group (a rank without a cache turns it off).
      merged.prefix_cache_bytes = std::min(merged.prefix_cache_bytes, x->prefix_cache_bytes);
      merged.mtp_drafts = std::max(merged.mtp_drafts, x->mtp_drafts);
      merged.mtp_auto = merged.mtp_auto || x->mtp_auto;
      merged.follows_work = merged.follows_work && x->follows_work;
      if (x->active_slots > 0 &&
          (merged.active_slots <= 0 || x->active_slots < merged.active_slots))
        merged.active_slots = x->active_slots;
    }
    for (auto& x : g.warm) x.reset();
    push_(WorkerWarmupCmd{g.link, merged});
    return;
  }
  if (auto* s = std::get_if<WorkerStepCmd>(&cmd)) {
    std::deque<WorkerStepResult>& mine = g.step[m.rank];
    // Each rank answers steps in order, and the loop keeps at most two in flight.
    if (!mine.empty() && s->result.step_id <= mine.back().step_id)
      return GoneLocked(g, absl::StrCat(who, ": protocol error: answered step ", s->result.step_id,
                                        " after step ", mine.back().step_id));
    if (mine.size() >= 2)
      return GoneLocked(g, absl::StrCat(who, ": protocol error: more than two unmerged answers"));
    mine.push_back(std::move(s->result));
    // Merge every step all ranks have answered, oldest first.
    while (std::all_of(g.step.begin(), g.step.end(), [](const auto& q) { return !q.empty(); })) {
      const uint64_t id = g.step[0].front().step_id;
      for (int r = 1; r < g.world; ++r)
        if (g.step[r].front().step_id != id)
          return GoneLocked(g, absl::StrCat("tp group ", g.name, ": protocol error: rank 0 answered step ",
                                            id, " where rank ", r, " answered step ",
                                            g.step[r].front().step_id));
      // Rank 0 sampled; the others only ran the forward. The step's time is the slowest rank's.
      WorkerStepResult merged = std::move(g.step[0].front());
      std::vector<std::string> errors;
      if (!merged.error.empty()) errors.push_back("rank 0: " + merged.error);
      for (int r = 1; r < g.world; ++r) {
        const WorkerStepResult& x = g.step[r].front();
        merged.forward_seconds = std::max(merged.forward_seconds, x.forward_seconds);
        merged.handle_seconds = std::max(merged.handle_seconds, x.handle_seconds);
        if (!x.error.empty()) errors.push_back(absl::StrCat("rank ", r, ": ", x.error));
      }
      merged.error = absl::StrJoin(errors, "; ");
      for (auto& q : g.step) q.pop_front();
      push_(WorkerStepCmd{g.link, std::move(merged)});
    }
  }
}

void WorkerGroups::Heartbeat(const GroupMember& m, double steady_seconds) {
  std::lock_guard<std::mutex> l(mu_);
  GroupState& g = *m.group;
  g.heartbeat[m.rank] = steady_seconds;
  if (g.link)
    g.link->last_heartbeat.store(*std::min_element(g.heartbeat.begin(), g.heartbeat.end()));
}

void WorkerGroups::Leave(const GroupMember& m, const std::string& why) {
  std::lock_guard<std::mutex> l(mu_);
  GroupState& g = *m.group;
  if (g.link) return GoneLocked(g, absl::StrCat("tp group ", g.name, " rank ", m.rank, ": ", why));
  // Still forming: free the rank's place; a restarted rank may take it.
  if (g.ranks[m.rank] == m.link) {
    g.ranks[m.rank].reset();
    DS_LOG(WARNING, "tp_rank_left",
           {{"group", g.name}, {"rank", m.rank}, {"reason", why}, {"group_formed", false}});
  }
  if (g.joined() == 0) {
    auto it = forming_or_live_.find(g.name);
    if (it != forming_or_live_.end() && it->second.get() == &g) forming_or_live_.erase(it);
  }
}

}  // namespace ds::sched
