// The worker's device switches (`deltaserve worker --portable ... --gdn-state ...`): one struct that
// `worker` parses and `serve` parses and writes back as the flags of the workers it starts (and
// `generate` parses for its in-process backend), so a switch added here is accepted, validated and
// forwarded by all (tests/worker/worker_flags_test.cc checks that writing and parsing them again
// gives the same struct).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/backend.h"

namespace ds {

// The backend's own defaults, which the switches start from (one place for each default).
inline const BackendOptions& BackendDefaults() {
  static const BackendOptions kDefaults;
  return kDefaults;
}

// Each switch sets the BackendOptions field of its name (see there for what it does), except
// deferred_drafts, which is the step executor's.
struct DeviceTuning {
  bool portable = BackendDefaults().portable;                    // --portable on|off (issue #19)
  DenseWeights dense_weights = BackendDefaults().dense_weights;  // --dense-weights on|off|auto
  bool early_launch = BackendDefaults().early_launch;            // --early-launch on|off
  bool tiled_f16_formats = BackendDefaults().tiled_f16_formats;  // --tiled-f16-formats on|off
  bool f16_wgmma = BackendDefaults().f16_wgmma;                  // --f16-wgmma on|off
  bool prefill_fp8 = BackendDefaults().prefill_fp8;              // --prefill-fp8 on|off
  int fp8_decode_rows = BackendDefaults().fp8_decode_rows;       // --fp8-decode-rows N (33; 0: never)
  bool coarse_draft_head = BackendDefaults().coarse_draft_head;  // --coarse-draft-head on|off
  bool draft_chain_resident = BackendDefaults().draft_chain_resident;  // --draft-resident on|off
  bool draft_chain_fold_prep = BackendDefaults().draft_chain_fold_prep;  // --chain-fold on|off
  bool gdn_one_group_runs = BackendDefaults().gdn_one_group_runs;        // --gdn-one-group on|off
  bool draft_chain_prefetch = BackendDefaults().draft_chain_prefetch;    // --chain-prefetch on|off
  bool gdn_state_bf16 = BackendDefaults().gdn_state_bf16;        // --gdn-state f32|bf16
  bool judged_chains = BackendDefaults().judged_chains;          // --judged-chains on|off
  // --deferred-drafts on|off: draft chains leave their drafts on the device for the slot's next
  // verify (StepExecutor::SetDeferredDrafts; the same tokens). On by default: served demo MTP
  // +4-30% in 9 of 9 prompt pairs on the H200, `generate` unchanged (docs/perf/h200.md).
  bool deferred_drafts = true;

  bool operator==(const DeviceTuning&) const = default;
};

// The flags above, for a role's list of known flags.
const std::vector<std::string>& DeviceTuningFlagNames();

// Sets the fields whose flags `flags` (config::ParseFlagPairs' result) holds; a bad value is an
// InvalidArgument naming the flag and what it expects.
absl::Status ParseDeviceTuning(const std::map<std::string, std::string>& flags, DeviceTuning* t);

// The worker flags that give `t` (the switches that differ from the defaults), flag then value.
std::vector<std::string> DeviceTuningArgs(const DeviceTuning& t);

// Sets the backend options `t` decides (all but deferred_drafts, which is the step executor's).
void ApplyDeviceTuning(const DeviceTuning& t, BackendOptions* bo);

}  // namespace ds
