// The gateway's internal edge: calls to the scheduler daemon (cluster.proto), translated to the
// plain structs of gateway/request.h. A Submit call is made with a ClientContext derived from the
// client's ServerContext (deadline copied, cancellation propagated by gRPC) and is also registered
// with a watchdog that calls TryCancel on it as soon as the client's call is cancelled, so the
// scheduler frees the slot within one step even if propagation were lost.
#pragma once
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/auth/tls.h"
#include "common/util/status.h"
#include "deltaserve/internal/cluster.grpc.pb.h"
#include "gateway/request.h"

namespace ds::gw {

// Calls whose client went away get TryCancel (polled every kPoll; cheap: one atomic read each).
class CancelWatchdog {
 public:
  CancelWatchdog();
  ~CancelWatchdog();
  void Add(grpc::ServerContext* client, grpc::ClientContext* internal);
  void Remove(grpc::ClientContext* internal);

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::unordered_map<grpc::ClientContext*, grpc::ServerContext*> calls_;
  std::thread thread_;
};

// Summary of GetClusterStatus the gateway's own logic uses.
struct ClusterView {
  bool reachable = false;
  bool serving = false;
  bool draining = false;  // Admin Drain: admission closed until resumed
  uint32_t slot_context = 0;  // per-slot cap (0 = unknown)
  uint32_t slots = 0;
};

class SchedulerClient {
 public:
  class SubmitCall {
   public:
    ~SubmitCall();
    // Next event; false when the stream ended (then call Finish()).
    bool Next(InternalEvent* ev);
    absl::Status Finish();
    void Cancel() { ctx_.TryCancel(); }

   private:
    friend class SchedulerClient;
    SubmitCall() = default;
    grpc::ClientContext ctx_;
    std::unique_ptr<grpc::ClientReader<deltaserve::internal::RequestEvent>> reader_;
    deltaserve::internal::RequestEvent msg_;
    CancelWatchdog* watchdog_ = nullptr;
  };

  explicit SchedulerClient(const std::string& address);
  // With credentials for a scheduler beyond loopback (docs/tp.md "Multi-host"): TLS and/or a
  // bearer token sent on every call; errors name the file at fault.
  static absl::StatusOr<std::unique_ptr<SchedulerClient>> Create(
      const std::string& address, const auth::ClientTlsFiles& tls, const std::string& token);

  // `client` may be null (no parent call: loadgen-style internal use, tests).
  std::unique_ptr<SubmitCall> Submit(uint64_t request_id, const PreparedRequest& req,
                                     grpc::ServerContext* client);
  // The gateway matched a stop string: the scheduler finishes the request with `reason`.
  absl::Status Finish(uint64_t request_id, FinishReason reason);

  absl::StatusOr<ClusterView> Poll(std::chrono::milliseconds timeout);

  // A failed internal call as the client should read it: transport failures (the scheduler was
  // killed, refused the connection, reset it) become UNAVAILABLE "scheduler unreachable ..."
  // instead of gRPC's transport text; the scheduler's own errors pass unchanged.
  absl::Status Explain(const absl::Status& s) const;
  const std::string& address() const { return address_; }

  // Admin pass-through (public messages both ways: the gateway adds nothing).
  deltaserve::internal::Scheduler::Stub* stub() { return stub_.get(); }

 private:
  SchedulerClient() = default;
  static grpc::ChannelArguments Args();

  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<deltaserve::internal::Scheduler::Stub> stub_;
  CancelWatchdog watchdog_;
};

}  // namespace ds::gw
