// The two kinds of queue between the daemon's threads (scheduler/daemon/README.md):
//  - CommandQueue<T>: many producers (gRPC threads) -> the one loop thread;
//  - EventChannel: the loop thread -> one Submit handler (one channel per call).
// Plain C++ structs only; protobuf types never cross them.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/core/types.h"

namespace ds::sched {

template <typename T>
class CommandQueue {
 public:
  void Push(T cmd) {
    {
      std::lock_guard<std::mutex> l(mu_);
      items_.push_back(std::move(cmd));
    }
    cv_.notify_one();
  }
  // Moves every queued command into `out` (cleared first); waits until at least one is queued or
  // `until` passes (time_point::max() = wait forever). Returns false on timeout.
  template <typename TimePoint>
  bool PopAll(std::vector<T>* out, TimePoint until) {
    out->clear();
    std::unique_lock<std::mutex> l(mu_);
    if (until == TimePoint::max()) {
      cv_.wait(l, [&] { return !items_.empty(); });
    } else if (!cv_.wait_until(l, until, [&] { return !items_.empty(); })) {
      return false;
    }
    out->swap(items_);
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<T> items_;
};

// A token's logprobs as the worker reported them (the chosen token and the top alternatives).
struct TokenLogprobInfo {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

// One item for a Submit handler: the request was refused (reject not OK), or an event.
struct RequestEventItem {
  absl::Status reject;              // not OK: Add failed; nothing else follows
  Event event;                      // when reject is OK
  std::optional<TokenLogprobInfo> logprob;  // kToken with logprobs requested
  bool unavailable = false;         // kFinished because the worker was lost (retryable)
};

class EventChannel {
 public:
  void Push(RequestEventItem item) {
    {
      std::lock_guard<std::mutex> l(mu_);
      items_.push_back(std::move(item));
    }
    cv_.notify_one();
  }
  // Next item, or nullopt after `timeout` (the handler polls for client cancellation meanwhile).
  std::optional<RequestEventItem> Pop(std::chrono::microseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, timeout, [&] { return !items_.empty(); })) return std::nullopt;
    RequestEventItem it = std::move(items_.front());
    items_.pop_front();
    return it;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEventItem> items_;
};

}  // namespace ds::sched
