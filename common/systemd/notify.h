// systemd service notifications (sd_notify from libsystemd) for Type=notify units: READY once a
// role can do its job (the worker: after warmup), STATUS lines, STOPPING at shutdown, and start
// timeout extensions while a large model loads. Every call is a no-op outside systemd (no
// $NOTIFY_SOCKET), so the same binary runs under `deltaserve serve`, in tests and in a terminal.
#pragma once
#include <chrono>
#include <string_view>

namespace ds::sd {

// True when $NOTIFY_SOCKET is set (the process runs as a Type=notify service).
bool UnderSystemd();

// READY=1 (+ STATUS=status when given).
void NotifyReady(std::string_view status = {});
void NotifyStatus(std::string_view status);
// STOPPING=1 (+ STATUS): graceful stop begins.
void NotifyStopping(std::string_view status = {});
// EXTEND_TIMEOUT_USEC: "still starting, give me this much more" (model load, warmup).
void NotifyExtendTimeout(std::chrono::microseconds more);
// WATCHDOG=1. Call through Watchdog (watchdog.h), which only pings while every loop is alive.
void NotifyWatchdog();

}  // namespace ds::sd
