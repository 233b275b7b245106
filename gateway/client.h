// Small client helpers shared by `deltaserve serve`, deltactl, the load generator and the tests:
// channel creation and the grpc.health.v1 check of a gateway.
#pragma once
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/util/status.h"

namespace ds::gw {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

enum class Health { kUnknown, kServing, kNotServing, kUnreachable };
const char* HealthName(Health h);

// One grpc.health.v1.Health/Check of service "" (the server as a whole).
Health CheckHealth(grpc::Channel* channel, std::chrono::milliseconds timeout);

// Polls until SERVING or `timeout` (DeadlineExceeded naming the last state seen).
// `keep_going` (optional) aborts the wait early when it returns false (e.g. a child died).
absl::Status WaitServing(grpc::Channel* channel, std::chrono::milliseconds timeout,
                         const std::function<bool()>& keep_going = nullptr);

}  // namespace ds::gw
