// deltaserve.v1.Generation on the public listener. Each call runs on a gRPC thread that only
// parses, validates, tokenizes and formats; generation itself happens in the scheduler daemon.
#pragma once
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>

#include "common/metrics/gateway_metrics.h"
#include "deltaserve/v1/deltaserve.grpc.pb.h"
#include "gateway/admission.h"
#include "gateway/auth.h"
#include "gateway/health.h"
#include "gateway/prepare.h"
#include "gateway/scheduler_client.h"

namespace ds::gw {

// Extracts the `authorization` metadata values for KeySet::Check (the auth hook point).
absl::Status CheckAuth(const grpc::ServerContext& ctx, const KeySet& keys);

struct ServedModel {
  const Tokenizer* tokenizer = nullptr;
  int32_t n_vocab = 0;
  const ChatTemplate* chat_template = nullptr;  // the GGUF's, matched (null: ChatML)
  const PromptEncoder* encoder = nullptr;
};

class GenerationService final : public deltaserve::v1::Generation::Service {
 public:
  GenerationService(ServedModel model, SchedulerClient* scheduler, HealthMonitor* health,
                    Admission* admission, const KeySet* keys);

  grpc::Status Generate(grpc::ServerContext* ctx, const deltaserve::v1::GenerateRequest* req,
                        grpc::ServerWriter<deltaserve::v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* ctx, const deltaserve::v1::TokenizeRequest* req,
                        deltaserve::v1::TokenizeResponse* resp) override;

  // Optional; every Generate call then counts in deltaserve_requests_total and the latency
  // histograms (common/metrics/gateway_metrics.h).
  void SetMetrics(metrics::GatewayMetrics* m) { metrics_ = m; }
  // Graceful stop: new Generate calls are refused with UNAVAILABLE (retryable elsewhere).
  void StartDraining() { draining_.store(true, std::memory_order_release); }

 private:
  ModelView View() const;
  // The call itself; Generate() wraps it with the metrics and the request_finished log line.
  // `public_id` is set once the request has an id; `info` collects what the log line reports.
  struct CallInfo {
    std::string public_id;
    uint32_t prompt_tokens = 0, completion_tokens = 0;
    const char* finish_reason = "";
  };
  grpc::Status GenerateImpl(grpc::ServerContext* ctx, const deltaserve::v1::GenerateRequest* req,
                            grpc::ServerWriter<deltaserve::v1::GenerateResponse>* writer,
                            metrics::GatewayMetrics::Request* mr, CallInfo* info);

  ServedModel model_;
  SchedulerClient* scheduler_;
  HealthMonitor* health_;
  Admission* admission_;
  const KeySet* keys_;
  metrics::GatewayMetrics* metrics_ = nullptr;
  std::atomic<bool> draining_{false};
  // Internal request ids: pid in the high bits so a restarted gateway never reuses one.
  std::atomic<uint64_t> next_id_;
};

}  // namespace ds::gw
