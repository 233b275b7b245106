// The worker's side of a tensor-parallel group (docs/tp.md §6): joining the group's collective
// through the scheduler, and the split weights every rank must agree on.
//
// One `deltaserve worker --tp-rank R --tp-world W --tp-group NAME` process per rank. Each registers
// with the scheduler on its own WorkerSession stream; the scheduler answers every rank with the
// same Configure carrying the group's rendezvous prefix, then the ranks meet:
//   * CPU (Gloo): each rank publishes its TCP address in the scheduler's key-value store
//     (Rendezvous rpcs) under the prefix and connects to every other rank (full mesh);
//   * CUDA (NCCL, only when built with it): rank 0 calls ncclGetUniqueId and publishes the 128
//     bytes under `<prefix>nccl_id`; the others read them and every rank calls ncclCommInitRank;
//   * CUDA over Gloo ("staged-gloo", `--backend cuda --tp-collective gloo`): the Gloo mesh as on
//     CPU, wrapped in a HostStagedCollective that stages device buffers through the host. A
//     testing / fallback path (several ranks on one GPU, or no NCCL);
//   * CUDA, custom (`--tp-collective custom`, and the default for CUDA ranks): the Gloo mesh as
//     above, then CustomAllReduceCollective exchanges CUDA IPC handles over it and reduces /
//     gathers device buffers by reading the peers' memory (one host: NVLink / P2P, or several
//     ranks on one GPU); graph-capturable. With `auto`, a group that cannot use it (ranks on
//     several hosts, no P2P) falls back to NCCL (or staged Gloo without NCCL), every rank alike.
// Nothing but the scheduler's address is needed, so ranks on other hosts join the same way.
#pragma once
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/collective/gloo_collective.h"
#include "common/util/status.h"

namespace ds::worker {

struct TpOptions {
  int rank = 0;
  int world = 1;      // 1 = no tensor parallelism
  std::string group;  // group name, shared by the ranks (default "tp")
  std::string split;  // "" = even, "1,2" / "1:1.5" weights, "mem" = by free memory
  // The address the other ranks reach this one at (docs/tp.md "Multi-host"). Gloo binds and
  // advertises `iface`'s address when set, else `addr` (IP or hostname). NCCL: `iface` becomes
  // NCCL_SOCKET_IFNAME unless the environment sets it (NCCL picks its interface itself).
  std::string iface;
  std::string addr = "127.0.0.1";
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};  // rendezvous and collectives
};

// The local address this host uses to reach `target` (a gRPC target: "host:port", "[v6]:port",
// "ipv4:..." / "dns:///..." forms, "unix:..."): the kernel's route choice (a UDP socket connected
// to the resolved address; nothing is sent). Loopback targets give "127.0.0.1". A worker's Gloo
// address defaults to it: the interface that reaches the scheduler is the cluster's network.
absl::StatusOr<std::string> LocalAddressToward(const std::string& target);

// RendezvousStore over the scheduler's RendezvousSet / RendezvousGet rpcs.
class SchedulerRendezvousStore final : public RendezvousStore {
 public:
  explicit SchedulerRendezvousStore(std::shared_ptr<grpc::Channel> channel);
  ~SchedulerRendezvousStore() override;
  absl::Status Set(const std::string& key, const std::vector<char>& value) override;
  absl::StatusOr<std::vector<char>> Get(const std::string& key,
                                        std::chrono::milliseconds timeout) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TpGroup {
  std::unique_ptr<Collective> collective;
  std::vector<double> split;  // [world] share weights, identical on every rank
};

// The collective a rank builds for `--tp-collective` (auto | gloo | nccl | custom) and its
// backend: "gloo" (CPU backend), "custom", "auto-custom" (custom, falling back when the group
// cannot use it), "nccl" or "staged-gloo" (CUDA backend; auto = auto-custom in CUDA builds).
// Errors for a pair that cannot work (nccl / custom on CPU, a kind this build lacks).
absl::StatusOr<std::string> ResolveTpCollective(const std::string& requested, bool cuda_backend);

// Builds rank `o.rank`'s collective of kind `collective` (ResolveTpCollective) under `prefix`
// (from Configure) and resolves the split. `device` is the CUDA device (nccl, staged-gloo).
absl::StatusOr<TpGroup> JoinTpGroup(const TpOptions& o, const std::string& collective, int device,
                                    const std::string& prefix,
                                    std::shared_ptr<grpc::Channel> scheduler);

}  // namespace ds::worker
