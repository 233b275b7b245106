// The worker's device switches (`deltaserve worker --portable ... --gdn-state ...`): one struct that
// `worker` parses and `serve` parses and writes back as the flags of the workers it starts (and
// `generate` parses for its in-process backend), so a switch added here is accepted, validated and
// forwarded by all (tests/worker/
// worker_flags_test.cc checks that writing and parsing them again gives the same struct).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/backend.h"
#include "worker/model/dense_weights.h"

namespace ds {

struct DeviceTuning {
  // --portable on (issue #19): the CUDA backend runs the sm_70 (V100) kernels on any GPU
  // (CudaBackendOptions::portable; below sm_80 that path is taken anyway).
  bool portable = false;
  // --dense-weights on|off|auto (issue #22, worker/model/dense_weights.h): 16-bit copies of the
  // layer matrices in the CUDA backend (BackendOptions::dense_weights).
  DenseWeights dense_weights = DenseWeights::kAuto;
  // --early-launch off: the CUDA backend launches its decode kernels the plain way
  // (BackendOptions::early_launch; an escape hatch, the default is on).
  bool early_launch = true;
  // --tiled-f16-formats off: the CUDA backend keeps Q4_K / Q5_K / Q8_0 / IQ4 matrices in the raw
  // layout (v2 GEMV) instead of tiling them for its f16 tensor-core kernel
  // (BackendOptions::tiled_f16_formats; an A/B switch, docs/perf/h200.md).
  bool tiled_f16_formats = true;
  // --coarse-draft-head off: MTP drafts through the full lm_head instead of its coarse copy
  // (BackendOptions::coarse_draft_head; the outputs are the same either way).
  bool coarse_draft_head = true;
  // --deferred-drafts on|off: draft chains leave their drafts on the device for the slot's next
  // verify (StepExecutor::SetDeferredDrafts; the same tokens). On by default: served demo MTP
  // +4-30% in 9 of 9 prompt pairs on the H200, `generate` unchanged (docs/perf/h200.md).
  bool deferred_drafts = true;
  // --gdn-state f32|bf16 (issue #22, worker/model/gdn_state.h): the GDN recurrent state stored
  // in bf16 between steps (BackendOptions::gdn_state_bf16; the CPU backend emulates it).
  bool gdn_state_bf16 = false;

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
