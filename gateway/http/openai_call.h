// One OpenAI generation request on the HTTP listener, from admission to its last byte: the
// state the handler builds (Call), and the loop that turns the scheduler's events into one JSON
// answer or a stream of server-sent events (RunCollected / RunStreamed). The server
// (http_server.cc) parses, validates, admits and submits; this file only runs what it submitted.
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "common/metrics/gateway_metrics.h"
#include "common/tokenizer/chat_output_parser.h"
#include "gateway/admission.h"
#include "gateway/http/disconnect_watch.h"
#include "gateway/http/openai_request.h"
#include "gateway/http/openai_response.h"
#include "gateway/output_stream.h"
#include "gateway/scheduler_client.h"

namespace ds::gw::http {

struct Call;

// The calls in flight, so that stopping the server can cancel what a drain left running
// (httplib's stop() joins the connection threads, which would otherwise wait for them).
class CallRegistry {
 public:
  void Add(Call* c);
  void Remove(Call* c);
  // Every registered call: marked gone and its internal call cancelled.
  void CancelAll();

 private:
  std::mutex mu_;
  std::set<Call*> calls_;
};

// One generation request from admission to its last byte. Owned by the handler, then (when
// streaming) by the chunked content provider, which runs on the same connection thread.
struct Call {
  // The server's parts the call uses; all outlive it.
  SchedulerClient* sched = nullptr;
  const Tokenizer* tok = nullptr;
  DisconnectWatch* watcher = nullptr;
  CallRegistry* registry = nullptr;
  bool chat = false;
  OpenAIRequest req;
  PreparedRequest prepared;
  std::optional<Admission::Permit> permit;
  std::unique_ptr<metrics::GatewayMetrics::Request> mr;
  std::chrono::steady_clock::time_point t0;
  uint64_t id = 0;
  std::string public_id, peer;
  std::unique_ptr<SchedulerClient::SubmitCall> call;
  uint64_t watch = 0;             // DisconnectWatch handle (0: the socket was not found)
  std::atomic<bool> gone{false};  // the client closed its connection
  std::unique_ptr<OutputStream> out;
  std::unique_ptr<ChatOutputParser> parser;
  std::optional<InternalEvent> finished;
  bool logged = false;
  uint32_t completion_tokens = 0;
  FinishReason reason = FinishReason::kUnspecified;

  bool call_done = false;  // Finish() was called on the internal call

  ~Call();
  // Finish() on the internal call, once.
  absl::Status FinishCall();
  const char* object() const { return chat ? "chat.completion" : "text_completion"; }
  // The request's one `request_finished` line and its metrics outcome (later calls: no-op).
  void Done(const absl::Status& s);
};

// Public (gRPC-mapped, status_map.cc) code of an internal status: both listeners agree.
absl::StatusCode PublicCode(const absl::Status& s);

// stream: false. Runs the call to its end; on OK `body` is the chat.completion /
// text_completion object.
absl::Status RunCollected(Call& c, int64_t created, const std::string& model, json* body);
// The internal stream ended before its first event: why, as a status (queue full, no worker...).
absl::Status EndedBeforeStart(Call& c);
// stream: true, after the 200 header: `first` (read by the handler) and everything after it as
// SSE events, then the finish chunk, the usage chunk when asked, and data: [DONE] (an error after
// the header is an `error` event). Logs the request's end.
void RunStreamed(Call& c, httplib::DataSink& sink, int64_t created, const std::string& model,
                 const InternalEvent& first);

}  // namespace ds::gw::http
