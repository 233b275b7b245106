#include "gateway/client.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace ds::gw {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

const char* HealthName(Health h) {
  switch (h) {
    case Health::kServing:
      return "SERVING";
    case Health::kNotServing:
      return "NOT_SERVING";
    case Health::kUnreachable:
      return "UNREACHABLE";
    default:
      return "UNKNOWN";
  }
}

Health CheckHealth(grpc::Channel* channel, std::chrono::milliseconds timeout) {
  auto stub = grpc::health::v1::Health::NewStub(
      std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) return Health::kUnreachable;
  switch (resp.status()) {
    case grpc::health::v1::HealthCheckResponse::SERVING:
      return Health::kServing;
    case grpc::health::v1::HealthCheckResponse::NOT_SERVING:
      return Health::kNotServing;
    default:
      return Health::kUnknown;
  }
}

absl::Status WaitServing(grpc::Channel* channel, std::chrono::milliseconds timeout,
                         const std::function<bool()>& keep_going) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  Health h = Health::kUnknown;
  while (std::chrono::steady_clock::now() < end) {
    h = CheckHealth(channel, std::chrono::milliseconds(500));
    if (h == Health::kServing) return absl::OkStatus();
    if (keep_going && !keep_going()) return absl::AbortedError("gave up waiting for SERVING");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("not SERVING after ", timeout.count(), " ms (last: ", HealthName(h), ")"));
}

}  // namespace ds::gw
