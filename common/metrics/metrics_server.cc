#include "common/metrics/metrics_server.h"

#include <httplib.h>
#include <prometheus/collectable.h>
#include <prometheus/gauge.h>
#include <prometheus/text_serializer.h>

#include <ctime>
#include <exception>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ds::metrics {

// The exposer collects from this wrapper: hooks first, then the registry, under one lock so two
// concurrent scrapes never interleave hook updates.
class MetricsServer::HookedRegistry : public prometheus::Collectable {
 public:
  explicit HookedRegistry(std::shared_ptr<prometheus::Registry> r) : registry_(std::move(r)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& h : hooks_) h();
    return registry_->Collect();
  }

  void AddHook(std::function<void()> fn) {
    std::lock_guard<std::mutex> l(mu_);
    hooks_.push_back(std::move(fn));
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  mutable std::mutex mu_;
  std::vector<std::function<void()>> hooks_;
};

MetricsServer::MetricsServer() : registry_(std::make_shared<prometheus::Registry>()) {
  collectable_ = std::make_shared<HookedRegistry>(registry_);
}

// /metrics over cpp-httplib rather than prometheus-cpp's civetweb exposer: civetweb starts its
// threads with a fixed ~100 KB stack, and once libcublasLt (large static TLS) is linked into the
// process glibc refuses such threads (pthread_create EINVAL), so a CUDA build could not export
// metrics ("null context when constructing CivetServer"; seen 2026-11-29, Debian civetweb 1.15,
// CUDA 13.0). httplib's std::threads get the default stack.
struct MetricsServer::Http {
  httplib::Server server;
  std::thread thread;
  ~Http() {
    server.stop();
    if (thread.joinable()) thread.join();
  }
};

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                    const std::string& component) {
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  prometheus::BuildGauge()
      .Name("deltaserve_build_info")
      .Help("Always 1; labels identify the component of this process")
      .Register(*s->registry_)
      .Add({{"component", component}})
      .Set(1);
  prometheus::BuildGauge()
      .Name("deltaserve_start_time_seconds")
      .Help("Unix time this process started (restarts show as changes)")
      .Register(*s->registry_)
      .Add({})
      .Set(static_cast<double>(std::time(nullptr)));
  if (listen.empty()) return s;
  if (listen.rfind(':') == std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("metrics listen address '", listen, "' is not HOST:PORT"));
  std::string host = listen.substr(0, listen.rfind(':'));
  const std::string port_s = listen.substr(listen.rfind(':') + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = -1;
  if (port_s.empty() || port_s.size() > 5 || port_s.find_first_not_of("0123456789") != std::string::npos ||
      (port = std::stoi(port_s)) > 65535)
    return absl::InvalidArgumentError(absl::StrCat("metrics listen address '", listen, "': bad port"));
  auto http = std::make_unique<Http>();
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second process
  // bind the same metrics port silently instead of failing with a clear error.
  http->server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
  });
  HookedRegistry* reg = s->collectable_.get();
  http->server.Get("/metrics", [reg](const httplib::Request&, httplib::Response& res) {
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, reg->Collect());
    res.set_content(out.str(), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (port == 0) {
    port = http->server.bind_to_any_port(host);
    if (port <= 0) return absl::UnavailableError("cannot serve metrics on " + listen + ": bind failed");
  } else if (!http->server.bind_to_port(host, port)) {
    return absl::UnavailableError("cannot serve metrics on " + listen + ": bind failed");
  }
  httplib::Server* srv = &http->server;
  http->thread = std::thread([srv] { srv->listen_after_bind(); });
  s->http_ = std::move(http);
  s->port_ = port;
  return s;
}

void MetricsServer::AddCollectHook(std::function<void()> fn) {
  collectable_->AddHook(std::move(fn));
}

std::string MetricsServer::Scrape() {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, collectable_->Collect());
  return out.str();
}

absl::Status CheckMetricName(const std::string& name, bool is_counter, bool is_histogram) {
  if (!absl::StartsWith(name, "deltaserve_"))
    return absl::InvalidArgumentError(name + ": missing the deltaserve_ prefix");
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
      return absl::InvalidArgumentError(name + ": only [a-z0-9_] allowed");
  if (is_counter != absl::EndsWith(name, "_total"))
    return absl::InvalidArgumentError(
        name + (is_counter ? ": counters end in _total" : ": only counters end in _total"));
  if (is_histogram) {
    static const char* kUnits[] = {"_seconds", "_bytes", "_tokens", "_sequences", "_ratio"};
    bool ok = false;
    for (const char* u : kUnits) ok |= absl::EndsWith(name, u);
    if (!ok) return absl::InvalidArgumentError(name + ": histogram without a unit suffix");
  }
  for (const char* bad :
       {"_milliseconds", "_ms", "_us", "_microseconds", "_kb", "_mb", "_mib", "_gib", "_percent"})
    if (absl::EndsWith(name, bad) || absl::StrContains(name, std::string(bad) + "_"))
      return absl::InvalidArgumentError(name + ": use base units (seconds, bytes, ratio)");
  return absl::OkStatus();
}

}  // namespace ds::metrics
