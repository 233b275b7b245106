// Admission control: a fixed number of permits, taken without blocking. A request that finds none
// free is answered RESOURCE_EXHAUSTED at once (no unbounded queue in the gateway: the scheduler's
// bounded queue is the only place requests wait).
#pragma once
#include <atomic>
#include <cstdint>
#include <optional>

namespace ds::gw {

class Admission {
 public:
  // Held for the life of one request; returns its permit when destroyed.
  class Permit {
   public:
    Permit(Permit&& o) noexcept : owner_(o.owner_) { o.owner_ = nullptr; }
    Permit& operator=(Permit&&) = delete;
    Permit(const Permit&) = delete;
    ~Permit() {
      if (owner_) owner_->in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    }

   private:
    friend class Admission;
    explicit Permit(Admission* owner) : owner_(owner) {}
    Admission* owner_;
  };

  explicit Admission(int capacity) : capacity_(capacity) {}

  // A permit, or nullopt when all `capacity` are taken. Never blocks.
  std::optional<Permit> TryAcquire() {
    int cur = in_flight_.load(std::memory_order_relaxed);
    while (cur < capacity_) {
      if (in_flight_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel))
        return Permit(this);
    }
    return std::nullopt;
  }

  int in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  int capacity() const { return capacity_; }

 private:
  const int capacity_;
  std::atomic<int> in_flight_{0};
};

}  // namespace ds::gw
