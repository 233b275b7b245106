#include "common/sampling/stop_matcher.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/sampling/rng.h"

namespace ds::sampling {
namespace {

// Feeds deltas, returns everything emitted (including Finish) and the final match.
struct FeedResult {
  std::string emitted;
  bool stopped = false;
  int stop_index = -1;
};
FeedResult Feed(const std::vector<std::string>& stops, const std::vector<std::string>& deltas) {
  StopMatcher m(stops);
  FeedResult r;
  for (const std::string& d : deltas) {
    StopMatch s = m.Push(d);
    r.emitted += s.text;
    if (s.stopped) {
      r.stopped = true;
      r.stop_index = s.stop_index;
    }
  }
  StopMatch f = m.Finish();
  r.emitted += f.text;
  if (f.stopped) {
    EXPECT_TRUE(r.stopped);
  }
  return r;
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("hello").text, "hello");
  EXPECT_EQ(m.Push(" world").text, " world");
  EXPECT_EQ(m.Finish().text, "");
}

TEST(StopMatcher, MatchInsideOneDeltaTruncates) {
  StopMatcher m({"STOP"});
  StopMatch s = m.Push("abcSTOPdef");
  EXPECT_EQ(s.text, "abc");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.stop_index, 0);
  // Nothing after a stop.
  StopMatch t = m.Push("more");
  EXPECT_EQ(t.text, "");
  EXPECT_TRUE(t.stopped);
  EXPECT_EQ(m.Finish().text, "");
}

TEST(StopMatcher, HoldsBackPossiblePrefixAndReleasesIt) {
  StopMatcher m({"</end>"});
  StopMatch a = m.Push("text </e");
  EXPECT_EQ(a.text, "text ");  // "</e" might become "</end>"
  EXPECT_FALSE(a.stopped);
  EXPECT_EQ(m.held_bytes(), 3u);
  StopMatch b = m.Push("x> rest");
  EXPECT_EQ(b.text, "</ex> rest");  // diverged: released
  StopMatch c = m.Push("<");
  EXPECT_EQ(c.text, "");
  EXPECT_EQ(m.Finish().text, "<");  // flushed at the end
}

TEST(StopMatcher, StopSplitAcrossManyDeltas) {
  const FeedResult r = Feed({"###"}, {"answer #", "#", "# tail"});
  EXPECT_EQ(r.emitted, "answer ");
  EXPECT_TRUE(r.stopped);
}

TEST(StopMatcher, OverlappingPrefixes) {
  // "aab" after "aaab": the held "aa" must be re-examined from its second byte.
  FeedResult r = Feed({"aab"}, {"xa", "a", "a", "by"});
  EXPECT_EQ(r.emitted, "xa");
  EXPECT_TRUE(r.stopped);
  // Self-overlapping stop "abab" in "abaabab".
  r = Feed({"abab"}, {"aba", "aba", "b!"});
  EXPECT_EQ(r.emitted, "aba");  // "aba" + "abab" + "!"
  EXPECT_TRUE(r.stopped);
  // One stop is a prefix of another; the earliest match wins, ties go to the first listed.
  r = Feed({"ab", "abc"}, {"xab", "c"});
  EXPECT_EQ(r.emitted, "x");
  EXPECT_EQ(r.stop_index, 0);
  r = Feed({"bc", "abc"}, {"xa", "bc"});
  EXPECT_EQ(r.emitted, "x");  // "abc" starts earlier than "bc"
  EXPECT_EQ(r.stop_index, 1);
}

TEST(StopMatcher, NoMatchReleasesEverything) {
  const FeedResult r = Feed({"STOP", "END"}, {"ST", "OPEN", " E", "N", "D?"});
  // "STOPEN" contains STOP: stop there.
  EXPECT_EQ(r.emitted, "");
  EXPECT_TRUE(r.stopped);
  const FeedResult q = Feed({"STOP", "END"}, {"ST", "ARTS", " E", "NDING"});
  EXPECT_EQ(q.emitted, "STARTS ");
  EXPECT_EQ(q.stop_index, 1);
  const FeedResult z = Feed({"STOP"}, {"S", "T", "O", "p"});
  EXPECT_EQ(z.emitted, "STOp");
  EXPECT_FALSE(z.stopped);
}

TEST(StopMatcher, MultiByteUtf8) {
  // "日本" = E6 97 A5 E6 9C AC. Deltas split inside code points.
  const std::string text = "今日は日本語";
  const std::vector<std::string> bytes = [&] {
    std::vector<std::string> v;
    for (char c : text) v.push_back(std::string(1, c));
    return v;
  }();
  FeedResult r = Feed({"日本"}, bytes);
  EXPECT_EQ(r.emitted, "今日は");
  EXPECT_TRUE(r.stopped);
  // A stop sharing a lead byte sequence with the text ("日" starts both "日は" and "日本").
  StopMatcher m({"日本"});
  std::string out;
  for (size_t i = 0; i < 4; ++i) {  // "今" + first byte of "日"
    StopMatch s = m.Push(bytes[i]);
    out += s.text;
    // Never emit a partial code point.
    EXPECT_EQ(IncompleteUtf8Tail(out), out.size()) << i;
  }
  EXPECT_EQ(out, "今");
  // Partial code points without any stop strings are still held until complete.
  StopMatcher n({});
  EXPECT_EQ(n.Push("\xF0\x9F").text, "");
  EXPECT_EQ(n.Push("\x98").text, "");
  EXPECT_EQ(n.Push("\x80!").text, "\xF0\x9F\x98\x80!");
  EXPECT_EQ(n.Push("\xE6").text, "");
  EXPECT_EQ(n.Finish().text, "\xE6");  // flushed as is at the end
}

TEST(StopMatcher, RandomSplitsAgreeWithWholeStringSearch) {
  // Property: for any split of the text into deltas, emitted text equals the text before the
  // earliest stop (or the whole text), and the reported stop index agrees.
  const std::vector<std::string> stops = {"<|im_end|>", "\n\nUser:", "ééé", "aaa"};
  const std::vector<std::string> pieces = {"a",     "é", "<|",   "im_", "end|>", "\n",
                                           "User:", "x", "<|im", "aa",  "ée",    " "};
  Rng rng(77);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    const int n_pieces = 1 + static_cast<int>(rng.Next() % 12);
    for (int i = 0; i < n_pieces; ++i) text += pieces[rng.Next() % pieces.size()];
    size_t best = std::string::npos;
    int best_i = -1;
    for (size_t i = 0; i < stops.size(); ++i) {
      const size_t pos = text.find(stops[i]);
      if (pos < best) {
        best = pos;
        best_i = static_cast<int>(i);
      }
    }
    std::vector<std::string> deltas;
    for (size_t i = 0; i < text.size();) {
      const size_t len = 1 + rng.Next() % 5;
      deltas.push_back(text.substr(i, len));
      i += len;
    }
    const FeedResult r = Feed(stops, deltas);
    ASSERT_EQ(r.emitted, best == std::string::npos ? text : text.substr(0, best)) << text;
    ASSERT_EQ(r.stop_index, best_i) << text;
  }
}

}  // namespace
}  // namespace ds::sampling
