// The one rule that cuts a step (Backend::Forward's batch) into micro-steps a device can take:
// at most DeviceLimits::max_rows token rows, max_logit_rows rows through the head and
// max_decode_rows rows through the decode kernels each. A
// sequence longer than what is left of a micro-step continues in the next one (its state carries
// over); an all_logits sequence counts every row against the logit budget, any other sequence
// only its last row.
#pragma once
#include <span>
#include <vector>

#include "worker/model/backend.h"
#include "worker/runner/device.h"

namespace ds {

// Tokens [t0, t0 + n) of batch[seq]; `last` when the piece ends that sequence.
struct StepPiece {
  int seq = 0;
  int t0 = 0;
  int n = 0;
  bool last = false;
};

// Micro-steps in execution order. max_rows, max_logit_rows and max_decode_rows must be >= 1.
// max_decode_rows bounds the rows a device runs through its decode kernels in one micro-step
// (pieces of one token, and every row of a SeqStep::decode_path sequence), whose scratch it sizes
// by that count; a decode_path sequence longer than what is left continues in the next one.
std::vector<std::vector<StepPiece>> SplitIntoMicroSteps(std::span<const SeqStep> batch,
                                                        int max_rows, int max_logit_rows,
                                                        int max_decode_rows = 1 << 30);

// The device's description of one micro-step made of `pieces` (rows in piece order).
// spec_base[seq] (empty = none speculative): the speculative entry of batch[seq]'s first token,
// or -1; a piece starting at token t0 gets RowRun::spec_entry = spec_base[seq] + t0.
// device_slot[seq] (empty = the SeqStep's own slot): the device's slot of batch[seq].
void BuildMicroStep(std::span<const SeqStep> batch, std::span<const StepPiece> pieces,
                    MicroStep* out, std::span<const int32_t> spec_base = {},
                    std::span<const int32_t> device_slot = {});

}  // namespace ds
