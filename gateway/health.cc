#include "gateway/health.h"

#include <cstdio>

#include "common/log/log.h"

namespace ds::gw {

HealthMonitor::HealthMonitor(SchedulerClient* scheduler, std::chrono::milliseconds interval)
    : scheduler_(scheduler), interval_(interval) {}

HealthMonitor::~HealthMonitor() { Stop(); }

void HealthMonitor::Attach(grpc::Server* server) {
  std::lock_guard<std::mutex> l(mu_);
  servers_.push_back(server);
  // grpc++'s default health service starts at SERVING for "": correct it before anyone asks twice.
  if (auto* h = server->GetHealthCheckService()) {
    h->SetServingStatus(serving_.load());
    h->SetServingStatus("deltaserve.v1.Generation", serving_.load());
  }
}

void HealthMonitor::Start() {
  thread_ = std::thread([this] { Run(); });
}

void HealthMonitor::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

ClusterView HealthMonitor::view() const {
  std::lock_guard<std::mutex> l(mu_);
  return view_;
}

void HealthMonitor::SetDraining() {
  draining_.store(true, std::memory_order_release);
  Publish(false);
}

void HealthMonitor::SetWatchdogLoop(std::shared_ptr<sd::Watchdog::Loop> loop) {
  std::lock_guard<std::mutex> l(mu_);
  watchdog_ = std::move(loop);
}

void HealthMonitor::Publish(bool serving) {
  serving = serving && !draining_.load(std::memory_order_acquire);
  std::lock_guard<std::mutex> l(mu_);
  const bool changed = !published_ || serving_.load() != serving;
  serving_.store(serving, std::memory_order_release);
  published_ = true;
  if (!changed) return;
  for (grpc::Server* s : servers_) {
    if (auto* h = s->GetHealthCheckService()) {
      h->SetServingStatus(serving);
      h->SetServingStatus("deltaserve.v1.Generation", serving);
    }
  }
  DS_LOG(INFO, "health", {{"status", serving ? "SERVING" : "NOT_SERVING"},
                          {"draining", draining_.load()}});
}

void HealthMonitor::PollOnce() {
  // One poll at a time (the thread's and the one after an Admin Drain): an older answer must
  // never be published after a newer one.
  std::lock_guard<std::mutex> poll(poll_mu_);
  // A poll slower than the interval counts as unreachable: health must not lag the cluster.
  absl::StatusOr<ClusterView> v =
      scheduler_->Poll(std::max(interval_, std::chrono::milliseconds(300)));
  if (v.ok()) {
    {
      std::lock_guard<std::mutex> l(mu_);
      view_ = *v;
    }
    // A drained scheduler refuses new requests: load balancers must stop sending them here.
    Publish(v->serving && !v->draining);
  } else {
    {
      std::lock_guard<std::mutex> l(mu_);
      view_.reachable = false;
      view_.serving = false;  // slot_context kept: still the best estimate for validation
    }
    Publish(false);
  }
}

void HealthMonitor::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    l.unlock();
    PollOnce();
    l.lock();
    if (watchdog_) watchdog_->Beat();
    cv_.wait_for(l, interval_, [this] { return stop_; });
  }
}

}  // namespace ds::gw
