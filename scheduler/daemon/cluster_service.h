// gRPC edge of the scheduler daemon: translates cluster.proto messages to plain structs, pushes
// commands to the SchedulerLoop and writes what comes back. Never touches scheduler state.
#pragma once
#include <atomic>

#include <grpcpp/grpcpp.h>

#include "common/auth/bearer.h"
#include "deltaserve/internal/cluster.grpc.pb.h"
#include "scheduler/daemon/scheduler_loop.h"
#include "scheduler/daemon/worker_group.h"

namespace ds::sched {

// The one place internal errors become gRPC codes (absl and gRPC share code numbers).
grpc::Status ToGrpcStatus(const absl::Status& s);

class ClusterService final : public deltaserve::internal::Scheduler::Service {
 public:
  explicit ClusterService(SchedulerLoop* loop)
      : loop_(loop), groups_([loop](Command c) { loop->Push(std::move(c)); }, &kv_) {}
  // Bearer tokens every call must carry (`--internal-key-file`); empty = every caller passes.
  // Set before the server starts.
  void SetTokens(auth::TokenSet tokens) { tokens_ = std::move(tokens); }

  grpc::Status WorkerSession(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<deltaserve::internal::SchedulerMessage,
                               deltaserve::internal::WorkerMessage>* stream) override;
  grpc::Status Submit(grpc::ServerContext* ctx, const deltaserve::internal::SubmitRequest* req,
                      grpc::ServerWriter<deltaserve::internal::RequestEvent>* writer) override;
  grpc::Status Finish(grpc::ServerContext* ctx, const deltaserve::internal::FinishRequest* req,
                      deltaserve::internal::FinishResponse* resp) override;
  grpc::Status GetClusterStatus(grpc::ServerContext* ctx,
                                const deltaserve::v1::GetClusterStatusRequest* req,
                                deltaserve::v1::ClusterStatus* resp) override;
  grpc::Status SetSlots(grpc::ServerContext* ctx, const deltaserve::v1::SetSlotsRequest* req,
                        deltaserve::v1::ClusterStatus* resp) override;
  grpc::Status SetContextPolicy(grpc::ServerContext* ctx,
                                const deltaserve::v1::SetContextPolicyRequest* req,
                                deltaserve::v1::ClusterStatus* resp) override;
  grpc::Status Drain(grpc::ServerContext* ctx, const deltaserve::v1::DrainRequest* req,
                     deltaserve::v1::ClusterStatus* resp) override;
  grpc::Status GetStepStats(grpc::ServerContext* ctx,
                            const deltaserve::internal::StepStatsRequest* req,
                            deltaserve::internal::StepStats* resp) override;
  grpc::Status RendezvousSet(grpc::ServerContext* ctx,
                             const deltaserve::internal::RendezvousSetRequest* req,
                             deltaserve::internal::RendezvousSetResponse* resp) override;
  grpc::Status RendezvousGet(grpc::ServerContext* ctx,
                             const deltaserve::internal::RendezvousGetRequest* req,
                             deltaserve::internal::RendezvousGetResponse* resp) override;

 private:
  grpc::Status Admin(AdminCmd cmd, deltaserve::v1::ClusterStatus* resp,
                     ClusterSnapshot* snap_out = nullptr);

  SchedulerLoop* loop_;
  auth::TokenSet tokens_;  // checked first in every handler
  RendezvousKv kv_;       // tensor-parallel rendezvous (declared before groups_, which uses it)
  WorkerGroups groups_;   // tensor-parallel groups forming or live
  // Ids for requests submitted without one (the gateway normally assigns them).
  std::atomic<uint64_t> next_auto_id_{uint64_t{1} << 62};
};

}  // namespace ds::sched
