// Health that does not lie: the gateway reports SERVING (grpc.health.v1, service "" and
// "deltaserve.v1.Generation") only while the scheduler answers and says serving=true, i.e. a
// worker completed its warmup, and is not drained (Admin Drain). Polled every `interval`; an
// unreachable scheduler, a lost worker or a drain flips it to NOT_SERVING at the next poll (a
// Drain through this gateway's Admin listener at once).
#pragma once
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "common/systemd/watchdog.h"
#include "gateway/scheduler_client.h"

namespace ds::gw {

class HealthMonitor {
 public:
  HealthMonitor(SchedulerClient* scheduler, std::chrono::milliseconds interval);
  ~HealthMonitor();

  // Servers whose health service mirrors the cluster state (set NOT_SERVING right away).
  void Attach(grpc::Server* server);
  void Start();
  void Stop();

  bool serving() const { return serving_.load(std::memory_order_acquire); }
  // Graceful stop: NOT_SERVING from now on, whatever the scheduler says (load balancers stop
  // sending before the listeners close).
  void SetDraining();
  // Beaten after every poll (systemd watchdog; common/systemd/watchdog.h).
  void SetWatchdogLoop(std::shared_ptr<sd::Watchdog::Loop> loop);
  ClusterView view() const;
  // Polls once now (at startup, after an Admin Drain, and by tests of the monitor).
  void PollOnce();

 private:
  void Run();
  void Publish(bool serving);

  SchedulerClient* scheduler_;
  std::chrono::milliseconds interval_;
  std::atomic<bool> serving_{false};
  std::atomic<bool> draining_{false};
  std::shared_ptr<sd::Watchdog::Loop> watchdog_;
  std::mutex poll_mu_;  // serializes PollOnce (taken before mu_)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool published_ = false;
  ClusterView view_;
  std::vector<grpc::Server*> servers_;
  std::thread thread_;
};

}  // namespace ds::gw
