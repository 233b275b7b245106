#include "common/log/protobuf_log.h"

#include <google/protobuf/stubs/logging.h>

#include <mutex>
#include <string_view>

#include "common/log/log.h"

namespace ds::log {
namespace {

thread_local std::string t_invalid_utf8_field;

void Handler(google::protobuf::LogLevel level, const char* file, int line,
             const std::string& message) {
  // protobuf 3.21 (wire_format_lite.cc): "String field '<message>.<field>' contains invalid UTF-8
  // data when parsing a protocol buffer. ..."
  constexpr std::string_view kParsing = "contains invalid UTF-8 data when parsing";
  if (message.find(kParsing) != std::string::npos) {
    const size_t open = message.find('\'');
    const size_t close = open == std::string::npos ? open : message.find('\'', open + 1);
    t_invalid_utf8_field =
        close == std::string::npos ? std::string("?") : message.substr(open + 1, close - open - 1);
    DS_LOG(DEBUG, "libprotobuf", {{"source", absl::StrCat(file, ":", line)}, {"message", message}});
    return;
  }
  const Level l = level == google::protobuf::LOGLEVEL_INFO      ? Level::kInfo
                  : level == google::protobuf::LOGLEVEL_WARNING ? Level::kWarning
                                                                : Level::kError;
  if (Enabled(l))
    Emit(l, "libprotobuf", {{"source", absl::StrCat(file, ":", line)}, {"message", message}});
}

}  // namespace

void RouteProtobufLogs() {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&Handler); });
}

std::string TakeInvalidUtf8Field() {
  std::string f;
  f.swap(t_invalid_utf8_field);
  return f;
}

}  // namespace ds::log
