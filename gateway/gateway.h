// `deltaserve gateway`: the public gRPC front end (gateway/README.md has the threading diagram).
#pragma once
#include <memory>
#include <string>

#include "common/util/status.h"

namespace ds::gw {

struct GatewayOptions {
  std::string listen = "127.0.0.1:50051";        // Generation + health
  std::string admin_listen = "127.0.0.1:50052";  // Admin + health
  std::string scheduler = "127.0.0.1:50061";
  std::string model;           // GGUF: tokenizer + vocabulary size
  int max_inflight = 64;       // admission permits
  std::string api_key_file;    // empty: public listener open
  std::string admin_key_file;  // empty: admin listener open
  std::string port_file;       // written "<public port> <admin port>\n" once listening
  int health_interval_ms = 500;
};

absl::StatusOr<GatewayOptions> ParseGatewayFlags(int argc, char** argv);

class Gateway {
 public:
  static absl::StatusOr<std::unique_ptr<Gateway>> Start(const GatewayOptions& opts);
  ~Gateway();
  int port() const;
  int admin_port() const;
  bool serving() const;
  void Shutdown();

 private:
  Gateway();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Flags -> Gateway -> serve until SIGINT/SIGTERM. Exit code 0 after a signal, else 1/2.
int RunGatewayMain(int argc, char** argv);

}  // namespace ds::gw
