#include "gateway/malformed_request.h"

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/log/protobuf_log.h"
#include "common/metrics/gateway_metrics.h"

namespace ds::gw {
namespace {

using grpc::experimental::InterceptionHookPoints;

class MalformedRequestInterceptor final : public grpc::experimental::Interceptor {
 public:
  MalformedRequestInterceptor(grpc::experimental::ServerRpcInfo* info,
                              metrics::GatewayMetrics* metrics)
      : info_(info), metrics_(metrics) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    // Same thread as the failed Deserialize (grpc++ sync server), so libprotobuf's note of the
    // field is still there.
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        m->GetRecvMessage() == nullptr) {
      malformed_ = true;
      utf8_field_ = log::TakeInvalidUtf8Field();
    }
    if (malformed_ && m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        m->GetSendStatus().error_code() == grpc::StatusCode::INTERNAL) {
      const std::string method = info_->method() ? info_->method() : "";
      const grpc::Status s(grpc::StatusCode::INVALID_ARGUMENT,
                           MalformedRequestMessage(method, utf8_field_));
      m->ModifySendStatus(s);
      const bool generate = method == "/deltaserve.v1.Generation/Generate";
      if (generate && metrics_) metrics_->OnRequestFinished(metrics::Outcome::kInvalidArgument, 0);
      DS_LOG(WARNING, "request_finished",
             {{"request_id", "-"},
              {"method", method},
              {"outcome", metrics::OutcomeName(metrics::Outcome::kInvalidArgument)},
              {"code", static_cast<int>(s.error_code())},
              {"error", s.error_message()},
              {"peer", info_->server_context()->peer()}});
    }
    m->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* info_;
  metrics::GatewayMetrics* metrics_;
  bool malformed_ = false;
  std::string utf8_field_;
};

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(metrics::GatewayMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MalformedRequestInterceptor(info, metrics_);
  }

 private:
  metrics::GatewayMetrics* metrics_;
};

}  // namespace

std::string PublicFieldPath(const std::string& full_name) {
  const size_t field_dot = full_name.rfind('.');
  if (field_dot == std::string::npos) return full_name;
  const std::string field = full_name.substr(field_dot + 1);
  const std::string message = full_name.substr(0, field_dot);
  if (message == "deltaserve.v1.ChatMessage") return "chat.messages[]." + field;
  return field;
}

std::string MalformedRequestMessage(const std::string& method, const std::string& utf8_field) {
  if (!utf8_field.empty())
    return absl::StrCat(PublicFieldPath(utf8_field), " is not valid UTF-8 (", utf8_field,
                        ": string fields must be UTF-8; send token_ids for raw ids)");
  return absl::StrCat("the request is not a valid protobuf message for ", method,
                      " (it could not be parsed)");
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
MalformedRequestInterceptors(metrics::GatewayMetrics* metrics) {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> v;
  v.push_back(std::make_unique<Factory>(metrics));
  return v;
}

}  // namespace ds::gw
