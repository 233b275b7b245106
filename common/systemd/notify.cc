#include "common/systemd/notify.h"

#include <systemd/sd-daemon.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace ds::sd {
namespace {

void Send(const std::string& msg) {
  // unset_environment = 0: children started later (none today) could still notify, and tests can
  // call several times. Errors are ignored: a notification is advisory.
  sd_notify(0, msg.c_str());
}

}  // namespace

bool UnderSystemd() {
  const char* s = std::getenv("NOTIFY_SOCKET");
  return s && *s;
}

void NotifyReady(std::string_view status) {
  if (!UnderSystemd()) return;
  Send(status.empty() ? std::string("READY=1") : "READY=1\nSTATUS=" + std::string(status));
}

void NotifyStatus(std::string_view status) {
  if (!UnderSystemd()) return;
  Send("STATUS=" + std::string(status));
}

void NotifyStopping(std::string_view status) {
  if (!UnderSystemd()) return;
  Send(status.empty() ? std::string("STOPPING=1") : "STOPPING=1\nSTATUS=" + std::string(status));
}

void NotifyExtendTimeout(std::chrono::microseconds more) {
  if (!UnderSystemd()) return;
  Send(absl::StrCat("EXTEND_TIMEOUT_USEC=", more.count()));
}

void NotifyWatchdog() {
  if (!UnderSystemd()) return;
  Send("WATCHDOG=1");
}

}  // namespace ds::sd
