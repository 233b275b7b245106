// The device layer under the step runner (worker/runner/step_runner.h): only the math of one
// micro-step on one device — embed, one layer over the step's rows (with its tensor-parallel
// reductions), the head, optional token selection, and copies of a slot's state. Everything
// around it (validating a batch, slot lengths, cutting a step into micro-steps, the TP plan and
// the vocab-parallel gather, the snapshot format, timing) is the runner's, written once for every
// device. Implementations: worker/model/cpu_device.h (the f32 reference) and
// worker/cuda/cuda_device.h.
//
// Per micro-step the runner calls, in this order:
//   Prepare(step) -> [Embed -> Layer(0..n_layer-1) -> Head]  (inside RunCaptured when every run of
//   the step goes through the decode kernels and the device captures graphs) -> optional vocab
//   gather (LogitBuffers,
//   CopyColumns) -> ReadLogits / ReadHidden / Argmax / Sample -> Finish.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/util/status.h"
#include "worker/model/backend.h"

namespace ds {

// A piece of one sequence inside a micro-step: token rows [row0, row0 + n) of the step are that
// sequence's positions [pos0, pos0 + n) in state slot `slot`.
struct RowRun {
  int32_t row0 = 0;
  int32_t n = 0;
  int32_t slot = 0;
  int32_t pos0 = 0;
  // SeqStep::decode_path: the device runs these positions one after another through its decode
  // kernels (a one-token run always does), so each row equals what a decode step of that token
  // alone would give.
  bool decode_path = false;
  // SeqStep::speculative: after token i of this run (decode path) the device also keeps the
  // sequence's recurrent state (GDN conv + delta-rule state) in speculative entry spec_entry + i,
  // which Device::CommitSpeculative can make the slot's state. -1: not speculative.
  int32_t spec_entry = -1;
  bool decode_like() const { return n == 1 || decode_path; }
};

// One micro-step as the device sees it. Built by the runner (worker/runner/micro_steps.h).
struct MicroStep {
  std::vector<int32_t> ids;        // [rows] token id of every row
  std::vector<int32_t> slots;      // [rows] its slot
  std::vector<int32_t> positions;  // [rows] its position
  std::vector<RowRun> runs;        // the pieces, in row order
  std::vector<int32_t> logit_rows; // rows whose final state goes through the head, ascending
  // Rows whose ids are a slot's deferred drafts (SeqStep::chain_drafts) on a device that keeps
  // them (Device::KeepsDeferredDrafts): ids [row, row + n) are the drafts [first, first + n) of
  // device slot `slot`, put in by Prepare (the ids above hold placeholders there).
  struct ChainTokens {
    int32_t row = 0, slot = 0, first = 0, n = 0;
  };
  std::vector<ChainTokens> chain_tokens;
  // Every run is one token with its logit row (a plain decode step).
  bool pure_decode = false;
  // Every run goes through the decode kernels (RowRun::decode_like): plain decodes, speculative
  // verify runs and decode-path replays. Such a step's kernel arguments are all in the device's
  // index arrays, so its launches depend only on the run shape (MicroStep::ShapeKey): the shapes a
  // device captures as graphs.
  bool decode_only = false;
  // The run shape of a decode_only step: rows, logit rows, then per run its length and whether
  // it is speculative. Two such steps with the same key launch the same kernels with the same
  // arguments (only the index arrays' contents differ: ids, slots, positions, logit rows, state
  // indices).
  void ShapeKey(std::vector<int32_t>* key) const {
    key->assign({rows(), n_logit_rows()});
    for (const RowRun& r : runs) key->push_back(r.n * 4 + (r.spec_entry >= 0 ? 2 : 0) + 1);
  }
  std::vector<int32_t> ShapeKey() const {
    std::vector<int32_t> key;
    ShapeKey(&key);
    return key;
  }
  int rows() const { return static_cast<int>(ids.size()); }
  int n_logit_rows() const { return static_cast<int>(logit_rows.size()); }
};

// What a device can take in one micro-step, and what it offers beyond the math.
struct DeviceLimits {
  int max_rows = 1 << 30;        // token rows per micro-step
  int max_logit_rows = 1 << 30;  // rows through the head per micro-step
  int max_decode_rows = 1 << 30; // rows through the decode kernels per micro-step (RowRun::decode_like)
  bool device_sampling = false;  // Sample() is implemented
  // Speculative entries (RowRun::spec_entry) the device holds: one per speculative token of a
  // Forward; 0 = the device cannot run speculative steps. max_spec_tokens bounds one sequence.
  int spec_entries = 0;
  int max_spec_tokens = 0;
};

// The device's paged KV store (issue #23): n_pages pages of page_size token rows per attention
// layer, shared by all slots through a per-slot page table of max_pages_per_slot entries that
// the runner fills (Device::MapPages) from its KvPagePool. n_pages 0 = not paged.
struct KvPaging {
  int page_size = 0;
  int64_t n_pages = 0;
  int max_pages_per_slot = 0;
};

// The vocab-parallel head's buffers (tensor parallel, lm_head cut by vocabulary rows): the
// device's own logits [n_logit_rows, V_local], room for every rank's [world][n_logit_rows][V_r],
// and the full logits [n_logit_rows, n_vocab] that ReadLogits / Argmax / Sample read. Pointers
// are in the device's memory (the collective takes them as they are).
struct LogitBuffers {
  float* local = nullptr;
  float* gathered = nullptr;
  float* full = nullptr;
};

// MTP rows a saved slot state keeps valid (Device::SaveState, device checkpoints): [0, MtpRowsKept).
// Row t pairs the main model's state at t with token t + 1, so rows t < n_past - 1 hold for any
// sequence that shares the saved prefix; row n_past - 1 was paired with whatever came next (a
// sampled token, a draft) and later rows with drafts, which a resumed sequence need not share.
inline int32_t MtpRowsKept(int32_t mtp_len, int32_t n_past) {
  return std::max(0, std::min(mtp_len, n_past - 1));
}

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"
  virtual const DeviceLimits& limits() const = 0;
  virtual MemoryFootprint memory() const = 0;

  // ---- one micro-step
  virtual absl::Status Prepare(const MicroStep& step) = 0;
  virtual absl::Status Embed() = 0;
  // One layer over every row of the prepared step: mixer, its all-reduce, FFN, its all-reduce.
  virtual absl::Status Layer(int layer) = 0;
  // Final norm of the logit rows and this rank's rows of the lm_head.
  virtual absl::Status Head() = 0;
  // Runs `body` (Embed, the layers, Head) for a decode_only step; a device with graphs captures
  // it once per shape (MicroStep::ShapeKey) and replays it. The default runs it as it is.
  virtual absl::Status RunCaptured(const MicroStep& step,
                                   const std::function<absl::Status()>& body) {
    return body();
  }

  // ---- outputs of the last micro-step (n = its logit rows); host destinations
  virtual LogitBuffers logit_buffers() = 0;
  // dst[r * ld_dst + c] = src[r * ld_src + c] for r < rows, c < width (device memory both).
  virtual absl::Status CopyColumns(float* dst, int64_t ld_dst, const float* src, int64_t ld_src,
                                   int64_t width, int64_t rows) = 0;
  // The copies below may complete only at Finish() (a device stream); Finish also waits for the
  // device and folds its profile.
  virtual absl::Status ReadLogits(int n, float* dst) = 0;   // [n, n_vocab]
  virtual absl::Status ReadHidden(int n, float* dst) = 0;   // [n, n_embd] final-normed states
  virtual absl::Status Argmax(int n, int32_t* tokens) = 0;  // [n]
  // Token selection where the logits are (limits().device_sampling): rows [n] of the step.
  virtual absl::Status Sample(std::span<const DeviceSampleRow> rows, int32_t* tokens) {
    return absl::UnimplementedError("device sampling is not implemented by " + name());
  }
  virtual absl::Status Finish() = 0;
  // Seconds spent inside collectives since the last call (0 without TP).
  virtual double TakeCommSeconds() = 0;

  // ---- state of a slot (its recurrent state, KV rows and any MTP KV)
  virtual KvPaging kv_paging() const { return {}; }
  // Entries [first, first + pages.size()) of the slot's page table become `pages` (pool page
  // indices). Called between micro-steps only; the kernels read the table at run time, so
  // captured graphs stay valid. SaveState / LoadState go through the table too.
  virtual absl::Status MapPages(int slot, int first, std::span<const int32_t> pages) {
    return absl::UnimplementedError("paged KV is not implemented by device " + name());
  }
  virtual void ResetSlot(int slot) = 0;
  // The slot's state for a sequence of n_past tokens, in the device's own layout (named by
  // state_layout(); the runner wraps it in the versioned snapshot format).
  virtual absl::StatusOr<std::vector<uint8_t>> SaveState(int slot, int32_t n_past) const = 0;
  virtual absl::Status LoadState(int slot, int32_t n_past, std::span<const uint8_t> bytes) = 0;
  virtual std::string state_layout() const = 0;
  // Prefix cache (issue #17, device tier): a copy of the slot's state in SaveState's layout kept
  // in device memory the device allocates for it (*bytes of it; ResourceExhausted when none is
  // free), and its load back into a slot (device-to-device, through the slot's page table as
  // LoadState). Devices without it keep the default: the caller falls back to SaveState bytes.
  virtual bool HasDeviceStateCopies() const { return false; }
  virtual absl::StatusOr<std::shared_ptr<void>> SaveStateOnDevice(int slot, int32_t n_past,
                                                                  uint64_t* bytes) const {
    return absl::UnimplementedError("device state copies are not implemented by " + name());
  }
  virtual absl::Status LoadStateFromDevice(int slot, int32_t n_past, const void* src,
                                           uint64_t bytes) {
    return absl::UnimplementedError("device state copies are not implemented by " + name());
  }

  // The slot's recurrent state becomes the one kept in speculative entry `entry` by the last
  // Forward (RowRun::spec_entry); its KV rows need nothing (the runner shortens the slot).
  virtual absl::Status CommitSpeculative(int slot, int entry) {
    return absl::UnimplementedError("speculative steps are not implemented by device " + name());
  }

  // MTP draft step (Backend::MtpStep); arguments already validated by the runner.
  virtual absl::Status MtpStep(int slot, int32_t token, int32_t pos, std::span<const float> hidden,
                               std::vector<float>* logits, std::vector<float>* hidden_out) {
    return absl::UnimplementedError("MTP is not implemented by device " + name());
  }
  // Backend::MtpRows; arguments validated by the runner. The default runs MtpStep row by row.
  virtual absl::Status MtpRows(int slot, int32_t pos0, std::span<const int32_t> tokens,
                               std::span<const float> hidden, int64_t n_embd,
                               std::vector<float>* logits, std::vector<float>* hidden_out) {
    for (size_t i = 0; i < tokens.size(); ++i)
      DS_RETURN_IF_ERROR(MtpStep(slot, tokens[i], pos0 + static_cast<int32_t>(i),
                                 hidden.subspan(i * n_embd, n_embd), logits, hidden_out));
    return absl::OkStatus();
  }
  // SeqStep::fill_mtp for one run of the last micro-step: the MTP layer's K/V at positions
  // [run.pos0, run.pos0 + n) of run.slot from the run's rows (their final states, normed here by
  // the output norm as Head does) paired with the token after each — the next row's id, and
  // `next` for the run's last row (next < 0: that row is skipped, n = run.n - 1) — exactly as
  // MtpRows over those hidden rows and tokens would write them (no logits, no draft state).
  // Called after Head, before Finish; arguments validated by the runner.
  virtual absl::Status MtpFill(const RowRun& run, int32_t next) {
    return absl::UnimplementedError("MTP is not implemented by device " + name());
  }
  // Greedy MTP drafts from the last micro-step (Backend::MtpDraftGreedy): MtpRows over `tokens`
  // at pos0 whose hidden rows are rows [hidden_row0, hidden_row0 + n) of the last micro-step's
  // n_logit_rows final-normed states, then n_drafts tokens, each the argmax (lowest id on ties)
  // of an MTP pass's logits and the token of the next pass (MtpStep). The default reads the
  // hidden rows back (ReadHidden) and runs MtpRows / MtpStep with the argmax on the host; a
  // device keeps it all where the model runs.
  //
  // drafts == nullptr (only where KeepsDeferredDrafts()): the drafts stay in the slot's draft
  // buffer on the device, the call does not wait for them, and a host copy follows them (read by
  // DeferredDrafts once the device has finished later work).
  virtual absl::Status MtpDraftGreedy(int slot, int32_t pos0, std::span<const int32_t> tokens,
                                      int hidden_row0, int n_logit_rows, int64_t n_embd,
                                      int n_drafts, int32_t* drafts) {
    if (!drafts) return absl::InternalError("MtpDraftGreedy: drafts left on a device without them");
    std::vector<float> hid(static_cast<size_t>(n_logit_rows) * n_embd), logits, h, chain;
    DS_RETURN_IF_ERROR(ReadHidden(n_logit_rows, hid.data()));
    DS_RETURN_IF_ERROR(Finish());
    const size_t n = tokens.size();
    DS_RETURN_IF_ERROR(MtpRows(slot, pos0, tokens,
                               std::span<const float>(hid).subspan(hidden_row0 * n_embd, n * n_embd),
                               n_embd, &logits, &h));
    for (int j = 0; j < n_drafts; ++j) {
      if (j > 0) {
        chain = h;
        DS_RETURN_IF_ERROR(MtpStep(slot, drafts[j - 1], pos0 + static_cast<int32_t>(n) - 1 + j,
                                   chain, &logits, &h));
      }
      drafts[j] = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                       logits.begin());  // the first maximum: lowest id on ties
    }
    return absl::OkStatus();
  }
  // Deferred drafts (Backend::MtpDraftDeferred) kept where the chain made them: MtpDraftGreedy
  // takes drafts == nullptr and Prepare fills MicroStep::chain_tokens from the slot's buffer.
  // Otherwise (the default) the runner waits for the drafts and puts them in on the host.
  virtual bool KeepsDeferredDrafts() const { return false; }
  // The host copy of the slot's last deferred drafts [0, n): valid after the Finish of a
  // micro-step queued behind that chain.
  virtual absl::Status DeferredDrafts(int slot, int n, int32_t* out) {
    return absl::UnimplementedError("deferred drafts are not kept by device " + name());
  }
  // A deferred draft chain judged on the device (StepOptions::chain_after): called after the
  // micro-step's Sample, before its Finish, for a speculative run of n_rows rows at pos0 whose
  // output rows are [row, row + n_rows) of this micro-step, every one sampled on the device, and
  // whose drafts came from the slot's last deferred chain (SeqStep::chain_drafts) when
  // chain_drafts, else there were none (n_rows == 1). Queues the chain MtpDraftGreedy(slot, pos0,
  // [d_1..d_kept, y_kept], row, ..., n_drafts, nullptr) would run, with kept judged on the device
  // from the sampled tokens, so that it runs while the host judges them too and queues the next
  // step; Finish then waits for the micro-step only. False (nothing queued): not here (the
  // runner queues the chain after the Forward instead).
  virtual absl::StatusOr<bool> QueueChainAfterVerify(int slot, int32_t pos0, int row, int n_rows,
                                                     bool chain_drafts, int n_drafts) {
    return false;
  }
  // After the Finish of that micro-step: the host's kept (the same as the device's: the same
  // tokens), so the device knows how far the chain wrote the slot's MTP rows.
  virtual void ChainAfterVerifyKept(int slot, int32_t pos0, int kept, int n_drafts) {}
};

}  // namespace ds
