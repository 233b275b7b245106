#include "gateway/status_map.h"

#include <cctype>
#include <string>

#include "absl/strings/str_cat.h"

namespace ds::gw {

absl::Status FromInternal(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  // gRPC and absl share code numbers (both follow google.rpc.Code).
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::Status WithPublicRequestId(const absl::Status& s, uint64_t internal_id,
                                 const std::string& public_id) {
  if (s.ok()) return s;
  const std::string internal = absl::StrCat("request ", internal_id);
  std::string msg(s.message());
  for (size_t at = msg.find(internal); at != std::string::npos; at = msg.find(internal, at)) {
    const size_t end = at + internal.size();
    if (end < msg.size() && std::isdigit(static_cast<unsigned char>(msg[end]))) {
      at = end;  // a longer number that starts with the same digits
      continue;
    }
    msg.replace(at, internal.size(), "request " + public_id);
    at += public_id.size() + 8;
  }
  return absl::Status(s.code(), msg);
}

grpc::Status ToPublicStatus(const absl::Status& s) {
  using C = grpc::StatusCode;
  const std::string msg(s.message());
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return grpc::Status::OK;
    case absl::StatusCode::kInvalidArgument:
      return grpc::Status(C::INVALID_ARGUMENT, msg);
    case absl::StatusCode::kOutOfRange:
      return grpc::Status(C::OUT_OF_RANGE, msg);
    case absl::StatusCode::kResourceExhausted:
      return grpc::Status(C::RESOURCE_EXHAUSTED, msg);
    case absl::StatusCode::kUnavailable:
      return grpc::Status(C::UNAVAILABLE, msg);
    case absl::StatusCode::kDeadlineExceeded:
      return grpc::Status(C::DEADLINE_EXCEEDED, msg);
    case absl::StatusCode::kCancelled:
      return grpc::Status(C::CANCELLED, msg);
    case absl::StatusCode::kUnauthenticated:
      return grpc::Status(C::UNAUTHENTICATED, msg);
    case absl::StatusCode::kPermissionDenied:
      return grpc::Status(C::PERMISSION_DENIED, msg);
    case absl::StatusCode::kFailedPrecondition:
      // e.g. "model has no vocabulary": the request cannot be served as sent.
      return grpc::Status(C::FAILED_PRECONDITION, msg);
    case absl::StatusCode::kNotFound:
      return grpc::Status(C::NOT_FOUND, msg);
    case absl::StatusCode::kAborted:
      // The scheduler aborted the request (e.g. a worker failed mid-step): retryable.
      return grpc::Status(C::UNAVAILABLE, msg);
    case absl::StatusCode::kUnimplemented:
      // Gateway and scheduler from different builds: an operator problem, not the client's.
      return grpc::Status(C::INTERNAL, absl::StrCat("internal protocol mismatch: ", msg));
    default:
      // kUnknown / kInternal / kDataLoss / kAlreadyExists: details are for the logs; the message
      // still says what failed.
      return grpc::Status(C::INTERNAL, absl::StrCat("internal error: ", msg));
  }
}

}  // namespace ds::gw
