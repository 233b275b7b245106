#include "common/metrics/gateway_metrics.h"

#include "common/metrics/buckets.h"

namespace ds::metrics {

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kSuccess:
      return "success";
    case Outcome::kCancelled:
      return "cancelled";
    case Outcome::kDeadlineExceeded:
      return "deadline_exceeded";
    case Outcome::kRejected:
      return "rejected";
    case Outcome::kInvalidArgument:
      return "invalid_argument";
    case Outcome::kUnauthenticated:
      return "unauthenticated";
    case Outcome::kUnavailable:
      return "unavailable";
    case Outcome::kError:
      return "error";
  }
  return "error";
}

Outcome OutcomeFromStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return Outcome::kSuccess;
    case absl::StatusCode::kCancelled:
      return Outcome::kCancelled;
    case absl::StatusCode::kDeadlineExceeded:
      return Outcome::kDeadlineExceeded;
    case absl::StatusCode::kResourceExhausted:
      return Outcome::kRejected;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return Outcome::kInvalidArgument;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return Outcome::kUnauthenticated;
    case absl::StatusCode::kUnavailable:
      return Outcome::kUnavailable;
    default:
      return Outcome::kError;
  }
}

GatewayMetrics::GatewayMetrics(prometheus::Registry& r, int inflight_limit) {
  auto& req = prometheus::BuildCounter()
                  .Name("deltaserve_requests_total")
                  .Help("Generate calls by final outcome")
                  .Register(r);
  for (int i = 0; i < kNumOutcomes; ++i)
    requests_[i] = &req.Add({{"outcome", OutcomeName(static_cast<Outcome>(i))}});
  prompt_tokens_ = &prometheus::BuildCounter()
                        .Name("deltaserve_prompt_tokens_total")
                        .Help("Prompt tokens of admitted requests")
                        .Register(r)
                        .Add({});
  generation_tokens_ = &prometheus::BuildCounter()
                            .Name("deltaserve_generation_tokens_total")
                            .Help("Generated tokens streamed to clients")
                            .Register(r)
                            .Add({});
  inflight_ = &prometheus::BuildGauge()
                   .Name("deltaserve_gateway_requests_inflight")
                   .Help("Generate calls holding an admission permit")
                   .Register(r)
                   .Add({});
  prometheus::BuildGauge()
      .Name("deltaserve_gateway_requests_inflight_limit")
      .Help("Admission permits (--max-inflight)")
      .Register(r)
      .Add({})
      .Set(inflight_limit);
  serving_ = &prometheus::BuildGauge()
                  .Name("deltaserve_gateway_serving")
                  .Help("1 while the gateway reports SERVING (a worker is ready behind it)")
                  .Register(r)
                  .Add({});
  draining_ = &prometheus::BuildGauge()
                   .Name("deltaserve_gateway_draining")
                   .Help("1 while the gateway refuses new requests to stop gracefully")
                   .Register(r)
                   .Add({});
  ttft_ = &prometheus::BuildHistogram()
               .Name("deltaserve_time_to_first_token_seconds")
               .Help("Arrival at the gateway to the first generated token")
               .Register(r)
               .Add({}, kTimeToFirstTokenBuckets);
  itl_ = &prometheus::BuildHistogram()
              .Name("deltaserve_inter_token_latency_seconds")
              .Help("Time between consecutive generated tokens of a request")
              .Register(r)
              .Add({}, kInterTokenBuckets);
  queue_wait_ = &prometheus::BuildHistogram()
                     .Name("deltaserve_queue_wait_seconds")
                     .Help("Arrival at the scheduler to slot assignment")
                     .Register(r)
                     .Add({}, kQueueWaitBuckets);
  e2e_ = &prometheus::BuildHistogram()
              .Name("deltaserve_request_duration_seconds")
              .Help("Arrival at the gateway to the end of a successful request")
              .Register(r)
              .Add({}, kRequestDurationBuckets);
}

void GatewayMetrics::OnRequestFinished(Outcome o, double e2e_seconds) {
  requests_[static_cast<int>(o)]->Increment();
  if (o == Outcome::kSuccess) e2e_->Observe(e2e_seconds);
}

void GatewayMetrics::OnAdmitted(double queue_seconds, uint32_t prompt_tokens) {
  queue_wait_->Observe(queue_seconds);
  prompt_tokens_->Increment(prompt_tokens);
}

void GatewayMetrics::OnFirstToken(double ttft_seconds) {
  ttft_->Observe(ttft_seconds);
  generation_tokens_->Increment();
}

void GatewayMetrics::OnNextToken(double inter_token_seconds) {
  itl_->Observe(inter_token_seconds);
  generation_tokens_->Increment();
}

void GatewayMetrics::Request::Token() {
  const auto now = Clock::now();
  if (m_) {
    if (!have_token_) {
      m_->OnFirstToken(std::chrono::duration<double>(now - start_).count());
    } else {
      m_->OnNextToken(std::chrono::duration<double>(now - last_token_).count());
    }
  }
  have_token_ = true;
  last_token_ = now;
}

void GatewayMetrics::Request::Finish(Outcome o) {
  if (finished_) return;
  finished_ = true;
  if (m_) m_->OnRequestFinished(o, std::chrono::duration<double>(Clock::now() - start_).count());
}

}  // namespace ds::metrics
