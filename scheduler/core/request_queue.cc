#include "scheduler/core/request_queue.h"

namespace ds::sched {

void RequestQueue::Push(const Key& k) {
  if (keys_.insert(k).second) ++counts_[k.priority];
}

bool RequestQueue::Remove(const Key& k) {
  if (keys_.erase(k) == 0) return false;
  auto it = counts_.find(k.priority);
  if (--it->second == 0) counts_.erase(it);
  return true;
}

std::vector<std::pair<int, int>> RequestQueue::CountsByPriority() const {
  return {counts_.begin(), counts_.end()};
}

}  // namespace ds::sched
