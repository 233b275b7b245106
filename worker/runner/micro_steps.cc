#include "worker/runner/micro_steps.h"

#include <algorithm>

namespace ds {

std::vector<std::vector<StepPiece>> SplitIntoMicroSteps(std::span<const SeqStep> batch,
                                                        int max_rows, int max_logit_rows,
                                                        int max_decode_rows) {
  // A budget below one row could never be met (every piece would wait for the next micro-step):
  // treat it as no budget, so a device that leaves the field unset cannot hang the runner.
  if (max_decode_rows < 1) max_decode_rows = 1 << 30;
  std::vector<std::vector<StepPiece>> steps;
  std::vector<StepPiece> cur;
  int rows = 0, logit_rows = 0, decode_rows = 0;
  auto flush = [&] {
    if (!cur.empty()) steps.push_back(std::move(cur));
    cur.clear();
    rows = 0;
    logit_rows = 0;
    decode_rows = 0;
  };
  for (int i = 0; i < static_cast<int>(batch.size()); ++i) {
    const SeqStep& s = batch[i];
    const int n = static_cast<int>(s.tokens.size());
    const bool decode_path = s.decode_path || s.speculative;
    for (int t0 = 0; t0 < n;) {
      int take = std::min(n - t0, max_rows - rows);
      if (s.all_logits)
        take = std::min(take, max_logit_rows - logit_rows);
      else if (t0 + take == n && logit_rows >= max_logit_rows)
        take = 0;  // the last piece needs a logit row of its own
      if (decode_path)
        take = std::min(take, max_decode_rows - decode_rows);
      else if (take == 1 && decode_rows >= max_decode_rows)
        take = 0;  // a one-token piece runs through the decode kernels too
      if (take <= 0) {
        flush();
        continue;
      }
      const bool last = t0 + take == n;
      cur.push_back({i, t0, take, last});
      rows += take;
      logit_rows += s.all_logits ? take : (last ? 1 : 0);
      decode_rows += decode_path || take == 1 ? take : 0;
      t0 += take;
      if (rows == max_rows) flush();
    }
  }
  flush();
  return steps;
}

void BuildMicroStep(std::span<const SeqStep> batch, std::span<const StepPiece> pieces,
                    MicroStep* out, std::span<const int32_t> spec_base,
                    std::span<const int32_t> device_slot) {
  out->ids.clear();
  out->slots.clear();
  out->positions.clear();
  out->runs.clear();
  out->logit_rows.clear();
  out->chain_tokens.clear();
  bool pure_decode = true, decode_only = true;
  int32_t row = 0;
  for (const StepPiece& p : pieces) {
    const SeqStep& s = batch[p.seq];
    const int32_t pos0 = s.pos0 + p.t0;
    const int32_t base = spec_base.empty() ? -1 : spec_base[p.seq];
    const int32_t slot = device_slot.empty() ? s.slot : device_slot[p.seq];
    out->runs.push_back(
        {row, p.n, slot, pos0, s.decode_path || s.speculative, base < 0 ? -1 : base + p.t0});
    if (s.chain_drafts) {  // tokens[1..] are the slot's deferred drafts 0..
      const int32_t first_tok = std::max(p.t0, 1);
      if (first_tok < p.t0 + p.n)
        out->chain_tokens.push_back(
            {row + first_tok - p.t0, slot, first_tok - 1, p.t0 + p.n - first_tok});
    }
    for (int t = 0; t < p.n; ++t) {
      out->ids.push_back(s.tokens[p.t0 + t]);
      out->slots.push_back(slot);
      out->positions.push_back(pos0 + t);
      if (s.all_logits || (p.last && t == p.n - 1)) out->logit_rows.push_back(row + t);
    }
    pure_decode = pure_decode && p.n == 1 && p.last && !s.all_logits;
    decode_only = decode_only && out->runs.back().decode_like();
    row += p.n;
  }
  out->pure_decode = pure_decode && !pieces.empty();
  out->decode_only = decode_only && !pieces.empty();
}

}  // namespace ds
