// Frees a request's slot as soon as its HTTP client goes away. httplib (Debian 0.11) tells a
// handler neither its socket nor that the peer closed while the handler is blocked waiting for
// the next token, so the gateway finds the connection's socket itself (FindConnectionSocket: the
// one socket of this process with the request's local and remote address) and one thread polls
// all registered sockets every 10 ms with poll(POLLRDHUP): a peer that shut down or reset means
// the client is gone, and the registered callback cancels the internal Submit call, so the
// scheduler aborts the request within one step (the gRPC listener's CancelWatchdog, for HTTP).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace ds::gw::http {

// The socket fd of the TCP connection local_addr:local_port <-> remote_addr:remote_port (numeric
// hosts as httplib reports them); -1 if none.
int FindConnectionSocket(const std::string& local_addr, int local_port,
                         const std::string& remote_addr, int remote_port);

// True when the peer closed or reset the connection (also with bytes still unread).
bool PeerClosed(int fd);

class DisconnectWatch {
 public:
  DisconnectWatch();
  ~DisconnectWatch();
  // Calls `on_gone` once (from the watch thread) when `fd`'s peer closes. Returns a handle.
  uint64_t Add(int fd, std::function<void()> on_gone);
  // After Remove returns, the callback is not running and will not run.
  void Remove(uint64_t handle);

 private:
  void Run();
  struct Entry {
    int fd;
    std::function<void()> on_gone;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t next_ = 1;
  std::map<uint64_t, Entry> entries_;
  std::thread thread_;
};

}  // namespace ds::gw::http
