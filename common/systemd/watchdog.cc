#include "common/systemd/watchdog.h"

#include <systemd/sd-daemon.h>

#include <algorithm>

#include "common/systemd/notify.h"

namespace ds::sd {

Watchdog::Loop::Loop(std::string name, Kind kind, std::chrono::nanoseconds max_silence)
    : name_(std::move(name)), kind_(kind), max_silence_(max_silence), last_beat_ns_(Now()) {}

double Watchdog::Loop::OverdueSeconds(Clock::time_point now) const {
  const int64_t now_ns = now.time_since_epoch().count();
  int64_t since = 0;
  if (kind_ == Kind::kPeriodic) {
    since = last_beat_ns_.load(std::memory_order_relaxed);
  } else {
    since = busy_since_ns_.load(std::memory_order_relaxed);
    if (since == 0) return 0;  // idle: waiting for work is healthy
  }
  const int64_t over = now_ns - since - max_silence_.count();
  return over > 0 ? over / 1e9 : 0;
}

std::unique_ptr<Watchdog> Watchdog::FromEnvironment() {
  uint64_t usec = 0;
  // > 0: enabled for this pid. unset_environment = 0 keeps the variables for tests that re-read.
  if (sd_watchdog_enabled(0, &usec) <= 0) usec = 0;
  return std::make_unique<Watchdog>(std::chrono::microseconds(usec), nullptr);
}

Watchdog::Watchdog(std::chrono::microseconds interval, std::function<void()> ping)
    : interval_(interval), ping_(ping ? std::move(ping) : std::function<void()>(NotifyWatchdog)) {}

Watchdog::~Watchdog() { Stop(); }

std::shared_ptr<Watchdog::Loop> Watchdog::RegisterPeriodic(std::string name,
                                                           std::chrono::nanoseconds max_silence) {
  std::shared_ptr<Loop> l(new Loop(std::move(name), Loop::Kind::kPeriodic, max_silence));
  std::lock_guard<std::mutex> g(mu_);
  loops_.push_back(l);
  return l;
}

std::shared_ptr<Watchdog::Loop> Watchdog::RegisterBounded(std::string name,
                                                          std::chrono::nanoseconds max_work) {
  std::shared_ptr<Loop> l(new Loop(std::move(name), Loop::Kind::kBounded, max_work));
  std::lock_guard<std::mutex> g(mu_);
  loops_.push_back(l);
  return l;
}

void Watchdog::SetStallCallback(std::function<void(const std::string&, double)> cb) {
  std::lock_guard<std::mutex> g(mu_);
  on_stall_ = std::move(cb);
}

bool Watchdog::CheckAndPing() {
  const auto now = Clock::now();
  bool alive = true;
  std::vector<std::pair<std::string, double>> newly_stalled;
  std::function<void(const std::string&, double)> on_stall;
  {
    std::lock_guard<std::mutex> g(mu_);
    on_stall = on_stall_;
    std::vector<std::string> stalled;
    for (const auto& l : loops_) {
      const double over = l->OverdueSeconds(now);
      if (over <= 0) continue;
      alive = false;
      stalled.push_back(l->name());
      if (std::find(stalled_.begin(), stalled_.end(), l->name()) == stalled_.end())
        newly_stalled.emplace_back(l->name(), over);
    }
    stalled_ = std::move(stalled);
  }
  if (on_stall)
    for (const auto& [name, over] : newly_stalled) on_stall(name, over);
  if (alive) ping_();
  return alive;
}

void Watchdog::Start() {
  if (!enabled() || thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void Watchdog::Stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Run() {
  // systemd recommends pinging at half the interval; a loop that dies is noticed at the next check
  // and systemd acts at most one interval after the last ping.
  const auto period = interval_ / 2;
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    l.unlock();
    CheckAndPing();
    l.lock();
    cv_.wait_for(l, period, [this] { return stop_; });
  }
}

}  // namespace ds::sd
