// Structured logs: one logfmt line per event on stderr, which journald (or a terminal) collects.
//
//   DS_LOG(INFO, "request_finished", {{"request_id", id}, {"reason", "stop"}, {"ttft_s", 0.12}});
//   -> ts=2026-11-29T08:05:00.123456Z level=info component=gateway event=request_finished
//      request_id=42 reason=stop ttft_s=0.12
//
// Every line is built in full and written with one write(2) under a mutex, so lines of concurrent
// threads never interleave. Values with spaces, quotes, '=' or control bytes are quoted and
// escaped; keys are restricted to [A-Za-z0-9_.-] so a line always parses back. Fields of a
// disabled level are never formatted.
#pragma once
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ds::log {

enum class Level : uint8_t { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
const char* LevelName(Level l);  // "debug", "info", "warning", "error"
// "debug" | "info" | "warning" (or "warn") | "error"; false for anything else.
bool ParseLevel(std::string_view s, Level* out);

// The spellings DS_LOG takes: DS_LOG(INFO, ...), DS_LOG(WARNING, ...).
namespace severity {
inline constexpr Level DEBUG = Level::kDebug;
inline constexpr Level INFO = Level::kInfo;
inline constexpr Level WARNING = Level::kWarning;
inline constexpr Level WARN = Level::kWarning;
inline constexpr Level ERROR = Level::kError;
}  // namespace severity

// One key=value pair; the value is formatted when the field is built.
struct Field {
  Field(std::string_view k, std::string_view v) : key(k), value(v) {}
  Field(std::string_view k, const char* v) : key(k), value(v ? v : "") {}
  Field(std::string_view k, const std::string& v) : key(k), value(v) {}
  Field(std::string_view k, bool v) : key(k), value(v ? "true" : "false") {}
  template <typename T>
  requires(std::integral<T> && !std::same_as<T, bool> && !std::same_as<T, char>)
      Field(std::string_view k, T v)
      : key(k), value(absl::StrCat(v)) {}
  Field(std::string_view k, double v);
  Field(std::string_view k, float v) : Field(k, static_cast<double>(v)) {}
  // Durations are written in seconds (base unit), like the metrics.
  template <typename Rep, typename Period>
  Field(std::string_view k, std::chrono::duration<Rep, Period> d)
      : Field(k, std::chrono::duration<double>(d).count()) {}
  Field(std::string_view k, const absl::Status& s) : key(k), value(s.ToString()) {}

  std::string_view key;
  std::string value;
};

// Process-wide settings; call once at start (before threads log). `component` is one of gateway,
// scheduler, worker, serve, ...; `fields` are added to every line (e.g. worker=gpu0).
void Init(std::string_view component, std::initializer_list<Field> fields = {});
void SetMinLevel(Level l);
// Reads DS_LOG_LEVEL (debug|info|warning|error); an invalid value is reported once and ignored.
void SetMinLevelFromEnv();

bool Enabled(Level l);
void Emit(Level l, std::string_view event, std::initializer_list<Field> fields = {});

// The line Emit writes (without the trailing newline), for a given time. Exposed for tests.
std::string FormatLine(std::chrono::system_clock::time_point t, Level l, std::string_view component,
                       std::string_view event, std::initializer_list<Field> fields);
// Appends ` key=value` with logfmt quoting to `out`.
void AppendField(std::string* out, std::string_view key, std::string_view value);

// Tests: send lines to `sink` instead of stderr (nullptr restores stderr).
void SetSinkForTesting(std::function<void(std::string_view line)> sink);

}  // namespace ds::log

#define DS_LOG(LEVEL, EVENT, ...)                                                     \
  do {                                                                                \
    if (::ds::log::Enabled(::ds::log::severity::LEVEL))                               \
      ::ds::log::Emit(::ds::log::severity::LEVEL, (EVENT)__VA_OPT__(, ) __VA_ARGS__); \
  } while (0)
