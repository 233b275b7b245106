// Metrics of the gateway: what clients see. Requests by outcome, in-flight requests, token
// totals and the request latency histograms (time to first token, inter-token latency, queue wait,
// end-to-end), measured where the response is written.
#pragma once
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <chrono>
#include <cstdint>

#include "absl/status/status.h"

namespace ds::metrics {

// Closed set of request outcomes (label `outcome` of deltaserve_requests_total).
enum class Outcome : uint8_t {
  kSuccess,           // finished (length or stop)
  kCancelled,         // the client cancelled or went away
  kDeadlineExceeded,  // its deadline passed
  kRejected,          // overload: no admission permit or the scheduler queue was full
  kInvalidArgument,   // malformed request
  kUnauthenticated,   // missing or wrong bearer token
  kUnavailable,       // no worker could serve, scheduler unreachable, draining
  kError,             // any other server-side failure
};
inline constexpr int kNumOutcomes = 8;
const char* OutcomeName(Outcome o);
// The one mapping from a final status to an outcome.
Outcome OutcomeFromStatus(absl::StatusCode code);

class GatewayMetrics {
 public:
  using Clock = std::chrono::steady_clock;

  GatewayMetrics(prometheus::Registry& registry, int inflight_limit);

  // Every call of Generate ends in exactly one OnRequestFinished. `e2e_seconds` feeds the
  // duration histogram only for kSuccess (latency objectives are about served requests; failures
  // count against the error rate instead).
  void OnRequestFinished(Outcome o, double e2e_seconds);
  void OnAdmitted(double queue_seconds, uint32_t prompt_tokens);
  void OnFirstToken(double ttft_seconds);
  void OnNextToken(double inter_token_seconds);
  void SetInflight(int n) { inflight_->Set(n); }
  void SetServing(bool serving) { serving_->Set(serving ? 1 : 0); }
  void SetDraining(bool draining) { draining_->Set(draining ? 1 : 0); }

  // Per-call helper: measures TTFT / inter-token gaps / e2e from the call's start, and guarantees
  // one OnRequestFinished (kError if the handler returns without calling Finish).
  class Request {
   public:
    explicit Request(GatewayMetrics* m) : m_(m), start_(Clock::now()) {}
    ~Request() {
      if (!finished_) Finish(Outcome::kError);
    }
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;

    void Admitted(double queue_seconds, uint32_t prompt_tokens) {
      if (m_) m_->OnAdmitted(queue_seconds, prompt_tokens);
    }
    // One generated token arrived from the scheduler.
    void Token();
    void Finish(Outcome o);
    void Finish(const absl::Status& s) { Finish(OutcomeFromStatus(s.code())); }

   private:
    GatewayMetrics* m_;
    Clock::time_point start_, last_token_;
    bool have_token_ = false, finished_ = false;
  };

 private:
  prometheus::Counter* requests_[kNumOutcomes];
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Gauge* inflight_;
  prometheus::Gauge* serving_;
  prometheus::Gauge* draining_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* queue_wait_;
  prometheus::Histogram* e2e_;
};

}  // namespace ds::metrics
