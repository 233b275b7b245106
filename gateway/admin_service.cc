#include "gateway/admin_service.h"

#include <chrono>

#include "gateway/generation_service.h"
#include "gateway/status_map.h"

namespace ds::gw {
namespace v1 = deltaserve::v1;
namespace {

// Admin calls are short; a scheduler that does not answer in this long is reported UNAVAILABLE.
constexpr auto kAdminTimeout = std::chrono::seconds(10);

template <typename Req, typename Method>
grpc::Status Proxy(grpc::ServerContext* server_ctx, const KeySet& keys, SchedulerClient* scheduler,
                   const Req& req, v1::ClusterStatus* resp, Method call) {
  if (absl::Status s = CheckAuth(*server_ctx, keys); !s.ok()) return ToPublicStatus(s);
  grpc::ClientContext ctx;
  auto deadline = std::chrono::system_clock::now() + kAdminTimeout;
  ctx.set_deadline(std::min(deadline, server_ctx->deadline()));
  absl::Status s = scheduler->Explain(FromInternal(call(&ctx, req, resp)));
  if (s.code() == absl::StatusCode::kDeadlineExceeded && !server_ctx->IsCancelled())
    s = absl::UnavailableError("scheduler did not answer");
  return ToPublicStatus(s);
}

}  // namespace

grpc::Status AdminService::GetClusterStatus(grpc::ServerContext* ctx,
                                            const v1::GetClusterStatusRequest* req,
                                            v1::ClusterStatus* resp) {
  return Proxy(ctx, *keys_, scheduler_, *req, resp, [&](grpc::ClientContext* c, auto& r, auto* o) {
    return scheduler_->stub()->GetClusterStatus(c, r, o);
  });
}

grpc::Status AdminService::SetSlots(grpc::ServerContext* ctx, const v1::SetSlotsRequest* req,
                                    v1::ClusterStatus* resp) {
  return Proxy(ctx, *keys_, scheduler_, *req, resp, [&](grpc::ClientContext* c, auto& r, auto* o) {
    return scheduler_->stub()->SetSlots(c, r, o);
  });
}

grpc::Status AdminService::SetContextPolicy(grpc::ServerContext* ctx,
                                            const v1::SetContextPolicyRequest* req,
                                            v1::ClusterStatus* resp) {
  return Proxy(ctx, *keys_, scheduler_, *req, resp, [&](grpc::ClientContext* c, auto& r, auto* o) {
    return scheduler_->stub()->SetContextPolicy(c, r, o);
  });
}

grpc::Status AdminService::Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req,
                                 v1::ClusterStatus* resp) {
  grpc::Status s = Proxy(ctx, *keys_, scheduler_, *req, resp, [&](grpc::ClientContext* c, auto& r, auto* o) {
    return scheduler_->stub()->Drain(c, r, o);
  });
  // Health follows the drain now, not at the next poll (other gateways of the cluster: at theirs).
  if (s.ok() && health_) health_->PollOnce();
  return s;
}

}  // namespace ds::gw
