// Tensor-parallel worker groups in the scheduler daemon (docs/tp.md §6).
//
// The W processes of a TP group each hold one WorkerSession stream. `WorkerGroups` collects them
// (Register with tp_group / tp_rank / tp_world) and, once every rank is there, presents the group
// to the loop as ONE worker through a `GroupLink`:
//   * Send fans a message out to every rank (Configure gains the group's rendezvous prefix);
//   * the ranks' WarmupDone / StepResult are merged (the group is ready when every rank warmed
//     up; a step is answered when every rank answered it; tokens come from rank 0);
//   * any rank's end (stream broken, fatal error, protocol error) is the group's end: the loop sees
//     one WorkerGoneCmd and Closes the link, which ends every rank's session.
// So SchedulerLoop does not know about TP. The session reader threads call in here; one mutex.
//
// `RendezvousKv` is the scheduler's key-value store behind the Rendezvous rpcs: the ranks' Gloo
// rendezvous (and NCCL's unique id) goes through it, keyed by the group's prefix.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "scheduler/daemon/scheduler_loop.h"

namespace ds::sched {

class RendezvousKv {
 public:
  void Set(const std::string& key, std::string value);
  // Waits until the key exists or `wait` passes (NotFound).
  absl::StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds wait);
  void ErasePrefix(const std::string& prefix);
  size_t size();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

struct TpJoin {
  std::string group;
  int rank = 0;
  int world = 1;
};

struct GroupState;

// A rank's handle, held by its session reader.
struct GroupMember {
  std::shared_ptr<GroupState> group;
  int rank = 0;
  std::shared_ptr<WorkerLink> link;  // the rank's own stream
};

class WorkerGroups {
 public:
  // `push` delivers commands to the loop.
  WorkerGroups(std::function<void(Command)> push, RendezvousKv* kv)
      : push_(std::move(push)), kv_(kv) {}

  // A rank registered. Refused (the session ends with the status) when the rank is taken, the
  // world disagrees with the group's or the model differs from the other ranks'. The last rank
  // to join announces the group to the loop (WorkerJoinCmd with the group's link).
  absl::StatusOr<GroupMember> Join(const TpJoin& j, const WorkerInfo& info,
                                   std::shared_ptr<WorkerLink> rank_link);
  // Every command a rank's reader produces (WorkerWarmupCmd / WorkerStepCmd / WorkerGoneCmd whose
  // link is the rank's own).
  void FromRank(const GroupMember& m, Command cmd);
  void Heartbeat(const GroupMember& m, double steady_seconds);
  // The rank's session ended (always called last by its reader).
  void Leave(const GroupMember& m, const std::string& why);

 private:
  void GoneLocked(GroupState& g, const std::string& why);

  std::function<void(Command)> push_;
  RendezvousKv* kv_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<GroupState>> forming_or_live_;  // by group name
  std::map<std::string, uint64_t> generation_;                          // by group name
};

}  // namespace ds::sched
