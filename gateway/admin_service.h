// deltaserve.v1.Admin on its own listener (and its own keys): a pass-through to the scheduler,
// which owns the cluster state. Errors go through the one public mapping (status_map.h).
#pragma once
#include <grpcpp/grpcpp.h>

#include "deltaserve/v1/deltaserve.grpc.pb.h"
#include "gateway/auth.h"
#include "gateway/health.h"
#include "gateway/scheduler_client.h"

namespace ds::gw {

class AdminService final : public deltaserve::v1::Admin::Service {
 public:
  // `health` (may be null) is re-polled after a Drain so health follows it at once.
  AdminService(SchedulerClient* scheduler, const KeySet* keys, HealthMonitor* health = nullptr)
      : scheduler_(scheduler), keys_(keys), health_(health) {}

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

 private:
  SchedulerClient* scheduler_;
  const KeySet* keys_;
  HealthMonitor* health_;
};

}  // namespace ds::gw
