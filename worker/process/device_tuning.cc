// DeviceTuning (device_tuning.h): the worker's device switches, parsed and written as flags.
#include "worker/process/device_tuning.h"

#include "absl/strings/numbers.h"
#include "common/config/config_file.h"
#include "common/config/on_off_switch.h"
#include "common/util/status.h"
#include "worker/model/gdn_state.h"

namespace ds {
namespace {

// The on|off switches, one row each: the flag names, the parser and the writer all read it.
constexpr OnOffSwitch<DeviceTuning> kOnOff[] = {
    {"--portable", &DeviceTuning::portable},
    {"--early-launch", &DeviceTuning::early_launch},
    {"--tiled-f16-formats", &DeviceTuning::tiled_f16_formats},
    {"--f16-wgmma", &DeviceTuning::f16_wgmma},
    {"--prefill-fp8", &DeviceTuning::prefill_fp8},
    {"--coarse-draft-head", &DeviceTuning::coarse_draft_head},
    {"--draft-resident", &DeviceTuning::draft_chain_resident},
    {"--chain-fold", &DeviceTuning::draft_chain_fold_prep},
    {"--gdn-one-group", &DeviceTuning::gdn_one_group_runs},
    {"--chain-prefetch", &DeviceTuning::draft_chain_prefetch},
    {"--deferred-drafts", &DeviceTuning::deferred_drafts},
    {"--judged-chains", &DeviceTuning::judged_chains},
};

}  // namespace

const std::vector<std::string>& DeviceTuningFlagNames() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> n = {"--dense-weights", "--gdn-state", "--fp8-decode-rows"};
    for (const OnOffSwitch<DeviceTuning>& s : kOnOff) n.emplace_back(s.flag);
    return n;
  }();
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
  for (const OnOffSwitch<DeviceTuning>& s : kOnOff)
    DS_RETURN_IF_ERROR(config::OnOffFlag(flags, s.flag, &(t->*s.field)));
  if (auto it = flags.find("--gdn-state"); it != flags.end()) {
    DS_ASSIGN_OR_RETURN(t->gdn_state_bf16, ParseGdnState(it->second));
  }
  if (auto it = flags.find("--fp8-decode-rows"); it != flags.end()) {
    int n = -1;
    if (!absl::SimpleAtoi(it->second, &n) || n < 0 || n > 4096)
      return absl::InvalidArgumentError("--fp8-decode-rows expects a row count in [0, 4096] (0: never), got '" +
                                        it->second + "'");
    t->fp8_decode_rows = n;
  }
  return absl::OkStatus();
}

std::vector<std::string> DeviceTuningArgs(const DeviceTuning& t) {
  const DeviceTuning def;
  std::vector<std::string> a;
  if (t.dense_weights != def.dense_weights)
    a.insert(a.end(), {"--dense-weights", DenseWeightsName(t.dense_weights)});
  for (const OnOffSwitch<DeviceTuning>& s : kOnOff)
    if (t.*s.field != def.*s.field) a.insert(a.end(), {s.flag, t.*s.field ? "on" : "off"});
  if (t.gdn_state_bf16 != def.gdn_state_bf16)
    a.insert(a.end(), {"--gdn-state", GdnStateName(t.gdn_state_bf16)});
  if (t.fp8_decode_rows != def.fp8_decode_rows)
    a.insert(a.end(), {"--fp8-decode-rows", std::to_string(t.fp8_decode_rows)});
  return a;
}

void ApplyDeviceTuning(const DeviceTuning& t, BackendOptions* bo) {
  bo->portable = t.portable;
  bo->dense_weights = t.dense_weights;
  bo->early_launch = t.early_launch;
  bo->tiled_f16_formats = t.tiled_f16_formats;
  bo->f16_wgmma = t.f16_wgmma;
  bo->prefill_fp8 = t.prefill_fp8;
  bo->fp8_decode_rows = t.fp8_decode_rows;
  bo->coarse_draft_head = t.coarse_draft_head;
  bo->draft_chain_resident = t.draft_chain_resident;
  bo->draft_chain_fold_prep = t.draft_chain_fold_prep;
  bo->gdn_one_group_runs = t.gdn_one_group_runs;
  bo->draft_chain_prefetch = t.draft_chain_prefetch;
  bo->gdn_state_bf16 = t.gdn_state_bf16;
  bo->judged_chains = t.judged_chains;
}

}  // namespace ds
