// DeviceTuning (device_tuning.h): the worker's device switches, parsed and written as flags.
#include "worker/process/device_tuning.h"

#include "common/config/config_file.h"
#include "common/util/status.h"
#include "worker/model/gdn_state.h"

namespace ds {

const std::vector<std::string>& DeviceTuningFlagNames() {
  static const std::vector<std::string> kNames = {
      "--portable",          "--dense-weights",   "--early-launch", "--tiled-f16-formats",
      "--coarse-draft-head", "--deferred-drafts", "--gdn-state"};
  return kNames;
}

absl::Status ParseDeviceTuning(const std::map<std::string, std::string>& flags, DeviceTuning* t) {
  if (auto it = flags.find("--dense-weights"); it != flags.end()) {
    const auto d = DenseWeightsFromName(it->second);
    if (!d)
      return absl::InvalidArgumentError("--dense-weights expects on, off or auto, got '" +
                                        it->second + "'");
    t->dense_weights = *d;
  }
  DS_RETURN_IF_ERROR(config::OnOffFlag(flags, "--portable", &t->portable));
  DS_RETURN_IF_ERROR(config::OnOffFlag(flags, "--early-launch", &t->early_launch));
  DS_RETURN_IF_ERROR(config::OnOffFlag(flags, "--tiled-f16-formats", &t->tiled_f16_formats));
  DS_RETURN_IF_ERROR(config::OnOffFlag(flags, "--coarse-draft-head", &t->coarse_draft_head));
  DS_RETURN_IF_ERROR(config::OnOffFlag(flags, "--deferred-drafts", &t->deferred_drafts));
  if (auto it = flags.find("--gdn-state"); it != flags.end()) {
    DS_ASSIGN_OR_RETURN(t->gdn_state_bf16, ParseGdnState(it->second));
  }
  return absl::OkStatus();
}

std::vector<std::string> DeviceTuningArgs(const DeviceTuning& t) {
  const DeviceTuning def;
  std::vector<std::string> a;
  auto on_off = [&](const char* flag, bool value, bool by_default) {
    if (value != by_default) a.insert(a.end(), {flag, value ? "on" : "off"});
  };
  on_off("--portable", t.portable, def.portable);
  if (t.dense_weights != def.dense_weights)
    a.insert(a.end(), {"--dense-weights", DenseWeightsName(t.dense_weights)});
  on_off("--early-launch", t.early_launch, def.early_launch);
  on_off("--tiled-f16-formats", t.tiled_f16_formats, def.tiled_f16_formats);
  on_off("--coarse-draft-head", t.coarse_draft_head, def.coarse_draft_head);
  on_off("--deferred-drafts", t.deferred_drafts, def.deferred_drafts);
  if (t.gdn_state_bf16 != def.gdn_state_bf16)
    a.insert(a.end(), {"--gdn-state", GdnStateName(t.gdn_state_bf16)});
  return a;
}

}  // namespace ds
