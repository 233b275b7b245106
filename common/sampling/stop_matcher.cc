#include "common/sampling/stop_matcher.h"

#include <algorithm>

namespace ds::sampling {

size_t IncompleteUtf8Tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t k = 1; k <= std::min<size_t>(4, n); ++k) {
    const unsigned char c = static_cast<unsigned char>(s[n - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > k ? n - k : n;
  }
  return n;  // no lead byte within 4 bytes: invalid, nothing worth holding
}

StopMatcher::StopMatcher(std::vector<std::string> stop_strings) {
  for (std::string& s : stop_strings) {
    max_len_ = std::max(max_len_, s.size());
    stops_.push_back(std::move(s));
  }
}

StopMatch StopMatcher::Push(std::string_view delta) {
  StopMatch out;
  if (stopped()) {
    out.stopped = true;
    out.stop_index = stop_index_;
    return out;
  }
  pending_.append(delta);
  // Emitted text never contains the start of a possible match (it is held back below), so a
  // match can only start inside pending_.
  size_t best_pos = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stops_[i].empty()) continue;
    const size_t pos = pending_.find(stops_[i]);
    if (pos < best_pos) {
      best_pos = pos;
      stop_index_ = static_cast<int>(i);
    }
  }
  if (best_pos != std::string::npos) {
    out.text = pending_.substr(0, best_pos);
    out.stopped = true;
    out.stop_index = stop_index_;
    pending_.clear();
    return out;
  }
  // Longest suffix that is a proper prefix of a stop string (shorter than it: no full match).
  size_t hold_from = pending_.size();
  const size_t first = pending_.size() >= max_len_ ? pending_.size() - max_len_ + 1 : 0;
  for (size_t p = first; p < pending_.size() && hold_from == pending_.size(); ++p) {
    const std::string_view suffix = std::string_view(pending_).substr(p);
    for (const std::string& s : stops_) {
      if (s.size() > suffix.size() && std::string_view(s).starts_with(suffix)) {
        hold_from = p;
        break;
      }
    }
  }
  hold_from = std::min(hold_from, IncompleteUtf8Tail(pending_));
  out.text = pending_.substr(0, hold_from);
  pending_.erase(0, hold_from);
  return out;
}

StopMatch StopMatcher::Finish() {
  StopMatch out;
  if (stopped()) {
    out.stopped = true;
    out.stop_index = stop_index_;
    return out;
  }
  out.text = std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace ds::sampling
