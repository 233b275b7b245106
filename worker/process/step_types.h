// One scheduler -> worker step and the worker's answer, as plain C++ types: what StepExecutor
// takes and returns. They carry what the messages Step / StepResult of
// proto/deltaserve/internal/cluster.proto carry, field for field; worker/process/step_proto.h
// converts at the process edge (the session's stream), so no protobuf type reaches the executor.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/sampling/sampling_params.h"

namespace ds::worker {

// A sequence bound to a slot since the last step: its full data, sent once (proto SequenceStart).
struct SequenceStart {
  uint64_t request_id = 0;
  uint32_t slot = 0;
  std::vector<int32_t> tokens;  // [n_known] prompt, or prompt + generated so far on a replay
  // The request's sampling in the sampler's conventions (the proto's "0 = disabled" already
  // mapped to neutral values); seed 0 = random, drawn by the executor. n_logprobs is the proto's
  // `logprobs` (the public API's `logprobs = n`): > 0 returns the chosen token's logprob plus the
  // top n_logprobs, at most sampling::kMaxLogprobs.
  sampling::SamplingParams sampling;
  // A replay after failover: the last n_generated of `tokens` were sampled already (proto
  // SequenceStart.n_generated); the sampler keys its draws by position, so it needs no skipping.
  uint32_t n_generated = 0;
  // Generated tokens the request may have in all (proto SequenceStart.max_new_tokens); 0 =
  // unknown (no MTP drafts for it).
  uint32_t max_new_tokens = 0;
  // Prefix cache (issue #17, proto SequenceStart.resume_checkpoint): non-zero = load this
  // checkpoint, the state after the first resume_len of `tokens`; the work starts there.
  uint64_t resume_checkpoint = 0;
  uint32_t resume_len = 0;
};

// One slot's work in a step: process known tokens [pos0, pos0 + n_tokens) (proto SlotWork).
struct SlotWork {
  uint32_t slot = 0;
  uint32_t pos0 = 0;
  uint32_t n_tokens = 0;
  bool sample = false;  // sample a token after this chunk (it reaches the end of the known tokens)
  bool decode_path = false;  // SeqStep::decode_path (proto SlotWork.decode_path)
  uint64_t checkpoint = 0;   // non-zero: save the slot as this checkpoint after the work
  // Sent ahead with MTP (proto SlotWork.follows): continue from the slot's pending token;
  // StepExecutor::Run sets pos0 / n_tokens / sample from what the slot knows.
  bool follows = false;
};

// Prefix cache: save `slot` (holding n_past positions) as checkpoint `id` before releases.
struct CheckpointSave {
  uint32_t slot = 0;
  uint64_t id = 0;
  uint32_t n_past = 0;
};

struct CheckpointSaved {
  uint64_t id = 0;
  uint64_t bytes = 0;
  friend bool operator==(const CheckpointSaved&, const CheckpointSaved&) = default;
};

// Applied in this order: saves, released, started, work (then the work's checkpoints).
struct Step {
  uint64_t step_id = 0;
  std::vector<CheckpointSave> saves;   // prefix cache: finished slots saved before their release
  std::vector<SequenceStart> started;  // sequences bound to slots since the last step
  std::vector<uint32_t> released;      // slots freed since the last step: reset them
  std::vector<SlotWork> work;          // distinct slots
};

struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0;
  friend bool operator==(const TopLogprob&, const TopLogprob&) = default;
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0;
  std::vector<TopLogprob> top;  // most likely first
  friend bool operator==(const TokenLogprob&, const TokenLogprob&) = default;
};

struct SampledToken {
  uint32_t slot = 0;
  int32_t token = 0;
  std::optional<TokenLogprob> logprob;  // only when the slot's request asked for logprobs
  friend bool operator==(const SampledToken&, const SampledToken&) = default;
};

// TP group: only rank 0 fills `tokens`; ranks > 0 answer with the id, timings and error.
struct StepResult {
  uint64_t step_id = 0;
  // One per SlotWork with sample, in work order; with MTP a slot may have several consecutive
  // ones (its kept drafts, then the model's own token).
  std::vector<SampledToken> tokens;
  double forward_seconds = 0;        // measured on the worker
  double sample_seconds = 0;
  std::string error;  // not empty: the step failed (the scheduler fails the step's requests)
  // Receiving the Step -> handing the result to the stream; set by the session, not the executor.
  double handle_seconds = 0;
  // Prefix cache (proto StepResult.checkpoints_*): saved, dropped to make room, not saved.
  std::vector<CheckpointSaved> checkpoints_saved;
  std::vector<uint64_t> checkpoints_evicted;
  std::vector<uint64_t> checkpoints_failed;
  double checkpoint_seconds = 0;
  // MTP (proto StepResult.drafts_offered): per sampled work, the drafts its verify offered.
  std::vector<uint32_t> drafts_offered;
  friend bool operator==(const StepResult&, const StepResult&) = default;
};

}  // namespace ds::worker
