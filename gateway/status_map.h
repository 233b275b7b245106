// The one place where errors become public gRPC codes. Internal failures (absl::Status from the
// gateway's own logic, or the scheduler's gRPC status brought back to absl by FromInternal) are
// mapped here and nowhere else, so the public contract (deltaserve.proto header) holds:
// INVALID_ARGUMENT for bad requests, RESOURCE_EXHAUSTED for overload, UNAVAILABLE when no worker
// can serve (the only code clients should retry), DEADLINE_EXCEEDED / CANCELLED as usual.
#pragma once
#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace ds::gw {

// Internal call status (gateway -> scheduler) as absl. Transport failures of the internal channel
// (scheduler gone, connection refused, reset) come back as UNAVAILABLE.
absl::Status FromInternal(const grpc::Status& s);

// The scheduler's messages say "request <internal id>"; clients know the request by its public id
// (theirs, or "gw-<n>"). Replaces the one by the other in `s`'s message.
absl::Status WithPublicRequestId(const absl::Status& s, uint64_t internal_id,
                                 const std::string& public_id);

// absl (internal) -> public gRPC status.
grpc::Status ToPublicStatus(const absl::Status& s);

}  // namespace ds::gw
