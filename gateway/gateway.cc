#include "gateway/gateway.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "gateway/admin_service.h"
#include "gateway/generation_service.h"
#include "gateway/health.h"
#include "gateway/scheduler_client.h"

namespace ds::gw {
namespace {

void Log(const std::string& msg) {
  std::fprintf(stderr, "[gateway] %s\n", msg.c_str());
  std::fflush(stderr);
}

std::string HostOf(const std::string& addr) { return addr.substr(0, addr.rfind(':')); }

}  // namespace

absl::StatusOr<GatewayOptions> ParseGatewayFlags(int argc, char** argv) {
  static const std::set<std::string> kFlags = {
      "--listen",         "--admin-listen", "--scheduler",
      "--model",          "--max-inflight", "--api-key-file",
      "--admin-key-file", "--port-file",    "--health-interval-ms"};
  std::map<std::string, std::string> m;
  for (int i = 0; i < argc; ++i) {
    const std::string f = argv[i];
    if (!kFlags.count(f)) return absl::InvalidArgumentError("unknown flag '" + f + "'");
    if (i + 1 >= argc) return absl::InvalidArgumentError("flag " + f + " needs a value");
    m[f] = argv[++i];
  }
  GatewayOptions o;
  if (!m.count("--model")) return absl::InvalidArgumentError("--model FILE is required");
  if (!m.count("--scheduler"))
    return absl::InvalidArgumentError("--scheduler HOST:PORT is required");
  o.model = m["--model"];
  o.scheduler = m["--scheduler"];
  if (m.count("--listen")) o.listen = m["--listen"];
  if (m.count("--admin-listen")) o.admin_listen = m["--admin-listen"];
  if (m.count("--api-key-file")) o.api_key_file = m["--api-key-file"];
  if (m.count("--admin-key-file")) o.admin_key_file = m["--admin-key-file"];
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
  KeySet api_keys, admin_keys;
  std::unique_ptr<SchedulerClient> scheduler;
  std::unique_ptr<Admission> admission;
  std::unique_ptr<HealthMonitor> health;
  std::unique_ptr<GenerationService> generation;
  std::unique_ptr<AdminService> admin;
  std::unique_ptr<grpc::Server> public_server, admin_server;
  int port = 0, admin_port = 0;
  bool shut_down = false;
};

Gateway::Gateway() : impl_(std::make_unique<Impl>()) {}

Gateway::~Gateway() { Shutdown(); }

int Gateway::port() const { return impl_->port; }
int Gateway::admin_port() const { return impl_->admin_port; }
bool Gateway::serving() const { return impl_->health->serving(); }

void Gateway::Shutdown() {
  Impl& g = *impl_;
  if (g.shut_down) return;
  g.shut_down = true;
  if (g.health) g.health->Stop();
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  if (g.public_server) g.public_server->Shutdown(deadline);
  if (g.admin_server) g.admin_server->Shutdown(deadline);
}

absl::StatusOr<std::unique_ptr<Gateway>> Gateway::Start(const GatewayOptions& opts) {
  std::unique_ptr<Gateway> gw(new Gateway());
  Impl& g = *gw->impl_;
  g.opts = opts;
  DS_ASSIGN_OR_RETURN(g.file, gguf::File::Open(opts.model));
  DS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromGguf(*g.file));
  g.tokenizer.emplace(std::move(tok));
  DS_ASSIGN_OR_RETURN(const gguf::TensorInfo* emb, g.file->GetTensor("token_embd.weight"));
  ServedModel model;
  model.tokenizer = &*g.tokenizer;
  model.n_vocab = static_cast<int32_t>(emb->ne[1]);
  if (model.n_vocab <= 0)
    return absl::InvalidArgumentError("token_embd.weight has no rows: cannot bound token ids");
  if (!opts.api_key_file.empty()) {
    DS_ASSIGN_OR_RETURN(g.api_keys, KeySet::FromFile(opts.api_key_file));
  }
  if (!opts.admin_key_file.empty()) {
    DS_ASSIGN_OR_RETURN(g.admin_keys, KeySet::FromFile(opts.admin_key_file));
  }

  g.scheduler = std::make_unique<SchedulerClient>(opts.scheduler);
  g.admission = std::make_unique<Admission>(opts.max_inflight);
  g.health = std::make_unique<HealthMonitor>(g.scheduler.get(),
                                             std::chrono::milliseconds(opts.health_interval_ms));
  g.generation = std::make_unique<GenerationService>(model, g.scheduler.get(), g.health.get(),
                                                     g.admission.get(), &g.api_keys);
  g.admin = std::make_unique<AdminService>(g.scheduler.get(), &g.admin_keys);

  grpc::EnableDefaultHealthCheckService(true);
  {
    grpc::ServerBuilder b;
    b.AddListeningPort(opts.listen, grpc::InsecureServerCredentials(), &g.port);
    b.RegisterService(g.generation.get());
    g.public_server = b.BuildAndStart();
    if (!g.public_server || g.port == 0)
      return absl::UnavailableError("cannot listen on " + opts.listen);
    g.health->Attach(g.public_server.get());
  }
  {
    grpc::ServerBuilder b;
    b.AddListeningPort(opts.admin_listen, grpc::InsecureServerCredentials(), &g.admin_port);
    b.RegisterService(g.admin.get());
    g.admin_server = b.BuildAndStart();
    if (!g.admin_server || g.admin_port == 0)
      return absl::UnavailableError("cannot listen on " + opts.admin_listen);
    g.health->Attach(g.admin_server.get());
  }
  g.health->Start();
  Log(absl::StrCat("listening on ", HostOf(opts.listen), ":", g.port, " (admin ",
                   HostOf(opts.admin_listen), ":", g.admin_port, "), scheduler ", opts.scheduler,
                   ", max in flight ", opts.max_inflight, ", vocab ", model.n_vocab,
                   g.tokenizer->has_vocab() ? "" : " (no tokenizer: token ids only)"));
  if (!opts.port_file.empty()) {
    const std::string tmp = opts.port_file + ".tmp";
    std::ofstream(tmp) << g.port << " " << g.admin_port << "\n";
    std::rename(tmp.c_str(), opts.port_file.c_str());
  }
  return gw;
}

int RunGatewayMain(int argc, char** argv) {
  auto o = ParseGatewayFlags(argc, argv);
  if (!o.ok()) {
    std::fprintf(stderr,
                 "deltaserve gateway: %s\nusage: deltaserve gateway --model FILE --scheduler "
                 "HOST:PORT [--listen 127.0.0.1:PORT] [--admin-listen 127.0.0.1:PORT] "
                 "[--max-inflight N] [--api-key-file F] [--admin-key-file F] [--port-file F] "
                 "[--health-interval-ms N]\n",
                 std::string(o.status().message()).c_str());
    return 2;
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  auto gw = Gateway::Start(*o);
  if (!gw.ok()) {
    Log("error: " + gw.status().ToString());
    return 1;
  }
  int sig = 0;
  sigwait(&sigs, &sig);
  Log(absl::StrCat("signal ", sig, ": shutting down"));
  (*gw)->Shutdown();
  return 0;
}

}  // namespace ds::gw
