// gRPC listeners that own their port. gRPC sets SO_REUSEPORT on Linux listeners by default, so a
// second process started on the same address binds it too and the kernel splits the connections
// between the two at random (two clusters answering one port). Every deltaserve listener is built
// with port reuse off, and a failed bind is one error naming the address and the reason.
#pragma once
#include <memory>
#include <string>

#include "common/util/status.h"

namespace grpc {
class Server;
class ServerBuilder;
class ServerCredentials;
}  // namespace grpc

namespace ds::auth {

// b.AddListeningPort(address, creds, port) with SO_REUSEPORT disabled for the whole server.
void AddExclusiveListeningPort(grpc::ServerBuilder* b, const std::string& address,
                               std::shared_ptr<grpc::ServerCredentials> creds, int* port);

// b.BuildAndStart(), or an error naming `address` (e.g. "cannot listen on 127.0.0.1:50051:
// address already in use (another process holds it)") when the server did not start or bound
// no port.
absl::StatusOr<std::unique_ptr<grpc::Server>> BuildAndStartListener(grpc::ServerBuilder* b,
                                                                    const std::string& address,
                                                                    const int* port);

// Why `address` ("HOST:PORT", "[V6]:PORT") cannot be bound now, probed with a plain socket:
// "address already in use ...", "cannot assign requested address", ... or "" when it can.
std::string BindProblem(const std::string& address);

}  // namespace ds::auth
