// The worker's device switches (worker/process/device_tuning.h) on a CLI command's own flags
// (`generate`, `perplexity`), parsed by the worker's parser so each command accepts, validates
// and applies them as `deltaserve worker` does.
#pragma once
#include <string>
#include <vector>

#include "common/util/status.h"
#include "tools/cli/args.h"
#include "worker/process/device_tuning.h"

namespace ds::cli {

// Sets the fields of *t whose flags among `names` (DeviceTuningFlagNames() or part of it) args
// holds; a bad value is ParseDeviceTuning's error naming the flag.
absl::Status DeviceTuningFromArgs(const Args& args, const std::vector<std::string>& names,
                                  DeviceTuning* t);

}  // namespace ds::cli
