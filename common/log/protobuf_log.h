// libprotobuf's own log lines ("[libprotobuf ERROR ...]" on stderr) routed into the structured
// log. The one a hostile client can trigger at will, "String field 'pkg.Msg.field' contains
// invalid UTF-8 data when parsing", is kept per thread instead (debug level only) so the gRPC edge
// that failed to parse the request can answer INVALID_ARGUMENT naming the field and log one line
// for the request (gateway/malformed_request.h).
#pragma once
#include <string>

namespace ds::log {

// Installs the handler (process-wide; idempotent). Call at start, before threads parse messages.
void RouteProtobufLogs();

// The full name of the string field ("deltaserve.v1.GenerateRequest.text") whose invalid UTF-8
// made the last parse on this thread fail, or "" (then cleared).
std::string TakeInvalidUtf8Field();

}  // namespace ds::log
