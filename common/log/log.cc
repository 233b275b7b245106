#include "common/log/log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <vector>

#include "absl/strings/ascii.h"

namespace ds::log {
namespace {

struct State {
  std::mutex mu;  // guards the sink and serializes writes
  std::string component = "deltaserve";
  std::string static_fields;  // pre-formatted " k=v ..." of Init()
  std::function<void(std::string_view)> sink;
  bool journal = false;  // stderr is a journald stream: prefix lines with <priority>
};

State& S() {
  static State* s = new State();  // never destroyed: threads may log during exit
  return *s;
}

std::atomic<int> g_min_level{static_cast<int>(Level::kInfo)};

// journald strips a leading "<N>" from stream lines and uses N as the syslog priority
// (SyslogLevelPrefix=yes, the default), so warnings and errors keep their priority in the journal.
bool StderrIsJournal() {
  const char* js = std::getenv("JOURNAL_STREAM");
  if (!js) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(js, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st;
  if (fstat(STDERR_FILENO, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == dev &&
         static_cast<unsigned long long>(st.st_ino) == ino;
}

int SyslogPriority(Level l) {
  switch (l) {
    case Level::kDebug:
      return 7;
    case Level::kInfo:
      return 6;
    case Level::kWarning:
      return 4;
    case Level::kError:
      return 3;
  }
  return 6;
}

bool NeedsQuotes(std::string_view v) {
  if (v.empty()) return true;
  for (unsigned char c : v)
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f) return true;
  return false;
}

void AppendKey(std::string* out, std::string_view key) {
  if (key.empty()) {
    out->append("_");
    return;
  }
  for (char c : key)
    out->push_back(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ||
                           c == '-'
                       ? c
                       : '_');
}

void AppendValue(std::string* out, std::string_view v) {
  if (!NeedsQuotes(v)) {
    out->append(v);
    return;
  }
  out->push_back('"');
  for (unsigned char c : v) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", c);
          out->append(buf);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void AppendTime(std::string* out, std::chrono::system_clock::time_point t) {
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  const time_t secs = static_cast<time_t>(us / 1000000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06" PRId64 "Z", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int64_t>(us % 1000000));
  out->append(buf);
}

void WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere to report a failing stderr
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

Field::Field(std::string_view k, double v) : key(k) {
  char buf[32];
  // %.6g keeps latencies readable (0.000123) and round-trips the digits that matter.
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  value = buf;
}

const char* LevelName(Level l) {
  switch (l) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarning:
      return "warning";
    case Level::kError:
      return "error";
  }
  return "info";
}

bool ParseLevel(std::string_view s, Level* out) {
  const std::string v = absl::AsciiStrToLower(std::string(s));
  if (v == "debug")
    *out = Level::kDebug;
  else if (v == "info")
    *out = Level::kInfo;
  else if (v == "warning" || v == "warn")
    *out = Level::kWarning;
  else if (v == "error")
    *out = Level::kError;
  else
    return false;
  return true;
}

void Init(std::string_view component, std::initializer_list<Field> fields) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  s.component = std::string(component);
  s.static_fields.clear();
  for (const Field& f : fields) AppendField(&s.static_fields, f.key, f.value);
  s.journal = StderrIsJournal();
}

void SetMinLevel(Level l) { g_min_level.store(static_cast<int>(l), std::memory_order_relaxed); }

void SetMinLevelFromEnv() {
  const char* v = std::getenv("DS_LOG_LEVEL");
  if (!v || !*v) return;
  Level l;
  if (ParseLevel(v, &l)) {
    SetMinLevel(l);
  } else {
    Emit(Level::kWarning, "bad_log_level",
         {{"DS_LOG_LEVEL", v}, {"expected", "debug|info|warning|error"}});
  }
}

bool Enabled(Level l) { return static_cast<int>(l) >= g_min_level.load(std::memory_order_relaxed); }

void AppendField(std::string* out, std::string_view key, std::string_view value) {
  out->push_back(' ');
  AppendKey(out, key);
  out->push_back('=');
  AppendValue(out, value);
}

std::string FormatLine(std::chrono::system_clock::time_point t, Level l, std::string_view component,
                       std::string_view event, std::initializer_list<Field> fields) {
  std::string line;
  line.reserve(160);
  line.append("ts=");
  AppendTime(&line, t);
  AppendField(&line, "level", LevelName(l));
  AppendField(&line, "component", component);
  AppendField(&line, "event", event);
  for (const Field& f : fields) AppendField(&line, f.key, f.value);
  return line;
}

void Emit(Level l, std::string_view event, std::initializer_list<Field> fields) {
  if (!Enabled(l)) return;
  State& s = S();
  const auto now = std::chrono::system_clock::now();
  std::string component, statics;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    component = s.component;
    statics = s.static_fields;
  }
  std::string line = FormatLine(now, l, component, event, {});
  line.append(statics);
  for (const Field& f : fields) AppendField(&line, f.key, f.value);

  std::lock_guard<std::mutex> lock(s.mu);
  if (s.sink) {
    s.sink(line);
    return;
  }
  if (s.journal) line.insert(0, absl::StrCat("<", SyslogPriority(l), ">"));
  line.push_back('\n');
  WriteAll(STDERR_FILENO, line.data(), line.size());
}

void SetSinkForTesting(std::function<void(std::string_view line)> sink) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  s.sink = std::move(sink);
}

}  // namespace ds::log
