// The systemd watchdog (WatchdogSec=) fed from the loops that matter, not from a timer: each
// role registers its main loops; a monitor thread pings WATCHDOG=1 every interval/2 only while
// every loop is alive. A hung loop stops the pings, systemd kills the service (SIGABRT, a core
// for the post-mortem) and Restart=on-failure starts it again.
//
// Two kinds of loop:
//   periodic   - wakes at least every `max_silence` (it must bound its waits) and calls Beat();
//                dead when no Beat() for longer than max_silence.
//   bounded    - blocks idle for as long as it likes (waiting for work is healthy) but each unit of
//                work (a forward pass) must finish within max_silence: Busy()/Idle() (or a
//                Loop::Work scope) around it; dead when busy longer than that.
//
// Outside systemd (no $WATCHDOG_USEC for this pid) FromEnvironment() returns a disabled watchdog:
// Register() still returns handles, their calls are a relaxed atomic store each.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ds::sd {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  class Loop {
   public:
    void Beat() { last_beat_ns_.store(Now(), std::memory_order_relaxed); }
    void Busy() { busy_since_ns_.store(Now(), std::memory_order_relaxed); }
    void Idle() { busy_since_ns_.store(0, std::memory_order_relaxed); }
    // RAII Busy/Idle around one unit of work.
    class Work {
     public:
      explicit Work(Loop* l) : l_(l) {
        if (l_) l_->Busy();
      }
      ~Work() {
        if (l_) l_->Idle();
      }
      Work(const Work&) = delete;
      Work& operator=(const Work&) = delete;

     private:
      Loop* l_;
    };

    const std::string& name() const { return name_; }
    // Seconds the loop is overdue (0 when alive).
    double OverdueSeconds(Clock::time_point now) const;

   private:
    friend class Watchdog;
    enum class Kind { kPeriodic, kBounded };
    Loop(std::string name, Kind kind, std::chrono::nanoseconds max_silence);
    static int64_t Now() { return Clock::now().time_since_epoch().count(); }

    std::string name_;
    Kind kind_;
    std::chrono::nanoseconds max_silence_;
    std::atomic<int64_t> last_beat_ns_;
    std::atomic<int64_t> busy_since_ns_{0};
  };

  // From $WATCHDOG_USEC / $WATCHDOG_PID (sd_watchdog_enabled). Disabled when not set.
  static std::unique_ptr<Watchdog> FromEnvironment();
  // Explicit interval and ping (tests; `ping` defaults to NotifyWatchdog). interval 0 = disabled.
  Watchdog(std::chrono::microseconds interval, std::function<void()> ping);
  ~Watchdog();

  bool enabled() const { return interval_.count() > 0; }
  std::chrono::microseconds interval() const { return interval_; }

  std::shared_ptr<Loop> RegisterPeriodic(std::string name, std::chrono::nanoseconds max_silence);
  std::shared_ptr<Loop> RegisterBounded(std::string name, std::chrono::nanoseconds max_work);

  // Starts the monitor thread (no-op when disabled). Loops registered later are watched too.
  void Start();
  void Stop();

  // One check: true (and a ping) when every loop is alive. The monitor calls it every interval/2;
  // `on_stall` (logging) is told about each dead loop once per stall.
  bool CheckAndPing();
  void SetStallCallback(std::function<void(const std::string& loop, double overdue_s)> cb);

 private:
  void Run();

  std::chrono::microseconds interval_;
  std::function<void()> ping_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::shared_ptr<Loop>> loops_;
  std::vector<std::string> stalled_;  // reported already
  std::function<void(const std::string&, double)> on_stall_;
  std::thread thread_;
};

}  // namespace ds::sd
