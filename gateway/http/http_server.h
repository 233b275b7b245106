// The OpenAI-compatible HTTP listener of the gateway (`--http-listen`): POST /v1/chat/completions,
// POST /v1/completions, GET /v1/models, GET /health. It shares everything with the gRPC listener
// except the wire format: the same admission permits, bearer keys, validation (Prepare), scheduler
// client, health, metrics and request-id space; gateway/README.md shows the request path.
#pragma once
#include <memory>
#include <string>

#include "common/metrics/gateway_metrics.h"
#include "common/util/status.h"
#include "gateway/admission.h"
#include "gateway/auth.h"
#include "gateway/generation_service.h"
#include "gateway/health.h"
#include "gateway/scheduler_client.h"

namespace ds::gw::http {

struct HttpServerOptions {
  std::string listen;  // HOST:PORT (port 0: any free port)
  // TLS (PEM files; both or neither) and an optional client CA (mutual TLS), as on gRPC.
  std::string tls_cert, tls_key, tls_client_ca;
  // Connection threads: every in-flight request holds one for its whole life (and an idle
  // keep-alive connection for up to 5 s), so this is admission's limit plus headroom; requests
  // beyond the permits are refused with 429, not queued.
  int threads = 72;
  std::string model_id;  // the name /v1/models lists and requests may name
};

// The gateway's shared parts the listener works with; all outlive the server.
struct HttpBackend {
  ServedModel model;
  SchedulerClient* scheduler = nullptr;
  HealthMonitor* health = nullptr;
  Admission* admission = nullptr;
  const KeySet* keys = nullptr;
  metrics::GatewayMetrics* metrics = nullptr;  // may be null
};

// The id /v1/models lists for a GGUF path: its file name without ".gguf".
std::string ModelIdFromPath(const std::string& path);

class HttpServer {
 public:
  // Binds (errors name the address) and starts serving on a thread of its own.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& opts,
                                                           const HttpBackend& backend);
  ~HttpServer();
  int port() const;
  // New generation requests get 503 from now on; requests in flight finish.
  void StartDraining();
  void Stop();

  struct Impl;  // public only so the request code in http_server.cc can name it

 private:
  HttpServer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds::gw::http
