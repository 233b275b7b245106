#include "gateway/http/disconnect_watch.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <vector>

namespace ds::gw::http {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(10);

bool AddrIs(const sockaddr_storage& ss, socklen_t len, const std::string& host, int port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, h, sizeof(h), p, sizeof(p),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  return host == h && port == std::atoi(p);
}

}  // namespace

int FindConnectionSocket(const std::string& local_addr, int local_port,
                         const std::string& remote_addr, int remote_port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, self{};
    socklen_t pl = sizeof(peer), sl = sizeof(self);
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (!AddrIs(peer, pl, remote_addr, remote_port)) continue;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
    if (local_port > 0 && !AddrIs(self, sl, local_addr, local_port)) continue;
    found = static_cast<int>(fd);
    break;
  }
  closedir(d);
  return found;
}

bool PeerClosed(int fd) {
  // POLLRDHUP (Linux): the peer shut its side down, even with request bytes still unread here
  // (a pipelined request would otherwise hide the close from a MSG_PEEK).
  pollfd p{fd, POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

DisconnectWatch::DisconnectWatch() : thread_([this] { Run(); }) {}

DisconnectWatch::~DisconnectWatch() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t DisconnectWatch::Add(int fd, std::function<void()> on_gone) {
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t h = next_++;
  entries_[h] = Entry{fd, std::move(on_gone)};
  return h;
}

void DisconnectWatch::Remove(uint64_t handle) {
  // The callback runs under mu_, so once the entry is erased here it cannot be running.
  std::lock_guard<std::mutex> l(mu_);
  entries_.erase(handle);
}

void DisconnectWatch::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, kPoll, [this] { return stop_; });
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (PeerClosed(it->second.fd)) {
        it->second.on_gone();  // cheap: TryCancel on a gRPC context
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

}  // namespace ds::gw::http
