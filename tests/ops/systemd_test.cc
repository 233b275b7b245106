// common/systemd: notifications reach $NOTIFY_SOCKET (a datagram socket of the test, as systemd
// would provide), and the watchdog pings only while every registered loop is alive.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/systemd/notify.h"
#include "common/systemd/watchdog.h"

namespace ds::sd {
namespace {

using namespace std::chrono_literals;

class NotifySocket {
 public:
  NotifySocket() {
    path_ = ::testing::TempDir() + "notify-" + std::to_string(getpid()) + ".sock";
    unlink(path_.c_str());
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path_.c_str());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    timeval tv{0, 300000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  ~NotifySocket() {
    unsetenv("NOTIFY_SOCKET");
    close(fd_);
    unlink(path_.c_str());
  }
  // Next datagram, "" after the receive timeout.
  std::string Next() {
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST(Notify, NoOpsOutsideSystemd) {
  unsetenv("NOTIFY_SOCKET");
  EXPECT_FALSE(UnderSystemd());
  NotifyReady("ready");  // must not crash or block
  NotifyWatchdog();
}

TEST(Notify, MessagesReachTheSocket) {
  NotifySocket s;
  EXPECT_TRUE(UnderSystemd());
  NotifyStatus("loading weights");
  EXPECT_EQ(s.Next(), "STATUS=loading weights");
  NotifyExtendTimeout(90s);
  EXPECT_EQ(s.Next(), "EXTEND_TIMEOUT_USEC=90000000");
  NotifyReady("serving: 4 slots");
  EXPECT_EQ(s.Next(), "READY=1\nSTATUS=serving: 4 slots");
  NotifyStopping();
  EXPECT_EQ(s.Next(), "STOPPING=1");
}

TEST(Watchdog, FromEnvironmentFollowsWatchdogUsecAndPid) {
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  EXPECT_FALSE(Watchdog::FromEnvironment()->enabled());
  setenv("WATCHDOG_USEC", "2000000", 1);
  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  auto w = Watchdog::FromEnvironment();
  EXPECT_TRUE(w->enabled());
  EXPECT_EQ(w->interval(), 2s);
  // Meant for another process (e.g. inherited by a child): disabled.
  setenv("WATCHDOG_PID", std::to_string(getpid() + 1).c_str(), 1);
  EXPECT_FALSE(Watchdog::FromEnvironment()->enabled());
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
}

TEST(Watchdog, PingsStopWhenAPeriodicLoopHangs) {
  NotifySocket s;
  Watchdog w(200ms, nullptr);  // real NotifyWatchdog to the socket, every 100 ms
  std::string stalled;
  w.SetStallCallback([&](const std::string& name, double) { stalled = name; });
  auto loop = w.RegisterPeriodic("scheduler_loop", 150ms);
  std::atomic<bool> hang{false}, stop{false};
  std::thread t([&] {
    while (!stop) {
      if (!hang) loop->Beat();
      std::this_thread::sleep_for(20ms);
    }
  });
  w.Start();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.Next(), "WATCHDOG=1");
  hang = true;
  std::this_thread::sleep_for(300ms);  // > max_silence + one check period
  while (!s.Next().empty()) {
  }  // drain pings sent before the hang was noticed
  EXPECT_EQ(s.Next(), "") << "a hung loop must stop the pings";
  EXPECT_EQ(stalled, "scheduler_loop");
  hang = false;
  EXPECT_EQ(s.Next(), "WATCHDOG=1") << "pings resume once the loop runs again";
  stop = true;
  t.join();
  w.Stop();
}

TEST(Watchdog, BoundedLoopsMayIdleForeverButNotWorkForever) {
  std::atomic<int> pings{0};
  Watchdog w(100ms, [&] { ++pings; });
  auto loop = w.RegisterBounded("worker_step", 50ms);
  std::this_thread::sleep_for(80ms);
  EXPECT_TRUE(w.CheckAndPing()) << "idle (blocked waiting for work) is alive";
  {
    Watchdog::Loop::Work work(loop.get());
    EXPECT_TRUE(w.CheckAndPing());
    std::this_thread::sleep_for(80ms);
    EXPECT_FALSE(w.CheckAndPing()) << "a step running past its bound is a hang";
    EXPECT_GT(loop->OverdueSeconds(Watchdog::Clock::now()), 0.0);
  }
  EXPECT_TRUE(w.CheckAndPing());
  EXPECT_EQ(pings.load(), 3);
}

TEST(Watchdog, DisabledWatchdogNeverStartsAThread) {
  Watchdog w(0us, [] { FAIL() << "a disabled watchdog must not ping"; });
  auto l = w.RegisterPeriodic("x", 1ms);
  w.Start();
  l->Beat();
  EXPECT_FALSE(w.enabled());
  w.Stop();
}

}  // namespace
}  // namespace ds::sd
