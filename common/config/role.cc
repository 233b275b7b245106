#include "common/config/role.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/log/protobuf_log.h"

namespace ds::config {

absl::StatusOr<RoleSetup> SetUpRole(std::string_view component, int argc, char** argv) {
  log::Init(component);
  log::SetMinLevelFromEnv();
  // Every role parses protobuf: libprotobuf's own lines go through the structured log too.
  log::RouteProtobufLogs();
  DS_ASSIGN_OR_RETURN(Args args, Args::Expand(argc, argv));
  RoleSetup r{std::move(args), ""};
  // Validated on a copy: Explain() needs the flag still in place to name its file and line.
  Args probe = r.args;
  DS_ASSIGN_OR_RETURN(std::optional<std::string> level, probe.Take("--log-level"));
  if (level) {
    log::Level l;
    if (!log::ParseLevel(*level, &l))
      return r.args.Explain(absl::InvalidArgumentError(
          absl::StrCat("--log-level expects debug, info, warning or error, got '", *level, "'")));
    log::SetMinLevel(l);
  }
  r.args = std::move(probe);
  DS_ASSIGN_OR_RETURN(std::optional<std::string> metrics, r.args.Take("--metrics-listen"));
  if (metrics) r.metrics_listen = *metrics;
  return r;
}

bool HelpRequested(int argc, char** argv, const char* usage) {
  for (int i = 0; i < argc; ++i)
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      if (usage) std::fputs(usage, stdout);
      return true;
    }
  return false;
}

}  // namespace ds::config
