#include "gateway/http/http_server.h"

#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/tokenizer/chat_output_parser.h"
#include "gateway/http/disconnect_watch.h"
#include "gateway/http/openai_request.h"
#include "gateway/http/openai_response.h"
#include "gateway/output_stream.h"
#include "gateway/prepare.h"
#include "gateway/status_map.h"

namespace ds::gw::http {
namespace {

// Public (gRPC-mapped) code of an internal status: both listeners report the same code.
absl::StatusCode PublicCode(const absl::Status& s) {
  return static_cast<absl::StatusCode>(ToPublicStatus(s).error_code());
}

void SendError(httplib::Response& res, const absl::Status& s) {
  const absl::StatusCode code = PublicCode(s);
  res.status = HttpStatus(code);
  res.set_content(Dump(ErrorJson(code, std::string(s.message()))), "application/json");
}

}  // namespace

std::string ModelIdFromPath(const std::string& path) {
  std::string b = path.substr(path.find_last_of('/') == std::string::npos
                                  ? 0
                                  : path.find_last_of('/') + 1);
  if (absl::EndsWith(b, ".gguf")) b.resize(b.size() - 5);
  return b;
}

struct HttpServer::Impl {
  HttpServerOptions opts;
  HttpBackend be;
  std::unique_ptr<httplib::Server> server;
  std::thread thread;
  int port = 0;
  std::atomic<bool> draining{false};
  DisconnectWatch watch;
  // Requests in flight (Generate registers them once submitted), so Stop can cancel what a drain
  // left running: httplib's stop() joins the connection threads, which would otherwise wait for
  // those generations to end.
  std::mutex calls_mu;
  std::set<void*> calls;  // Call*

  // Internal request ids: the gRPC listener counts from (pid << 32) + 1; this one from the
  // middle of that range, so the two never hand the scheduler the same id.
  std::atomic<uint64_t> next_id{(static_cast<uint64_t>(getpid()) << 32) + (1ull << 31)};
  const int64_t started = static_cast<int64_t>(std::time(nullptr));

  ModelView View() const {
    ModelView v;
    v.tokenizer = be.model.tokenizer;
    v.n_vocab = be.model.n_vocab;
    v.slot_context = be.health->view().slot_context;
    v.chat_template = be.model.chat_template;
    v.encoder = be.model.encoder;
    return v;
  }

  absl::Status CheckAuth(const httplib::Request& req) const {
    if (be.keys->open()) return absl::OkStatus();
    std::vector<std::string_view> values;
    for (auto [it, end] = req.headers.equal_range("Authorization"); it != end; ++it)
      values.emplace_back(it->second);
    return be.keys->Check(values);
  }

  void Models(const httplib::Request& req, httplib::Response& res) {
    if (absl::Status s = CheckAuth(req); !s.ok()) return SendError(res, s);
    json m = {{"id", opts.model_id}, {"object", "model"}, {"created", started},
              {"owned_by", "deltaserve"}};
    res.set_content(Dump(json{{"object", "list"}, {"data", json::array({m})}}),
                    "application/json");
  }

  void Health(const httplib::Request&, httplib::Response& res) {
    const bool ok = be.health->serving() && !draining.load();
    res.status = ok ? 200 : 503;
    res.set_content(Dump(json{{"status", ok ? "ok" : "not serving"}}), "application/json");
  }

  void Generate(const httplib::Request& req, httplib::Response& res, bool chat);
};

namespace {

// One generation request from admission to its last byte. Owned by the handler, then (when
// streaming) by the chunked content provider, which runs on the same connection thread.
struct Call {
  HttpServer::Impl* srv = nullptr;
  bool chat = false;
  OpenAIRequest req;
  PreparedRequest prepared;
  std::optional<Admission::Permit> permit;
  std::unique_ptr<metrics::GatewayMetrics::Request> mr;
  std::chrono::steady_clock::time_point t0;
  uint64_t id = 0;
  std::string public_id, peer;
  std::unique_ptr<SchedulerClient::SubmitCall> call;
  uint64_t watch = 0;
  std::atomic<bool> gone{false};  // the client closed its connection
  std::unique_ptr<OutputStream> out;
  std::unique_ptr<ChatOutputParser> parser;
  std::optional<InternalEvent> finished;
  bool logged = false;
  uint32_t completion_tokens = 0;
  FinishReason reason = FinishReason::kUnspecified;

  bool call_done = false;  // Finish() was called on the internal call

  ~Call() {
    {
      std::lock_guard<std::mutex> l(srv->calls_mu);
      srv->calls.erase(this);
    }
    if (watch) srv->watch.Remove(watch);
    // The response went away before the stream ran (client gone before the headers were
    // written): the scheduler still holds the request.
    if (call && !call_done) {
      call->Cancel();
      call->Finish().IgnoreError();
    }
    if (mr) Done(absl::CancelledError("client went away"));
  }

  absl::Status FinishCall() {
    call_done = true;
    return call->Finish();
  }

  const char* object() const { return chat ? "chat.completion" : "text_completion"; }

  // The request's one `request_finished` line and its metrics outcome.
  void Done(const absl::Status& s) {
    if (logged) return;
    logged = true;
    const metrics::Outcome outcome = metrics::OutcomeFromStatus(PublicCode(s));
    if (mr) mr->Finish(outcome);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const log::Level level = s.ok() || s.code() == absl::StatusCode::kCancelled
                                 ? log::Level::kInfo
                                 : log::Level::kWarning;
    if (!log::Enabled(level)) return;
    log::Emit(level, "request_finished",
           {{"request_id", public_id.empty() ? std::string("-") : public_id},
            {"api", chat ? "openai.chat" : "openai.completions"},
            {"outcome", metrics::OutcomeName(outcome)},
            {"error", std::string(s.message())},
            {"prompt_tokens", static_cast<uint32_t>(prepared.prompt_ids.size())},
            {"completion_tokens", completion_tokens},
            {"duration_s", seconds},
            {"peer", peer}});
  }
};

// What the generation loop produces, in the API's terms; the writer turns it into SSE chunks or
// accumulates it for one JSON answer.
struct Delta {
  ParsedDelta parsed;                // chat: reasoning / content / tool calls; completions: content
  std::vector<TokenLogprob> logprobs;  // of the tokens behind this delta, when requested
};

class Writer {
 public:
  virtual ~Writer() = default;
  // false: the client is gone.
  virtual bool Write(Delta&& d) = 0;
};

// Runs the request to its end, starting with `first` when the handler already read it. Returns
// the request's final status (OK when it finished with stop or length).
absl::Status Pump(Call& c, Writer& w, const InternalEvent* first = nullptr) {
  SchedulerClient* sched = c.srv->be.scheduler;
  auto deliver = [&](OutputChunk&& ch) -> bool {
    Delta d;
    if (c.req.logprobs) d.logprobs = std::move(ch.logprobs);
    if (c.parser)
      d.parsed = c.parser->Push(ch.text);
    else
      d.parsed.content = std::move(ch.text);
    if (d.parsed.empty() && d.logprobs.empty()) return true;
    return w.Write(std::move(d));
  };
  auto client_gone = [&]() {
    c.call->Cancel();
    c.FinishCall().IgnoreError();
    return absl::CancelledError("client went away");
  };
  // false: the client is gone.
  auto handle = [&](const InternalEvent& ev) -> bool {
    if (ev.kind == InternalEvent::Kind::kAdmitted) {
      if (c.mr) c.mr->Admitted(ev.queue_seconds, static_cast<uint32_t>(c.prepared.prompt_ids.size()));
    } else if (ev.kind == InternalEvent::Kind::kToken) {
      if (c.out->stopped()) return true;  // in flight when the stop string matched
      if (c.mr) c.mr->Token();
      ++c.completion_tokens;
      OutputChunk ch = c.out->Push(ev.token, ev.has_logprob ? &ev.logprob : nullptr);
      if (!deliver(std::move(ch)) || c.gone.load()) return false;
      if (c.out->stopped()) sched->Finish(c.id, FinishReason::kStop).IgnoreError();
    } else {
      c.finished = ev;
    }
    return true;
  };
  if (first && !handle(*first)) return client_gone();
  InternalEvent ev;
  while (!c.finished && c.call->Next(&ev))
    if (!handle(ev)) return client_gone();
  const absl::Status internal = c.FinishCall();
  if (c.gone.load()) return absl::CancelledError("client went away");
  if (!c.finished) {
    if (internal.ok()) return absl::UnavailableError("scheduler ended the request without a result");
    const absl::Status explained = sched->Explain(internal);
    if (explained.code() == absl::StatusCode::kCancelled ||
        explained.code() == absl::StatusCode::kUnknown)
      return absl::UnavailableError(absl::StrCat("scheduler connection lost: ", explained.message()));
    return WithPublicRequestId(explained, c.id, c.public_id);
  }
  c.completion_tokens = c.out->n_tokens();
  if (c.out->stopped()) {
    c.reason = FinishReason::kStop;
  } else {
    c.reason = c.finished->reason;
    if (c.reason != FinishReason::kError) {
      OutputChunk tail = c.out->Finish();
      if (c.out->stopped()) c.reason = FinishReason::kStop;
      if (!deliver(std::move(tail))) return absl::CancelledError("client went away");
    }
  }
  if (c.parser) {
    Delta d;
    d.parsed = c.parser->Finish();
    if (!d.parsed.empty() && !w.Write(std::move(d))) return absl::CancelledError("client went away");
  }
  switch (c.reason) {
    case FinishReason::kError:
      if (!internal.ok()) return WithPublicRequestId(sched->Explain(internal), c.id, c.public_id);
      return absl::InternalError(c.finished->error);
    case FinishReason::kCancelled:
      return absl::DeadlineExceededError(c.finished->error.empty() ? "deadline exceeded"
                                                                   : c.finished->error);
    default:
      return absl::OkStatus();
  }
}

json ToolCallsJson(const std::vector<ToolCallDelta>& calls, bool with_index) {
  json out = json::array();
  for (const ToolCallDelta& t : calls) {
    json j = json::object();
    if (with_index) j["index"] = t.index;
    if (!t.id.empty()) {
      j["id"] = t.id;
      j["type"] = "function";
    }
    json fn = json::object();
    if (!t.name.empty()) fn["name"] = t.name;
    fn["arguments"] = t.arguments;
    j["function"] = std::move(fn);
    out.push_back(std::move(j));
  }
  return out;
}

// stream: false. Everything is collected, then answered once.
class CollectWriter : public Writer {
 public:
  explicit CollectWriter(const Call& c) : c_(c) {}
  bool Write(Delta&& d) override {
    reasoning_ += d.parsed.reasoning;
    content_ += d.parsed.content;
    for (auto& t : d.parsed.tool_calls) calls_.push_back(std::move(t));
    if (!d.logprobs.empty()) {
      if (c_.chat) {
        for (auto& e : ChatLogprobs(*c_.srv->be.model.tokenizer, d.logprobs, c_.req.top_logprobs))
          chat_lp_.push_back(std::move(e));
      } else {
        completion_lp_.Add(*c_.srv->be.model.tokenizer, d.logprobs, c_.req.top_logprobs, &offset_);
      }
    }
    return true;
  }

  json Body(int64_t created, const std::string& model) const {
    json choice = {{"index", 0}};
    const bool tools = !calls_.empty();
    if (c_.chat) {
      json msg = {{"role", "assistant"}};
      msg["content"] = content_.empty() && tools ? json(nullptr) : json(content_);
      if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
      if (tools) msg["tool_calls"] = ToolCallsJson(calls_, /*with_index=*/false);
      choice["message"] = std::move(msg);
      choice["logprobs"] = c_.req.logprobs ? json{{"content", chat_lp_}} : json(nullptr);
    } else {
      choice["text"] = content_;
      choice["logprobs"] = c_.req.logprobs ? completion_lp_.ToJson() : json(nullptr);
    }
    choice["finish_reason"] = FinishReasonJson(c_.reason, tools);
    return json{{"id", c_.public_id},
                {"object", c_.object()},
                {"created", created},
                {"model", model},
                {"choices", json::array({choice})},
                {"usage", UsageJson(static_cast<uint32_t>(c_.prepared.prompt_ids.size()),
                                    c_.completion_tokens)}};
  }

 private:
  const Call& c_;
  std::string reasoning_, content_;
  std::vector<ToolCallDelta> calls_;
  json chat_lp_ = json::array();
  CompletionLogprobs completion_lp_;
  size_t offset_ = 0;
};

// stream: true. Each delta becomes one `chat.completion.chunk` / `text_completion` event.
class SseWriter : public Writer {
 public:
  SseWriter(Call& c, httplib::DataSink& sink, int64_t created, std::string model)
      : c_(c), sink_(sink), created_(created), model_(std::move(model)) {}

  bool Send(const std::string& s) {
    if (!sink_.write(s.data(), s.size())) {
      c_.gone.store(true);
      return false;
    }
    return true;
  }

  json Chunk(json choice) const {
    json j = {{"id", c_.public_id},
              {"object", c_.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_},
              {"choices", json::array({std::move(choice)})}};
    if (c_.req.include_usage) j["usage"] = nullptr;
    return j;
  }

  bool Start() {
    if (!c_.chat) return true;
    json choice = {{"index", 0},
                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
    return Send(SseEvent(Chunk(std::move(choice))));
  }

  bool Write(Delta&& d) override {
    any_tool_calls_ = any_tool_calls_ || !d.parsed.tool_calls.empty();
    json choice = {{"index", 0}};
    const Tokenizer& tok = *c_.srv->be.model.tokenizer;
    if (c_.chat) {
      json delta = json::object();
      if (!d.parsed.reasoning.empty()) delta["reasoning_content"] = d.parsed.reasoning;
      if (!d.parsed.content.empty()) delta["content"] = d.parsed.content;
      if (!d.parsed.tool_calls.empty())
        delta["tool_calls"] = ToolCallsJson(d.parsed.tool_calls, /*with_index=*/true);
      choice["delta"] = std::move(delta);
      choice["logprobs"] = d.logprobs.empty()
                               ? json(nullptr)
                               : json{{"content", ChatLogprobs(tok, d.logprobs, c_.req.top_logprobs)}};
    } else {
      choice["text"] = d.parsed.content;
      if (d.logprobs.empty()) {
        choice["logprobs"] = nullptr;
      } else {
        CompletionLogprobs lp;
        lp.Add(tok, d.logprobs, c_.req.top_logprobs, &offset_);
        choice["logprobs"] = lp.ToJson();
      }
    }
    choice["finish_reason"] = nullptr;
    return Send(SseEvent(Chunk(std::move(choice))));
  }

  void End(const absl::Status& s) {
    if (c_.gone.load()) return;
    if (s.ok()) {
      json choice = {{"index", 0}};
      if (c_.chat)
        choice["delta"] = json::object();
      else
        choice["text"] = "";
      choice["logprobs"] = nullptr;
      choice["finish_reason"] = FinishReasonJson(c_.reason, any_tool_calls_);
      if (!Send(SseEvent(Chunk(std::move(choice))))) return;
      if (c_.req.include_usage) {
        json u = Chunk(json());
        u["choices"] = json::array();
        u["usage"] = UsageJson(static_cast<uint32_t>(c_.prepared.prompt_ids.size()),
                               c_.completion_tokens);
        if (!Send(SseEvent(u))) return;
      }
    } else {
      // After the 200 header an error can only travel in the stream (as OpenAI does).
      if (!Send(SseEvent(ErrorJson(PublicCode(s), std::string(s.message()))))) return;
    }
    Send(std::string(kSseDone));
  }

 private:
  Call& c_;
  httplib::DataSink& sink_;
  int64_t created_;
  std::string model_;
  bool any_tool_calls_ = false;
  size_t offset_ = 0;
};

}  // namespace

void HttpServer::Impl::Generate(const httplib::Request& hreq, httplib::Response& res, bool chat) {
  auto c = std::make_shared<Call>();
  c->srv = this;
  c->chat = chat;
  c->t0 = std::chrono::steady_clock::now();
  c->mr = std::make_unique<metrics::GatewayMetrics::Request>(be.metrics);
  c->peer = absl::StrCat(hreq.remote_addr, ":", hreq.remote_port);
  auto fail = [&](const absl::Status& s) {
    SendError(res, s);
    c->Done(s);
  };
  if (absl::Status s = CheckAuth(hreq); !s.ok()) return fail(s);
  if (draining.load())
    return fail(absl::UnavailableError("gateway is shutting down; retry on another instance"));
  if (!be.health->serving())
    return fail(absl::UnavailableError(
        "not serving: no worker has finished warmup, the scheduler is unreachable, or the "
        "cluster is drained"));
  absl::StatusOr<OpenAIRequest> parsed =
      chat ? ParseChatRequest(hreq.body) : ParseCompletionRequest(hreq.body);
  if (!parsed.ok()) return fail(parsed.status());
  c->req = std::move(*parsed);
  if (!c->req.model.empty() && c->req.model != opts.model_id)
    return fail(absl::NotFoundError(absl::StrCat("model '", c->req.model,
                                                 "' does not exist; this server serves '",
                                                 opts.model_id, "' (GET /v1/models)")));
  const ModelView view = View();
  RenderedPrompt rendered;
  if (chat) {
    if (!view.tokenizer->has_vocab())
      return fail(absl::InvalidArgumentError(
          "messages: the model has no vocabulary; use /v1/completions with token ids"));
    const ChatTemplate plain = ChatTemplate::Of(ChatTemplateKind::kChatML);
    const ChatTemplate& tmpl = be.model.chat_template ? *be.model.chat_template : plain;
    absl::StatusOr<RenderedPrompt> r = tmpl.Render(c->req.messages, c->req.render);
    if (!r.ok()) return fail(r.status());
    rendered = std::move(*r);
    absl::StatusOr<std::vector<int32_t>> ids = EncodeRendered(rendered, view, "messages");
    if (!ids.ok()) return fail(ids.status());
    c->req.input.kind = PromptKind::kIds;
    c->req.input.ids = std::move(*ids);
  }
  absl::StatusOr<PreparedRequest> prepared = Prepare(c->req.input, view);
  if (!prepared.ok()) return fail(prepared.status());
  c->prepared = std::move(*prepared);
  if (std::optional<Admission::Permit> p = be.admission->TryAcquire()) c->permit.emplace(std::move(*p));
  if (!c->permit)
    return fail(absl::ResourceExhaustedError(
        absl::StrCat("server overloaded: ", be.admission->in_flight(), " requests in flight (limit ",
                     be.admission->capacity(), "); retry with backoff")));

  c->id = next_id.fetch_add(1);
  c->public_id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", c->id);
  res.set_header("x-request-id", c->public_id);
  c->out = std::make_unique<OutputStream>(be.model.tokenizer, c->prepared);
  if (chat) {
    ChatOutputOptions po;
    po.starts_in_reasoning = rendered.opens_reasoning;
    po.parse_tool_calls = c->req.parse_tool_calls;
    po.tools = c->req.render.tools;
    po.id_prefix = absl::StrCat("call_", c->id, "_");
    // Only templates that know <think> get reasoning split out (ChatML models answer plainly).
    po.parse_reasoning = be.model.chat_template &&
                         be.model.chat_template->kind() == ChatTemplateKind::kQwen35;
    c->parser = std::make_unique<ChatOutputParser>(std::move(po));
  }
  c->call = be.scheduler->Submit(c->id, c->prepared, nullptr);
  {
    std::lock_guard<std::mutex> l(calls_mu);
    calls.insert(c.get());
  }
  // Cancellation: the client's connection closing cancels the internal call at once.
  const int fd = FindConnectionSocket(hreq.local_addr, hreq.local_port, hreq.remote_addr,
                                      hreq.remote_port);
  if (fd >= 0) {
    SchedulerClient::SubmitCall* sc = c->call.get();
    Call* raw = c.get();
    c->watch = watch.Add(fd, [sc, raw] {
      raw->gone.store(true);
      sc->Cancel();
    });
  }
  const int64_t created = static_cast<int64_t>(std::time(nullptr));

  if (!c->req.stream) {
    CollectWriter w(*c);
    const absl::Status s = Pump(*c, w);
    if (!s.ok()) return fail(s);
    res.set_content(Dump(w.Body(created, opts.model_id)), "application/json");
    c->Done(s);
    return;
  }
  // Streaming: wait for the scheduler's first word, so that a refusal (queue full, no worker,
  // draining) is still an HTTP status rather than an event inside a 200 stream.
  InternalEvent first;
  if (!c->call->Next(&first)) {
    CollectWriter unused(*c);
    return fail(Pump(*c, unused));  // the stream ended: Pump reports why
  }
  res.set_header("Cache-Control", "no-cache");
  // Runs on this connection thread once httplib has written the 200 header.
  res.set_chunked_content_provider(
      "text/event-stream",
      [c, created, first, model = opts.model_id](size_t, httplib::DataSink& sink) {
        SseWriter w(*c, sink, created, model);
        absl::Status s = w.Start() ? Pump(*c, w, &first) : absl::CancelledError("client went away");
        if (s.code() == absl::StatusCode::kCancelled) c->call->Cancel();
        w.End(s);
        c->Done(s);
        sink.done();
        return true;
      });
}

HttpServer::HttpServer() : impl_(std::make_unique<Impl>()) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port; }

void HttpServer::StartDraining() { impl_->draining.store(true); }

void HttpServer::Stop() {
  Impl& g = *impl_;
  {
    std::lock_guard<std::mutex> l(g.calls_mu);
    for (void* c : g.calls) {
      auto* call = static_cast<Call*>(c);
      call->gone.store(true);
      call->call->Cancel();
    }
  }
  if (g.server) g.server->stop();
  if (g.thread.joinable()) g.thread.join();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& opts,
                                                              const HttpBackend& backend) {
  std::unique_ptr<HttpServer> s(new HttpServer());
  Impl& g = *s->impl_;
  g.opts = opts;
  g.be = backend;
  if (g.opts.model_id.empty()) g.opts.model_id = "deltaserve";
  const size_t colon = opts.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(opts.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("--http-listen '", opts.listen, "' is not HOST:PORT"));
  std::string host = opts.listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (opts.tls_cert.empty() != opts.tls_key.empty())
    return absl::InvalidArgumentError("HTTP TLS needs both --tls-cert and --tls-key");
  if (!opts.tls_cert.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(
        opts.tls_cert.c_str(), opts.tls_key.c_str(),
        opts.tls_client_ca.empty() ? nullptr : opts.tls_client_ca.c_str());
    if (!ssl->is_valid())
      return absl::InvalidArgumentError(absl::StrCat(
          "HTTP TLS: cannot load certificate '", opts.tls_cert, "' / key '", opts.tls_key, "'",
          opts.tls_client_ca.empty() ? "" : absl::StrCat(" / client CA '", opts.tls_client_ca, "'")));
    g.server = std::move(ssl);
  } else {
    g.server = std::make_unique<httplib::Server>();
  }
  httplib::Server& sv = *g.server;
  const int threads = std::max(4, opts.threads);
  sv.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  sv.set_payload_max_length(static_cast<size_t>(kMaxRequestBytes));
  // No SO_REUSEPORT / SO_REUSEADDR sharing: a second server on the port must fail (as gRPC's
  // listener does, common/auth/listener.h).
  sv.set_socket_options([](socket_t fd) {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  sv.Post("/v1/chat/completions", [&g](const httplib::Request& q, httplib::Response& r) {
    g.Generate(q, r, /*chat=*/true);
  });
  sv.Post("/v1/completions", [&g](const httplib::Request& q, httplib::Response& r) {
    g.Generate(q, r, /*chat=*/false);
  });
  sv.Get("/v1/models", [&g](const httplib::Request& q, httplib::Response& r) { g.Models(q, r); });
  sv.Get("/health", [&g](const httplib::Request& q, httplib::Response& r) { g.Health(q, r); });
  // Unknown paths, wrong methods, bodies over the limit: OpenAI's error shape too.
  sv.set_error_handler([](const httplib::Request& q, httplib::Response& r) {
    if (!r.body.empty()) return;
    const absl::StatusCode code = r.status == 404 ? absl::StatusCode::kNotFound
                                                  : absl::StatusCode::kInvalidArgument;
    const std::string msg =
        r.status == 404   ? absl::StrCat("no route for ", q.method, " ", q.path)
        : r.status == 413 ? absl::StrCat("request body over ", kMaxRequestBytes, " bytes")
                          : absl::StrCat("HTTP ", r.status, " for ", q.method, " ", q.path);
    r.set_content(Dump(ErrorJson(code, msg)), "application/json");
  });
  sv.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    r.status = 500;
    r.set_content(Dump(ErrorJson(absl::StatusCode::kInternal, "internal error: " + what)),
                  "application/json");
  });
  if (port == 0) {
    g.port = sv.bind_to_any_port(host);
  } else {
    g.port = sv.bind_to_port(host, port) ? port : -1;
  }
  if (g.port <= 0)
    return absl::UnavailableError(absl::StrCat("cannot listen on ", opts.listen,
                                               " (HTTP): address in use or not available"));
  g.thread = std::thread([&sv] { sv.listen_after_bind(); });
  return s;
}

}  // namespace ds::gw::http
