// `deltaserve gateway`: the public gRPC front end (gateway/README.md has the threading diagram).
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "common/util/status.h"

namespace ds::sd {
class Watchdog;
}

namespace ds::gw {

struct GatewayOptions {
  std::string listen = "127.0.0.1:50051";        // Generation + health
  std::string admin_listen = "127.0.0.1:50052";  // Admin + health
  std::string scheduler = "127.0.0.1:50061";
  // A scheduler beyond loopback (docs/tp.md "Multi-host"): token file whose first token is sent
  // on every internal call, TLS CA to verify it (empty: plaintext) and a certificate name
  // override.
  std::string scheduler_key_file, scheduler_ca, scheduler_tls_name;
  std::string model;           // GGUF: tokenizer + vocabulary size
  int max_inflight = 64;       // admission permits
  std::string api_key_file;    // empty: public listener open
  std::string admin_key_file;  // empty: admin listener open
  // Written "<public port> <admin port> <metrics port> <http port>\n" once listening (0: off).
  std::string port_file;
  int health_interval_ms = 500;
  // TLS of the public listener (PEM files; both or neither) and optional client CA (mutual TLS).
  std::string tls_cert, tls_key, tls_client_ca;
  // Graceful stop: how long in-flight requests may take to finish after SIGTERM.
  double drain_timeout_s = 30;
  std::string metrics_listen;  // Prometheus /metrics; empty: not served
  // OpenAI-compatible HTTP API (gateway/http/http_server.h); empty: not served. Shares the
  // public listener's keys, TLS files, admission and metrics.
  std::string http_listen;
};

absl::StatusOr<GatewayOptions> ParseGatewayFlags(int argc, char** argv);

class Gateway {
 public:
  static absl::StatusOr<std::unique_ptr<Gateway>> Start(const GatewayOptions& opts);
  ~Gateway();
  int port() const;
  int admin_port() const;
  bool serving() const;
  int metrics_port() const;  // 0 when metrics are not served
  int http_port() const;     // 0 when the HTTP API is not served
  // Graceful stop, first half: health NOT_SERVING, new calls refused with UNAVAILABLE; waits up to
  // `timeout` for in-flight calls to finish. Returns how many were still running.
  int Drain(std::chrono::milliseconds timeout);
  void Shutdown();
  // Feeds `wd` from the health poller (a hung poller stops the systemd watchdog pings).
  void SetWatchdog(sd::Watchdog* wd);

 private:
  Gateway();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Flags (and --config files) -> Gateway -> READY=1 -> serve until SIGINT/SIGTERM -> drain ->
// exit 0; 1 when the gateway cannot start, 2 for bad flags / config.
int RunGatewayMain(int argc, char** argv);

}  // namespace ds::gw
