// The start of every role's main (`deltaserve gateway|scheduler|worker`): expands `--config FILE`
// (config_file.h), takes the flags all roles share (--log-level, --metrics-listen) and sets up
// structured logging, so each role's own parser only sees its own flags.
#pragma once
#include <initializer_list>
#include <string>
#include <string_view>

#include "common/config/config_file.h"
#include "common/log/log.h"

namespace ds::config {

struct RoleSetup {
  Args args;                   // the role's own flags
  std::string metrics_listen;  // "" = no /metrics endpoint
};

// `component` names the role in every log line. Errors (bad config file, bad --log-level) name
// the file and line where the value came from one.
absl::StatusOr<RoleSetup> SetUpRole(std::string_view component, int argc, char** argv);

// `--help` or `-h` among the flags: the role prints its usage on stdout and exits 0. With
// `usage`, it is printed here.
bool HelpRequested(int argc, char** argv, const char* usage = nullptr);

}  // namespace ds::config
