// Stop-string detection over streamed text.
//
// The detokenizer produces text in deltas; a stop string may straddle deltas. StopMatcher holds
// back the longest suffix of the not-yet-emitted text that is a proper prefix of some stop string
// (it might still become a match) and any incomplete trailing UTF-8 sequence (so emitted text
// always ends on a code point boundary for valid input). On a match, the text before the
// earliest match is emitted, the stop string itself is not, and everything after is dropped;
// when two stop strings match at the same position, the one listed first wins. Finish() flushes
// the held-back text when generation ends for another reason. Matching is byte-wise.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace ds::sampling {

struct StopMatch {
  std::string text;      // safe to emit now
  bool stopped = false;  // a stop string matched (now or earlier); nothing more will be emitted
  int stop_index = -1;   // index into the stop strings of the match, -1 when not stopped
};

class StopMatcher {
 public:
  // Empty stop strings are ignored (Validate rejects them).
  explicit StopMatcher(std::vector<std::string> stop_strings);

  StopMatch Push(std::string_view delta);
  // Emits whatever was held back (even a partial UTF-8 sequence); after a stop, emits nothing.
  StopMatch Finish();

  bool stopped() const { return stop_index_ >= 0; }
  size_t held_bytes() const { return pending_.size(); }

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string pending_;  // text received but not emitted yet
  int stop_index_ = -1;
};

// Start of an incomplete UTF-8 sequence at the end of `s` (a lead byte followed by fewer
// continuation bytes than it announces), or s.size() if the text ends on a boundary.
size_t IncompleteUtf8Tail(std::string_view s);

}  // namespace ds::sampling
