// The cost side of MTP speculative decoding on one backend (issue #15), shared by
// `deltaserve bench --mtp` and mtp_verify_bench. Random-weight files accept (almost) no drafts,
// so the shapes are forced: a verify step always runs k + 1 tokens per stream and keeps one
// (CommitSpeculative(1)); the drafts are MtpRows over the catch-up rows and k - 1 chained
// MtpStep calls per stream. The projection then puts acceptance rates on top of those costs.
#pragma once
#include <functional>
#include <span>
#include <vector>

#include "common/util/status.h"
#include "worker/model/backend.h"

namespace ds {

struct MtpCostOptions {
  int streams = 1;  // sequences per step (slots 0 .. streams - 1)
  int k = 3;        // drafts per verify step
  int depth = 512;  // tokens of context each stream holds before the timing
  int iters = 20;   // timed repetitions of each shape (median)
  bool decode_path = false;  // also time the k + 1 tokens as a decode_path run (no entries)
  // When set: after the timings, 8 plain decode steps and then 8 verify(dev) steps run between
  // profile(shape, true) and profile(shape, false) (the bench turns the backend's per-op-class
  // profiling on and prints it per step: where a verify's extra time goes).
  std::function<void(const char* shape, bool begin)> profile;
};

// Median milliseconds of each shape (one step for all streams unless noted).
struct MtpCost {
  double decode_ms = 0;       // plain decode: 1 token per stream, greedy on the device
  double verify_dev_ms = 0;   // verify k + 1 tokens per stream (speculative, greedy on the
                              // device) + CommitSpeculative(1) per stream
  double verify_host_ms = 0;  // the same with every row's logits and hidden state copied to the
                              // host, as MtpSpeculator runs it (its sampler is on the host)
  double path_ms = -1;        // k + 1 tokens per stream as decode_path, no entries (-1: not run)
  double rows1_ms = 0;        // MtpRows of 1 row, one stream
  double rows_k1_ms = 0;      // MtpRows of k + 1 rows, one stream
  double step_ms = 0;         // one chained MtpStep, one stream
  // One stream's prompt of depth tokens prefilled without and with the MTP layer's KV written
  // inside it (SeqStep::fill_mtp, as the executor and MtpSpeculator::Start run it), once each.
  double prompt_plain_ms = 0, prompt_fill_ms = 0;
  // A whole cycle of the draft-chain fast path (MtpSpeculator on a backend with draft chains):
  // the verify(dev) step + CommitSpeculative(1), then per stream MtpDraftGreedy of k drafts from
  // one catch-up row, nothing but token ids crossing. -1: the backend has no draft chains.
  double cycle_ms = -1;
  // The same cycle with the drafts deferred (Backend::MtpDraftDeferred; the verify reads them
  // where the chain left them, one host wait per cycle). -1 as above.
  double cycle_deferred_ms = -1;
};

// The slot length MeasureMtpCost needs (depth + what the timed steps append).
int MtpCostSlotCtx(const MtpCostOptions& o);

// Resets and prefills slots [0, streams) with `depth` tokens, then times the shapes. The backend
// needs streams slots of MtpCostSlotCtx(o) tokens, speculative room for k + 1 tokens x streams
// sequences (SpeculativeRoom / CudaBackendOptions::spec_tokens, spec_seqs) and an MTP block.
absl::StatusOr<MtpCost> MeasureMtpCost(Backend& be, const MtpCostOptions& o);

// Expected tokens per verify step with k drafts when draft i is kept with probability rates[i]
// given that drafts 1..i-1 were kept (the per-position rates of `deltaserve mtp-accept`; positions
// past the list take its last rate): 1 + r1 + r1 r2 + ... + r1..rk.
double MtpTokensPerStep(int k, std::span<const double> rates);

// Projected steady-state tok/s of all streams: tokens per step / (verify step + the streams'
// drafts), the catch-up rows' cost interpolated between MtpRows of 1 and of k + 1 rows by the
// expected number of kept drafts.
double MtpProjectedTokS(const MtpCost& c, const MtpCostOptions& o, std::span<const double> rates);
// The same for the draft-chain cycle: streams x tokens per step / cycle_ms (0 without chains).
double MtpChainProjectedTokS(const MtpCost& c, const MtpCostOptions& o,
                             std::span<const double> rates);

}  // namespace ds
