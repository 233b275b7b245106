// The waiting queue: requests not yet bound to a slot, ordered by priority (higher first), then by
// order of acceptance (FIFO). Ordered container, not a heap, because Abort removes from the middle
// and Status reports counts per priority.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "scheduler/core/types.h"

namespace ds::sched {

class RequestQueue {
 public:
  struct Key {
    int priority = 0;
    uint64_t seq = 0;  // acceptance order; kept across a Requeue so the request keeps its place
    RequestId id = 0;
    bool operator<(const Key& o) const {
      if (priority != o.priority) return priority > o.priority;
      return seq < o.seq;
    }
  };

  void Push(const Key& k);
  bool Remove(const Key& k);  // false when absent
  bool empty() const { return keys_.empty(); }
  int size() const { return static_cast<int>(keys_.size()); }
  const Key& front() const { return *keys_.begin(); }
  // In admission order.
  std::set<Key>::const_iterator begin() const { return keys_.begin(); }
  std::set<Key>::const_iterator end() const { return keys_.end(); }
  // (priority, count), priority descending.
  std::vector<std::pair<int, int>> CountsByPriority() const;

 private:
  std::set<Key> keys_;
  std::map<int, int, std::greater<int>> counts_;
};

}  // namespace ds::sched
