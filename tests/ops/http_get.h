// A minimal HTTP/1.0 GET over a loopback TCP socket for tests that scrape /metrics.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace ds::testing {

// The response body of GET `path` on 127.0.0.1:`port`, or "" on any failure.
inline std::string HttpGet(int port, const std::string& path, int* status = nullptr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[16384];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  if (status) *status = resp.size() > 12 ? std::atoi(resp.c_str() + 9) : 0;
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

}  // namespace ds::testing
