#include "gateway/gateway.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/auth/bearer.h"
#include "common/auth/listener.h"
#include "common/auth/tls.h"
#include "common/config/config_file.h"
#include "common/config/role.h"
#include "common/gguf/gguf.h"
#include "common/log/log.h"
#include "common/log/protobuf_log.h"
#include "common/metrics/gateway_metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/systemd/notify.h"
#include "common/systemd/watchdog.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/prompt_encoder.h"
#include "common/tokenizer/tokenizer.h"
#include "gateway/admin_service.h"
#include "gateway/generation_service.h"
#include "gateway/health.h"
#include "gateway/http/http_server.h"
#include "gateway/malformed_request.h"
#include "gateway/scheduler_client.h"
#include "common/util/model_alias.h"

namespace ds::gw {
namespace {

std::string HostOf(const std::string& addr) { return addr.substr(0, addr.rfind(':')); }

}  // namespace

absl::StatusOr<GatewayOptions> ParseGatewayFlags(int argc, char** argv) {
  static const std::set<std::string> kFlags = {
      "--listen",         "--admin-listen", "--scheduler",          "--model",
      "--max-inflight",   "--api-key-file", "--admin-key-file",     "--port-file",
      "--health-interval-ms", "--tls-cert", "--tls-key",            "--tls-client-ca",
      "--drain-timeout",  "--metrics-listen", "--scheduler-key-file", "--scheduler-ca",
      "--scheduler-tls-name", "--http-listen"};
  DS_ASSIGN_OR_RETURN(auto m, config::ParseFlagPairs(argc, argv, kFlags));
  GatewayOptions o;
  if (!m.count("--model")) return absl::InvalidArgumentError("--model FILE is required");
  if (!m.count("--scheduler"))
    return absl::InvalidArgumentError("--scheduler HOST:PORT is required");
  o.model = ResolveModelAlias(m["--model"]);  // "demo": models/demo/
  o.scheduler = m["--scheduler"];
  if (m.count("--listen")) o.listen = m["--listen"];
  if (m.count("--admin-listen")) o.admin_listen = m["--admin-listen"];
  if (m.count("--api-key-file")) o.api_key_file = m["--api-key-file"];
  if (m.count("--admin-key-file")) o.admin_key_file = m["--admin-key-file"];
  if (m.count("--tls-cert")) o.tls_cert = m["--tls-cert"];
  if (m.count("--tls-key")) o.tls_key = m["--tls-key"];
  if (m.count("--tls-client-ca")) o.tls_client_ca = m["--tls-client-ca"];
  if (m.count("--metrics-listen")) o.metrics_listen = m["--metrics-listen"];
  if (m.count("--http-listen")) o.http_listen = m["--http-listen"];
  if (m.count("--scheduler-key-file")) o.scheduler_key_file = m["--scheduler-key-file"];
  if (m.count("--scheduler-ca")) o.scheduler_ca = m["--scheduler-ca"];
  if (m.count("--scheduler-tls-name")) o.scheduler_tls_name = m["--scheduler-tls-name"];
  if (m.count("--drain-timeout") &&
      (!absl::SimpleAtod(m["--drain-timeout"], &o.drain_timeout_s) || o.drain_timeout_s < 0))
    return absl::InvalidArgumentError(absl::StrCat("--drain-timeout expects seconds >= 0, got '",
                                                   m["--drain-timeout"], "'"));
  if (m.count("--port-file")) o.port_file = m["--port-file"];
  auto positive = [&](const char* f, int* v) -> absl::Status {
    if (!m.count(f)) return absl::OkStatus();
    if (!absl::SimpleAtoi(m[f], v) || *v < 1)
      return absl::InvalidArgumentError(
          absl::StrCat(f, " expects an integer >= 1, got '", m[f], "'"));
    return absl::OkStatus();
  };
  DS_RETURN_IF_ERROR(positive("--max-inflight", &o.max_inflight));
  DS_RETURN_IF_ERROR(positive("--health-interval-ms", &o.health_interval_ms));
  if (o.listen == o.admin_listen && o.listen.substr(o.listen.rfind(':')) != ":0")
    return absl::InvalidArgumentError("--admin-listen must differ from --listen");
  return o;
}

struct Gateway::Impl {
  GatewayOptions opts;
  std::unique_ptr<gguf::File> file;
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::optional<PromptEncoder> encoder;
  std::unique_ptr<http::HttpServer> http_server;
  KeySet api_keys, admin_keys;
  std::unique_ptr<SchedulerClient> scheduler;
  std::unique_ptr<Admission> admission;
  std::unique_ptr<HealthMonitor> health;
  std::unique_ptr<GenerationService> generation;
  std::unique_ptr<AdminService> admin;
  std::unique_ptr<grpc::Server> public_server, admin_server;
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  std::unique_ptr<metrics::GatewayMetrics> metrics;
  int port = 0, admin_port = 0;
  bool shut_down = false;
};

Gateway::Gateway() : impl_(std::make_unique<Impl>()) {}

Gateway::~Gateway() { Shutdown(); }

int Gateway::port() const { return impl_->port; }
int Gateway::admin_port() const { return impl_->admin_port; }
bool Gateway::serving() const { return impl_->health->serving(); }
int Gateway::http_port() const { return impl_->http_server ? impl_->http_server->port() : 0; }
int Gateway::metrics_port() const {
  return impl_->metrics_server ? impl_->metrics_server->port() : 0;
}

int Gateway::Drain(std::chrono::milliseconds timeout) {
  Impl& g = *impl_;
  g.generation->StartDraining();
  if (g.http_server) g.http_server->StartDraining();
  g.health->SetDraining();
  if (g.metrics) g.metrics->SetDraining(true);
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (g.admission->in_flight() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return g.admission->in_flight();
}

void Gateway::Shutdown() {
  Impl& g = *impl_;
  if (g.shut_down) return;
  g.shut_down = true;
  if (g.health) g.health->Stop();
  // After Drain() little is left; what is gets cancelled at this deadline.
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  if (g.public_server) g.public_server->Shutdown(deadline);
  if (g.admin_server) g.admin_server->Shutdown(deadline);
  if (g.http_server) g.http_server->Stop();
}

absl::StatusOr<std::unique_ptr<Gateway>> Gateway::Start(const GatewayOptions& opts) {
  std::unique_ptr<Gateway> gw(new Gateway());
  Impl& g = *gw->impl_;
  g.opts = opts;
  DS_ASSIGN_OR_RETURN(g.file, gguf::File::Open(opts.model));
  DS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromGguf(*g.file));
  g.tokenizer.emplace(std::move(tok));
  DS_ASSIGN_OR_RETURN(const gguf::TensorInfo* emb, g.file->GetTensor("token_embd.weight"));
  // The model's chat template, matched to a native renderer (common/tokenizer/chat_template.h);
  // a GGUF without one gets plain ChatML.
  {
    absl::StatusOr<std::string> jinja = g.file->GetString("tokenizer.chat_template");
    g.chat_template.emplace(ChatTemplate::FromJinja(jinja.ok() ? *jinja : std::string()));
  }
  g.encoder.emplace(&*g.tokenizer);
  ServedModel model;
  model.tokenizer = &*g.tokenizer;
  model.chat_template = &*g.chat_template;
  model.encoder = &*g.encoder;
  model.n_vocab = static_cast<int32_t>(emb->ne[1]);
  if (model.n_vocab <= 0)
    return absl::InvalidArgumentError("token_embd.weight has no rows: cannot bound token ids");
  if (!opts.api_key_file.empty()) {
    DS_ASSIGN_OR_RETURN(g.api_keys, KeySet::FromFile(opts.api_key_file));
  }
  if (!opts.admin_key_file.empty()) {
    DS_ASSIGN_OR_RETURN(g.admin_keys, KeySet::FromFile(opts.admin_key_file));
  }
  // Checked before anything listens: a bad certificate is one clear error at start.
  DS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> public_creds,
                      auth::MakeServerCredentials(
                          {opts.tls_cert, opts.tls_key, opts.tls_client_ca}));
  DS_ASSIGN_OR_RETURN(g.metrics_server,
                      metrics::MetricsServer::Start(opts.metrics_listen, "gateway"));
  g.metrics = std::make_unique<metrics::GatewayMetrics>(g.metrics_server->registry(),
                                                        opts.max_inflight);

  {
    std::string token;
    if (!opts.scheduler_key_file.empty()) {
      DS_ASSIGN_OR_RETURN(token, auth::ReadClientToken(opts.scheduler_key_file));
    }
    auth::ClientTlsFiles tls;
    tls.tls = !opts.scheduler_ca.empty();
    tls.ca_file = opts.scheduler_ca;
    tls.server_name = opts.scheduler_tls_name;
    DS_ASSIGN_OR_RETURN(g.scheduler, SchedulerClient::Create(opts.scheduler, tls, token));
  }
  g.admission = std::make_unique<Admission>(opts.max_inflight);
  g.health = std::make_unique<HealthMonitor>(g.scheduler.get(),
                                             std::chrono::milliseconds(opts.health_interval_ms));
  g.generation = std::make_unique<GenerationService>(model, g.scheduler.get(), g.health.get(),
                                                     g.admission.get(), &g.api_keys);
  g.generation->SetMetrics(g.metrics.get());
  // Gauges whose truth lives elsewhere are read at scrape time.
  g.metrics_server->AddCollectHook([m = g.metrics.get(), a = g.admission.get(),
                                    h = g.health.get()] {
    m->SetInflight(a->in_flight());
    m->SetServing(h->serving());
  });
  g.admin = std::make_unique<AdminService>(g.scheduler.get(), &g.admin_keys, g.health.get());

  // Before the first request is parsed: a request that fails to parse must not print
  // libprotobuf's own line (malformed_request.h answers and logs it).
  log::RouteProtobufLogs();
  grpc::EnableDefaultHealthCheckService(true);
  // grpc.reflection.v1alpha on both listeners: grpcurl / grpc_cli work without the proto files.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  {
    grpc::ServerBuilder b;
    auth::AddExclusiveListeningPort(&b, opts.listen, public_creds, &g.port);
    // The documented request limits (gateway/request.h): gRPC refuses bigger ones unparsed.
    b.SetMaxReceiveMessageSize(kMaxRequestBytes);
    b.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, kMaxMetadataBytes);
    b.experimental().SetInterceptorCreators(MalformedRequestInterceptors(g.metrics.get()));
    b.RegisterService(g.generation.get());
    DS_ASSIGN_OR_RETURN(g.public_server, auth::BuildAndStartListener(&b, opts.listen, &g.port));
    g.health->Attach(g.public_server.get());
  }
  {
    grpc::ServerBuilder b;
    auth::AddExclusiveListeningPort(&b, opts.admin_listen, grpc::InsecureServerCredentials(),
                                    &g.admin_port);
    b.experimental().SetInterceptorCreators(MalformedRequestInterceptors(nullptr));
    b.RegisterService(g.admin.get());
    DS_ASSIGN_OR_RETURN(g.admin_server,
                        auth::BuildAndStartListener(&b, opts.admin_listen, &g.admin_port));
    g.health->Attach(g.admin_server.get());
  }
  if (!opts.http_listen.empty()) {
    http::HttpServerOptions ho;
    ho.listen = opts.http_listen;
    ho.tls_cert = opts.tls_cert;
    ho.tls_key = opts.tls_key;
    ho.tls_client_ca = opts.tls_client_ca;
    ho.threads = opts.max_inflight + 8;
    ho.model_id = http::ModelIdFromPath(opts.model);
    http::HttpBackend hb;
    hb.model = model;
    hb.scheduler = g.scheduler.get();
    hb.health = g.health.get();
    hb.admission = g.admission.get();
    hb.keys = &g.api_keys;
    hb.metrics = g.metrics.get();
    DS_ASSIGN_OR_RETURN(g.http_server, http::HttpServer::Start(ho, hb));
  }
  g.health->Start();
  DS_LOG(INFO, "listening",
         {{"public", absl::StrCat(HostOf(opts.listen), ":", g.port)},
          {"tls", !opts.tls_cert.empty()},
          {"api_keys", !g.api_keys.open()},
          {"admin", absl::StrCat(HostOf(opts.admin_listen), ":", g.admin_port)},
          {"admin_keys", !g.admin_keys.open()},
          {"metrics", g.metrics_server->port() > 0
                          ? absl::StrCat(HostOf(opts.metrics_listen), ":", g.metrics_server->port())
                          : std::string("off")},
          {"http", g.http_server ? absl::StrCat(HostOf(opts.http_listen), ":", g.http_server->port())
                                 : std::string("off")},
          {"chat_template", g.chat_template->name()},
          {"scheduler", opts.scheduler},
          {"max_inflight", opts.max_inflight},
          {"vocab", model.n_vocab},
          {"tokenizer", g.tokenizer->has_vocab()}});
  if (g.api_keys.open())
    DS_LOG(WARNING, "public_api_open",
           {{"detail", "no api_key_file: every client is accepted; set one before listening "
                       "beyond loopback"}});
  if (!opts.port_file.empty()) {
    const std::string tmp = opts.port_file + ".tmp";
    std::ofstream(tmp) << g.port << " " << g.admin_port << " " << g.metrics_server->port() << " "
                       << gw->http_port() << "\n";
    std::rename(tmp.c_str(), opts.port_file.c_str());
  }
  return gw;
}

void Gateway::SetWatchdog(sd::Watchdog* wd) {
  if (wd && wd->enabled())
    impl_->health->SetWatchdogLoop(wd->RegisterPeriodic(
        "health_poller",
        std::max<std::chrono::nanoseconds>(std::chrono::seconds(5),
                                           std::chrono::milliseconds(impl_->opts.health_interval_ms * 4))));
}

int RunGatewayMain(int argc, char** argv) {
  const char* kUsage =
      "usage: deltaserve gateway [--config FILE] --model FILE --scheduler HOST:PORT "
      "[--listen 127.0.0.1:PORT] [--admin-listen 127.0.0.1:PORT] [--max-inflight N] "
      "[--api-key-file F] [--admin-key-file F] [--tls-cert F --tls-key F [--tls-client-ca F]] "
      "[--metrics-listen HOST:PORT] [--http-listen 127.0.0.1:PORT] [--drain-timeout S] [--log-level L] [--port-file F] "
      "[--health-interval-ms N] [--scheduler-key-file F] "
      "[--scheduler-ca F [--scheduler-tls-name N]]\n";
  if (config::HelpRequested(argc, argv, kUsage)) return 0;
  auto role = config::SetUpRole("gateway", argc, argv);
  absl::StatusOr<GatewayOptions> o =
      role.ok() ? ParseGatewayFlags(role->args.argc(), role->args.argv())
                : absl::StatusOr<GatewayOptions>(role.status());
  if (role.ok() && !o.ok()) o = role->args.Explain(o.status());
  if (o.ok() && !role->metrics_listen.empty()) o->metrics_listen = role->metrics_listen;
  if (!o.ok()) {
    std::fprintf(stderr, "deltaserve gateway: %s\n%s", std::string(o.status().message()).c_str(),
                 kUsage);
    return 2;
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  auto gw = Gateway::Start(*o);
  if (!gw.ok()) {
    DS_LOG(ERROR, "start_failed", {{"error", gw.status()}});
    std::fprintf(stderr, "deltaserve gateway: %s\n", gw.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<sd::Watchdog> watchdog = sd::Watchdog::FromEnvironment();
  watchdog->SetStallCallback([](const std::string& loop, double overdue_s) {
    DS_LOG(ERROR, "watchdog_stall", {{"loop", loop}, {"overdue_s", overdue_s}});
  });
  (*gw)->SetWatchdog(watchdog.get());
  watchdog->Start();
  sd::NotifyReady(absl::StrCat("listening on port ", (*gw)->port(), ", admin ",
                               (*gw)->admin_port()));
  int sig = 0;
  sigwait(&sigs, &sig);
  DS_LOG(INFO, "stopping", {{"signal", sig}, {"drain_timeout_s", o->drain_timeout_s}});
  sd::NotifyStopping("draining in-flight requests");
  const int left = (*gw)->Drain(std::chrono::milliseconds(static_cast<int64_t>(o->drain_timeout_s * 1000)));
  if (left > 0) {
    DS_LOG(WARNING, "drain_timeout", {{"cancelled_requests", left}});
  } else {
    DS_LOG(INFO, "drained");
  }
  (*gw)->Shutdown();
  watchdog->Stop();
  return 0;
}

}  // namespace ds::gw
