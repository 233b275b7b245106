// DeviceTuningFromArgs (device_tuning_args.h).
#include "tools/cli/device_tuning_args.h"

#include <map>

namespace ds::cli {

absl::Status DeviceTuningFromArgs(const Args& args, const std::vector<std::string>& names,
                                  DeviceTuning* t) {
  std::map<std::string, std::string> flags;
  for (const std::string& f : names)
    if (args.Has(f)) flags[f] = args.Str(f);
  return ParseDeviceTuning(flags, t);
}

}  // namespace ds::cli
