// Requests that do not parse. grpc++ deserializes a request before any handler runs; when that
// fails (a proto3 string field that is not valid UTF-8, or bytes that are no message at all) it
// answers INTERNAL with an empty message and the handler never sees the call. This server
// interceptor notices the failed parse (POST_RECV_MESSAGE without a message), turns the status
// into INVALID_ARGUMENT naming the field (taken from libprotobuf's log line on the same thread,
// common/log/protobuf_log.h) and logs the request's one `request_finished` line.
#pragma once
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>
#include <vector>

namespace ds::metrics {
class GatewayMetrics;
}

namespace ds::gw {

// "deltaserve.v1.ChatMessage.content" -> "chat.messages[].content" (the public field path);
// other names lose the package and message: "deltaserve.v1.GenerateRequest.text" -> "text".
std::string PublicFieldPath(const std::string& full_name);

// The INVALID_ARGUMENT message for a request of `method` that failed to parse; `utf8_field` is the
// full field name from libprotobuf ("" when the bytes were not a message at all).
std::string MalformedRequestMessage(const std::string& method, const std::string& utf8_field);

// Interceptor creators for a ServerBuilder (experimental().SetInterceptorCreators). `metrics` (may
// be null) counts malformed Generate calls as invalid_argument requests.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
MalformedRequestInterceptors(metrics::GatewayMetrics* metrics);

}  // namespace ds::gw
