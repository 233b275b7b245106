// common/log: logfmt formatting, quoting, levels, and whole lines under concurrency.
#include "common/log/log.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ds::log {
namespace {

// Parses one logfmt line back into key -> value (quoted values unescaped).
std::map<std::string, std::string> ParseLogfmt(std::string_view line, bool* ok) {
  std::map<std::string, std::string> out;
  *ok = true;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t eq = line.find('=', i);
    if (eq == std::string_view::npos) {
      *ok = false;
      break;
    }
    std::string key(line.substr(i, eq - i));
    i = eq + 1;
    std::string v;
    if (i < line.size() && line[i] == '"') {
      ++i;
      while (i < line.size() && line[i] != '"') {
        if (line[i] == '\\' && i + 1 < line.size()) {
          const char c = line[++i];
          if (c == 'x' && i + 2 < line.size()) {
            v.push_back(
                static_cast<char>(std::stoi(std::string(line.substr(i + 1, 2)), nullptr, 16)));
            i += 2;
          } else {
            v.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c);
          }
        } else {
          v.push_back(line[i]);
        }
        ++i;
      }
      if (i >= line.size()) *ok = false;
      ++i;
    } else {
      while (i < line.size() && line[i] != ' ') v.push_back(line[i++]);
    }
    if (out.count(key)) *ok = false;
    out[key] = v;
  }
  return out;
}

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Init("gateway");
    SetMinLevel(Level::kInfo);
    SetSinkForTesting([this](std::string_view l) {
      std::lock_guard<std::mutex> g(mu_);
      lines_.emplace_back(l);
    });
  }
  void TearDown() override { SetSinkForTesting(nullptr); }
  std::mutex mu_;
  std::vector<std::string> lines_;
};

TEST_F(LogTest, OneLineWithTheDocumentedFieldOrder) {
  const uint64_t id = 42;
  DS_LOG(INFO, "request_finished", {{"request_id", id}, {"reason", "stop"}, {"ttft_s", 0.125}});
  ASSERT_EQ(lines_.size(), 1u);
  const std::string& l = lines_[0];
  EXPECT_EQ(l.rfind("ts=", 0), 0u) << l;
  EXPECT_NE(l.find(" level=info component=gateway event=request_finished request_id=42 "
                   "reason=stop ttft_s=0.125"),
            std::string::npos)
      << l;
  EXPECT_EQ(l.find('\n'), std::string::npos);
  bool ok = false;
  auto kv = ParseLogfmt(l, &ok);
  ASSERT_TRUE(ok) << l;
  // RFC 3339 UTC with microseconds: 2026-11-29T08:05:00.123456Z
  ASSERT_EQ(kv["ts"].size(), 27u) << kv["ts"];
  EXPECT_EQ(kv["ts"][10], 'T');
  EXPECT_EQ(kv["ts"].back(), 'Z');
}

TEST_F(LogTest, QuotesAndEscapesSoEveryLineParsesBack) {
  const std::string nasty = "two words \"quoted\" a=b back\\slash\nnew line\ttab \x01";
  DS_LOG(WARNING, "bad input", {{"detail", nasty}, {"empty", ""}, {"bad key!", 1}});
  ASSERT_EQ(lines_.size(), 1u);
  const std::string& l = lines_[0];
  EXPECT_EQ(l.find('\n'), std::string::npos) << "a value's newline must not split the line";
  bool ok = false;
  auto kv = ParseLogfmt(l, &ok);
  ASSERT_TRUE(ok) << l;
  EXPECT_EQ(kv["level"], "warning");
  EXPECT_EQ(kv["event"], "bad input");
  EXPECT_EQ(kv["detail"], nasty);
  EXPECT_NE(l.find("\\x01"), std::string::npos) << "control bytes are written as \\xNN";
  EXPECT_EQ(kv["empty"], "");
  EXPECT_EQ(kv["bad_key_"], "1");
}

TEST_F(LogTest, TypedValues) {
  DS_LOG(ERROR, "types",
         {{"t", true},
          {"f", false},
          {"neg", -7},
          {"big", uint64_t{18446744073709551615ull}},
          {"dur", std::chrono::milliseconds(1500)},
          {"st", absl::UnavailableError("no worker")}});
  ASSERT_EQ(lines_.size(), 1u);
  bool ok = false;
  auto kv = ParseLogfmt(lines_[0], &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(kv["t"], "true");
  EXPECT_EQ(kv["f"], "false");
  EXPECT_EQ(kv["neg"], "-7");
  EXPECT_EQ(kv["big"], "18446744073709551615");
  EXPECT_EQ(kv["dur"], "1.5");
  EXPECT_EQ(kv["st"], "UNAVAILABLE: no worker");
}

TEST_F(LogTest, LevelsFilterAndSkipFormatting) {
  int evaluated = 0;
  auto expensive = [&] {
    ++evaluated;
    return std::string("x");
  };
  DS_LOG(DEBUG, "hidden", {{"v", expensive()}});
  EXPECT_TRUE(lines_.empty());
  EXPECT_EQ(evaluated, 0) << "fields of a disabled level must not be built";
  SetMinLevel(Level::kDebug);
  DS_LOG(DEBUG, "shown", {{"v", expensive()}});
  EXPECT_EQ(lines_.size(), 1u);
  EXPECT_EQ(evaluated, 1);
  SetMinLevel(Level::kError);
  DS_LOG(WARN, "hidden");
  EXPECT_EQ(lines_.size(), 1u);
  Level l;
  EXPECT_TRUE(ParseLevel("WARN", &l));
  EXPECT_EQ(l, Level::kWarning);
  EXPECT_FALSE(ParseLevel("loud", &l));
}

TEST_F(LogTest, StaticFieldsFollowTheEvent) {
  Init("worker", {{"worker", "host-gpu0"}});
  DS_LOG(INFO, "ready");
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find(" component=worker event=ready worker=host-gpu0"), std::string::npos)
      << lines_[0];
}

TEST(LogStderrTest, ConcurrentLinesNeverInterleave) {
  // Real stderr, redirected to a pipe: 8 threads x 500 lines, each line must arrive whole.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const int saved = dup(2);
  dup2(fds[1], 2);
  close(fds[1]);
  std::string captured;
  std::thread reader([&] {
    char buf[65536];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0) captured.append(buf, static_cast<size_t>(n));
  });
  Init("scheduler");
  SetSinkForTesting(nullptr);
  std::vector<std::thread> ts;
  const std::string pad(300, 'p');  // long lines make torn writes likely if there were any
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) DS_LOG(INFO, "step", {{"thread", t}, {"i", i}, {"pad", pad}});
    });
  for (auto& t : ts) t.join();
  dup2(saved, 2);
  close(saved);
  reader.join();
  close(fds[0]);
  int n = 0;
  size_t start = 0;
  std::map<int, int> next;  // per thread, lines arrive in order
  while (start < captured.size()) {
    const size_t end = captured.find('\n', start);
    ASSERT_NE(end, std::string::npos);
    const std::string line = captured.substr(start, end - start);
    start = end + 1;
    bool ok = false;
    auto kv = ParseLogfmt(line, &ok);
    ASSERT_TRUE(ok) << line;
    ASSERT_EQ(kv["pad"], pad) << line;
    const int t = std::stoi(kv["thread"]);
    ASSERT_EQ(std::stoi(kv["i"]), next[t]++) << line;
    ++n;
  }
  EXPECT_EQ(n, 8 * 500);
}

}  // namespace
}  // namespace ds::log
