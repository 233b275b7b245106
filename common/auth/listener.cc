#include "common/auth/listener.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ds::auth {

void AddExclusiveListeningPort(grpc::ServerBuilder* b, const std::string& address,
                               std::shared_ptr<grpc::ServerCredentials> creds, int* port) {
  b->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  b->AddListeningPort(address, std::move(creds), port);
}

std::string BindProblem(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (address.rfind("unix:", 0) == 0 || colon == std::string::npos) return "";
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535)
    return absl::StrCat("'", address.substr(colon + 1), "' is not a port number");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int e = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
      e != 0)
    return absl::StrCat("cannot resolve '", host, "': ", gai_strerror(e));
  std::string problem;
  for (addrinfo* a = res; a != nullptr && problem.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    // The same options as a gRPC listener with reuse-port off: SO_REUSEADDR only (a port in
    // TIME_WAIT is free; one with a listener is not).
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      problem = errno == EADDRINUSE
                    ? "address already in use (another process is listening there)"
                    : std::string(std::strerror(errno));
    }
    close(fd);
  }
  freeaddrinfo(res);
  return problem;
}

absl::StatusOr<std::unique_ptr<grpc::Server>> BuildAndStartListener(grpc::ServerBuilder* b,
                                                                    const std::string& address,
                                                                    const int* port) {
  std::unique_ptr<grpc::Server> server = b->BuildAndStart();
  if (server && *port != 0) return server;
  if (server) server->Shutdown();
  const std::string why = BindProblem(address);
  return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ",
                                             why.empty() ? "gRPC could not bind it" : why));
}

}  // namespace ds::auth
