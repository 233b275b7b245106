// deltaserve.v1.Generation on the public listener. Each call runs on a gRPC thread that only
// parses, validates, tokenizes and formats; generation itself happens in the scheduler daemon.
#pragma once
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>

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
};

class GenerationService final : public deltaserve::v1::Generation::Service {
 public:
  GenerationService(ServedModel model, SchedulerClient* scheduler, HealthMonitor* health,
                    Admission* admission, const KeySet* keys);

  grpc::Status Generate(grpc::ServerContext* ctx, const deltaserve::v1::GenerateRequest* req,
                        grpc::ServerWriter<deltaserve::v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* ctx, const deltaserve::v1::TokenizeRequest* req,
                        deltaserve::v1::TokenizeResponse* resp) override;

 private:
  ModelView View() const;

  ServedModel model_;
  SchedulerClient* scheduler_;
  HealthMonitor* health_;
  Admission* admission_;
  const KeySet* keys_;
  // Internal request ids: pid in the high bits so a restarted gateway never reuses one.
  std::atomic<uint64_t> next_id_;
};

}  // namespace ds::gw
