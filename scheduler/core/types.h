// Plain C++ structs crossing the scheduler boundary: what goes in (Request, StepResults, policy and
// config) and what comes out (StepPlan, Event, SchedulerStatus, RequestInfo). No protobuf types:
// the daemon translates at its edge (docs: scheduler/README.md, "Threading model").
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ds::sched {

using RequestId = uint64_t;

// One generation request as the gateway hands it over (already tokenized and validated for shape).
constexpr size_t kMaxCheckpointHints = 16;

struct Request {
  RequestId id = 0;
  std::vector<int32_t> prompt;  // [n_prompt] token ids, n_prompt >= 1
  // Tokens this request already generated on another worker (failover replay): they are
  // re-prefilled after the prompt and count toward max_new_tokens. Empty for a fresh request.
  std::vector<int32_t> generated;  // [n_generated]
  // How the prompt was cut into prefill pieces on the worker that lost it (token counts, in
  // order; may cover only part of the prompt). The replay cuts it the same way: on a GPU a
  // piece's numbers depend on its length, so equal pieces (and the generated tokens on the decode
  // path, PlanEntry::decode_path) continue with the tokens of the uninterrupted run.
  std::vector<int32_t> prompt_pieces;
  // Prefix cache: prompt positions where a checkpoint is likely to be reused (the gateway sends
  // the starts of the last chat messages: the next turn re-renders the conversation up to there
  // even when it renders the answer differently, e.g. without its reasoning). In (0, n_prompt).
  std::vector<int32_t> checkpoint_hints;  // at most kMaxCheckpointHints
  int32_t max_new_tokens = 1;      // generated tokens in total, including `generated`
  int priority = 0;                // higher is admitted first; FIFO within a priority
  std::vector<int32_t> stop_ids;   // sampling one of these finishes with kStop
  absl::Time arrival;              // when the gateway accepted it (queue wait is measured from it)
  absl::Time deadline = absl::InfiniteFuture();  // past it, Schedule() aborts the request
};

enum class FinishReason : uint8_t {
  kLength,   // max_new_tokens generated
  kStop,     // a stop id was sampled, or the gateway matched a stop string (Finish())
  kAborted,  // cancelled by the client / gateway, or its deadline passed
  kError,    // the step failed, the result was malformed, or it can no longer fit
};
const char* FinishReasonName(FinishReason r);

struct RequestTimings {
  absl::Time arrival;                             // Request::arrival
  absl::Time admitted = absl::InfinitePast();     // bound to a slot (last time, after a requeue)
  absl::Time first_token = absl::InfinitePast();  // first token sampled by this scheduler
  absl::Time last_token = absl::InfinitePast();   // latest token sampled
  absl::Time finished = absl::InfinitePast();
  int32_t answers = 0;  // sampled entries applied (with MTP one may bring several tokens)
  // MTP, by draft position (0 = the first draft): verifies that judged a draft there (all before
  // it kept) and how many of those kept it. Empty until a verify is reported.
  std::vector<int32_t> drafts_judged, drafts_accepted;
};

// What the gateway streams. A flat tagged struct (not a variant) so the daemon maps it to a proto
// oneof with one switch.
struct Event {
  enum class Kind : uint8_t { kStarted, kToken, kFinished };
  Kind kind = Kind::kToken;
  RequestId id = 0;
  int slot = -1;                                // kStarted: the slot it was bound to
  int32_t token = -1;                           // kToken: the sampled id
  FinishReason reason = FinishReason::kLength;  // kFinished
  std::string detail;       // kFinished: why (abort reason, error message); may be empty
  int32_t n_prompt = 0;     // kFinished: prompt tokens
  int32_t n_generated = 0;  // kFinished: generated tokens, including replayed ones
  RequestTimings timings;   // kStarted (arrival, admitted) and kFinished (all)
};

// One sequence's share of a step: the scheduler-side twin of worker SeqStep
// (worker/model/backend.h) plus the request id and whether a token is sampled.
struct PlanEntry {
  RequestId id = 0;
  int slot = 0;                 // bound to this request for its life on this worker
  int32_t pos0 = 0;             // position of tokens[0] == tokens already computed in the slot
  std::vector<int32_t> tokens;  // [n] tokens to append, 1 <= n <= max_chunk
  bool reset = false;           // pos0 == 0: the worker empties the slot before appending
  bool sample = false;          // the chunk reaches the end of the known tokens: sample one token
  // Scheduled ahead (Scheduler::ScheduleAhead): the single input token is the one the worker
  // samples for this slot in the plan still in flight, unknown here (tokens = {-1}). The worker
  // protocol needs nothing for it: SlotWork names positions of the tokens the worker knows.
  bool ahead = false;
  // Scheduled ahead with MTP (proto SlotWork.follows): the in-flight plan's answer for this slot
  // holds 1..1 + mtp_drafts tokens, so pos0 is only a lower bound: the worker continues the slot
  // from where that answer left it (its last token, pending, at the slot's end).
  bool follows = false;
  // The tokens are generated ones (pos0 >= the prompt's length): the worker computes them as
  // decode steps of one token would (SeqStep::decode_path), also when a replay re-prefills many.
  bool decode_path = false;
  // Prefix cache (issue #17): non-zero = after this entry the worker saves the slot's state
  // (positions [0, pos0 + n)) as this checkpoint (scheduler/core/prefix_tree.h).
  uint64_t checkpoint = 0;
};

// Full data of a sequence bound to a slot in this plan: everything the worker needs once (prompt,
// plus generated tokens when replaying); later steps only name the slot (proto SequenceStart).
struct SeqStart {
  RequestId id = 0;
  int slot = 0;
  std::vector<int32_t> tokens;  // [n_known] prompt + generated so far
  int32_t max_new_tokens = 0;   // Request::max_new_tokens (bounds the worker's MTP drafts)
  // Prefix cache: non-zero = the worker loads this checkpoint, the state after the first
  // resume_len tokens, and the sequence's first entry starts at resume_len.
  uint64_t resume_checkpoint = 0;
  int32_t resume_len = 0;
};

// Prefix cache: save `slot` (holding n_past positions) as checkpoint `id` before the plan's
// releases (a finished request's prompt + generated text: a chat's next turn starts there).
struct CheckpointSave {
  int slot = 0;
  uint64_t id = 0;
  int32_t n_past = 0;
};

struct StepPlan {
  uint64_t step_id = 0;           // 0: empty plan (nothing to run); otherwise unique and increasing
  std::vector<int> released;      // slots freed since the previous issued plan: reset them first
  std::vector<CheckpointSave> saves;  // prefix cache: applied before `released`
  std::vector<SeqStart> started;  // sequences bound to a slot by this plan (entries with reset)
  std::vector<PlanEntry> entries;  // distinct slots; decodes first, then prefill chunks
  int32_t n_tokens = 0;            // sum of entries[i].tokens.size() <= max_num_batched_tokens
  int32_t n_sampled = 0;           // entries with sample == true
  bool empty() const { return entries.empty(); }
};

struct StepResults {
  uint64_t step_id = 0;         // StepPlan::step_id it answers
  absl::Status status;          // not OK: the worker failed the step (every entry finishes kError)
  // Sampled ids in plan order of the sampled entries: one each, or counts[i] for sampled entry i
  // when `counts` is not empty (MTP: a verify step keeps drafts, 1..mtp_drafts + 1 tokens).
  std::vector<int32_t> tokens;
  std::vector<int32_t> counts;  // [plan.n_sampled] or empty
  // MTP (proto StepResult.drafts_offered): the drafts each sampled entry's verify offered, with
  // counts; [plan.n_sampled] or empty (not reported). Only for RequestTimings' acceptance.
  std::vector<int32_t> drafts_offered;
  double forward_seconds = 0;   // as measured by the worker (for metrics; unused here)
  // Prefix cache (proto StepResult.checkpoints_*), also when status is not OK: (id, bytes) of the
  // checkpoints the worker saved, the ids it dropped to make room and those it did not save.
  std::vector<std::pair<uint64_t, uint64_t>> checkpoints_saved;
  std::vector<uint64_t> checkpoints_evicted;
  std::vector<uint64_t> checkpoints_failed;
};

// Prefix cache (issue #17) of one replica: where the core plans checkpoints and resumes.
struct PrefixCacheConfig {
  bool enabled = false;      // the worker keeps a store (WarmupDone.prefix_cache_bytes > 0)
  int32_t min_tokens = 16;   // no checkpoint of fewer positions, no resume from fewer
  // Checkpoints every `interval` positions of a long prompt (chunk boundaries), so a later prompt
  // that shares only part of it resumes close to where they part; 0 = none.
  int32_t interval = 4096;
  // A queued request waits (head of line) for a checkpoint a running request is about to save
  // when it would resume this many more positions than from what is cached now: 64 requests
  // that arrive together with one 6,000-token prefix then prefill it once, not 64 times.
  int32_t wait_gain = 256;
  uint64_t budget_bytes = 0;  // the worker's budget, for status only
};

// Cumulative counters and current figures (metrics, deltactl status).
struct PrefixCacheStats {
  uint64_t lookups = 0;        // admissions that looked for a cached prefix
  uint64_t hits = 0;           // ... that resumed from one
  uint64_t tokens_saved = 0;   // prompt tokens not prefilled thanks to a hit
  uint64_t tokens_looked = 0;  // prompt tokens of all lookups
  uint64_t saves = 0;          // checkpoints the worker saved
  uint64_t evictions = 0;      // dropped by the worker to make room
  uint64_t failures = 0;       // asked for, not saved
  int64_t checkpoints = 0;     // saved and held now
  uint64_t bytes = 0;          // held now, as the worker reported
  uint64_t budget_bytes = 0;   // the worker's budget (PrefixCacheConfig::budget_bytes)
};

// How the context (KV positions) of a worker is divided between its slots.
struct ContextPolicy {
  enum class Kind : uint8_t {
    // llama.cpp style: every slot owns n_ctx / n_slots positions; an admission reserves that share.
    kStatic,
    // One pool of n_ctx positions; an admission reserves prompt + max_new_tokens (its worst case),
    // at most slot_cap per slot.
    kPool,
  };
  Kind kind = Kind::kPool;
  int64_t n_ctx = 0;     // total positions of the worker, > 0
  int32_t slot_cap = 0;  // kPool: most positions one slot may hold; 0 = n_ctx. kStatic: ignored
  // kPool only. 0: an admission reserves its worst case (prompt + max_new_tokens) and nothing is
  // ever preempted. > 0: over-commit (issue #23): an admission reserves its known tokens + this
  // many (at most its worst case), the reservation grows by as much whenever the sequence has
  // used it up, and when the pool cannot grow it the youngest running requests are preempted
  // (Requeue: slot and reservation freed, resumed later by re-prefilling prompt + generated).
  int32_t overcommit_headroom = 0;
};

struct SchedulerConfig {
  int n_slots = 1;                        // >= 1; SetSlots() changes it at run time
  int32_t max_num_batched_tokens = 2048;  // token budget of one step, >= 1 (keep >= n_slots)
  int32_t max_chunk = 512;                // largest prefill chunk of one sequence in one step
  int32_t max_queue = 256;                // waiting (not yet admitted) requests; Add fails beyond
  // MTP on the worker (WarmupDone.mtp_drafts, issue #15): a decode verifies up to this many drafts,
  // so it counts 1 + mtp_drafts rows against the step's token budget, may answer with several
  // tokens, and is scheduled ahead as a slot that follows its answer (PlanEntry::follows: the
  // next position is unknown until the result). 0 = off.
  int32_t mtp_drafts = 0;
  ContextPolicy context;
  PrefixCacheConfig prefix_cache;
};

// Admin / metrics snapshot.
struct SlotStatus {
  int slot = 0;
  bool busy = false;
  bool retiring = false;     // index >= target slot count: removed once freed
  RequestId id = 0;          // when busy
  int32_t ctx_used = 0;      // positions computed in the slot
  int64_t ctx_reserved = 0;  // positions reserved at admission
};

struct SchedulerStatus {
  int n_slots_target = 0;         // SetSlots() value
  std::vector<SlotStatus> slots;  // every slot that exists (target + retiring)
  std::vector<std::pair<int, int>> queued_by_priority;  // (priority, count), priority descending
  int queued = 0;
  int running = 0;
  int64_t pool_total = 0;     // policy n_ctx
  int64_t pool_reserved = 0;  // sum of running reservations (may exceed pool_total briefly
                              // after a policy shrink; see README)
  int64_t pool_used = 0;      // sum of computed positions
  int64_t per_slot_cap = 0;   // kStatic: n_ctx / n_slots; kPool: min(slot_cap, n_ctx)
  ContextPolicy policy;
  bool draining = false;
  bool plan_in_flight = false;
  uint64_t steps_applied = 0;
  uint64_t preemptions = 0;   // requests requeued to let older ones grow (overcommit_headroom)
  PrefixCacheStats prefix_cache;
};

// One request's state and full history (for failover or debugging).
struct RequestInfo {
  enum class State : uint8_t { kQueued, kRunning };
  RequestId id = 0;
  State state = State::kQueued;
  int slot = -1;
  int priority = 0;
  int32_t n_prompt = 0;
  int32_t max_new_tokens = 0;
  std::vector<int32_t> tokens;  // [n_prompt + n_generated]: prompt then every generated token
  int32_t computed = 0;         // positions in the slot's state
  int64_t reserved = 0;
  bool in_flight = false;
  RequestTimings timings;
};

}  // namespace ds::sched
