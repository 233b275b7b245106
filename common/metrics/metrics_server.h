// One Prometheus registry per process plus its /metrics endpoint (prometheus-cpp registry and
// text format, served over cpp-httplib).
//
// Every metric deltaserve exports is defined in one place per component (gateway_metrics.h,
// scheduler_metrics.h, worker_metrics.h); those structs register their families on this server's
// registry. Names follow monitoring/README.md: prefix `deltaserve_`, base units in the name,
// `_total` for counters, small closed label sets (label values are created up front so every
// series exists from the first scrape).
#pragma once
#include <prometheus/registry.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/util/status.h"

namespace ds::metrics {

class MetricsServer {
 public:
  // Serves /metrics on `listen` ("127.0.0.1:9400", "[::1]:9400", port 0 = any free port).
  // An empty `listen` creates the registry only (metrics are kept but not served), which the
  // components use when metrics are switched off and tests use to read values directly.
  // `component` (gateway|scheduler|worker) labels deltaserve_build_info.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                              const std::string& component);
  ~MetricsServer();

  prometheus::Registry& registry() { return *registry_; }
  // The bound port (useful with port 0); 0 when not serving.
  int port() const { return port_; }

  // `fn` runs on the scrape thread before every collection: for values derived from state that
  // changes without an event (ages, sampled devices). Must be thread-safe and quick.
  void AddCollectHook(std::function<void()> fn);

  // The text exposition the endpoint would serve now (tests, `deltactl`-style debugging).
  std::string Scrape();

 private:
  class HookedRegistry;
  struct Http;
  MetricsServer();

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<HookedRegistry> collectable_;
  std::unique_ptr<Http> http_;  // declared last: stops serving before the registry goes
  int port_ = 0;
};

// Checks a metric name against the conventions (prefix, charset, `_total` only on counters,
// a base unit suffix on histograms). Used by the tests over every registered family.
absl::Status CheckMetricName(const std::string& name, bool is_counter, bool is_histogram);

}  // namespace ds::metrics
