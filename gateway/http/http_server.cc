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
#include "gateway/http/openai_call.h"
#include "gateway/http/openai_request.h"
#include "gateway/http/openai_response.h"
#include "gateway/output_stream.h"
#include "gateway/prepare.h"
#include "gateway/status_map.h"

namespace ds::gw::http {
namespace {

// The gRPC listener's public status (code and message, status_map.cc) in OpenAI's shape.
void SendError(httplib::Response& res, const absl::Status& s) {
  const grpc::Status pub = ToPublicStatus(s);
  const auto code = static_cast<absl::StatusCode>(pub.error_code());
  res.status = HttpStatus(code);
  res.set_content(Dump(ErrorJson(code, pub.error_message())), "application/json");
}

}  // namespace

std::string ModelIdFromPath(const std::string& path) {
  std::string b =
      path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
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
  CallRegistry calls;  // requests once submitted (Stop cancels what a drain left running)

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
    json m = {{"id", opts.model_id},
              {"object", "model"},
              {"created", started},
              {"owned_by", "deltaserve"}};
    res.set_content(Dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
  }

  void Health(const httplib::Request&, httplib::Response& res) {
    const bool ok = be.health->serving() && !draining.load();
    res.status = ok ? 200 : 503;
    res.set_content(Dump(json{{"status", ok ? "ok" : "not serving"}}), "application/json");
  }

  void Generate(const httplib::Request& req, httplib::Response& res, bool chat);
};

void HttpServer::Impl::Generate(const httplib::Request& hreq, httplib::Response& res, bool chat) {
  auto c = std::make_shared<Call>();
  c->sched = be.scheduler;
  c->tok = be.model.tokenizer;
  c->watcher = &watch;
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
  // No max_tokens: up to the slot's context, as OpenAI and vLLM do (a reasoning model would be
  // cut off by the gRPC API's default of 256); Prepare already checked the prompt fits.
  if (c->req.input.max_tokens == 0 && view.slot_context > c->prepared.prompt_ids.size())
    c->prepared.max_tokens =
        static_cast<uint32_t>(view.slot_context - c->prepared.prompt_ids.size());
  if (std::optional<Admission::Permit> p = be.admission->TryAcquire())
    c->permit.emplace(std::move(*p));
  if (!c->permit)
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        "server overloaded: ", be.admission->in_flight(), " requests in flight (limit ",
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
    po.parse_reasoning =
        be.model.chat_template && be.model.chat_template->kind() == ChatTemplateKind::kQwen35;
    c->parser = std::make_unique<ChatOutputParser>(std::move(po));
  }
  c->call = be.scheduler->Submit(c->id, c->prepared, nullptr);
  c->registry = &calls;
  calls.Add(c.get());
  // Cancellation: the client's connection closing cancels the internal call at once.
  const int fd =
      FindConnectionSocket(hreq.local_addr, hreq.local_port, hreq.remote_addr, hreq.remote_port);
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
    json body;
    const absl::Status s = RunCollected(*c, created, opts.model_id, &body);
    if (!s.ok()) return fail(s);
    res.set_content(Dump(body), "application/json");
    c->Done(s);
    return;
  }
  // Streaming: wait for the scheduler's first word, so that a refusal (queue full, no worker,
  // draining) is still an HTTP status rather than an event inside a 200 stream.
  InternalEvent first;
  if (!c->call->Next(&first)) return fail(EndedBeforeStart(*c));
  res.set_header("Cache-Control", "no-cache");
  // Runs on this connection thread once httplib has written the 200 header.
  res.set_chunked_content_provider("text/event-stream", [c, created, first, model = opts.model_id](
                                                            size_t, httplib::DataSink& sink) {
    RunStreamed(*c, sink, created, model, first);
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
  g.calls.CancelAll();
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
          opts.tls_client_ca.empty() ? ""
                                     : absl::StrCat(" / client CA '", opts.tls_client_ca, "'")));
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
    const absl::StatusCode code =
        r.status == 404 ? absl::StatusCode::kNotFound : absl::StatusCode::kInvalidArgument;
    const std::string msg = r.status == 404 ? absl::StrCat("no route for ", q.method, " ", q.path)
                            : r.status == 413
                                ? absl::StrCat("request body over ", kMaxRequestBytes, " bytes")
                                : absl::StrCat("HTTP ", r.status, " for ", q.method, " ", q.path);
    r.set_content(Dump(ErrorJson(code, msg)), "application/json");
  });
  sv.set_exception_handler(
      [](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
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
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", opts.listen, " (HTTP): address in use or not available"));
  g.thread = std::thread([&sv] { sv.listen_after_bind(); });
  return s;
}

}  // namespace ds::gw::http
