#include "tools/bench/mtp_cost.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/sampling/sampling_params.h"

namespace ds {
namespace {

// Median wall milliseconds of `iters` calls; every call ends in a host sync inside the backend
// (outputs come back), so wall time is device time plus launch overhead.
absl::StatusOr<double> MedianMs(int iters, const std::function<absl::Status()>& body) {
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    DS_RETURN_IF_ERROR(body());
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int MtpCostSlotCtx(const MtpCostOptions& o) {
  // Per repetition (and warm-ups): decode +1, four verifies (device, host, the chain cycle, the
  // deferred cycle) +1 each, decode_path +k+1; the MTP calls write up to k + 2 rows past the
  // length.
  return o.depth + (o.iters + 10) * (o.k + 6) + o.k + 64;
}

absl::StatusOr<MtpCost> MeasureMtpCost(Backend& be, const MtpCostOptions& o) {
  const int B = o.streams, k = o.k;
  if (B < 1 || k < 1 || o.depth < 2 || o.iters < 1)
    return absl::InvalidArgumentError("MTP cost: streams, k, iters >= 1 and depth >= 2");
  if (be.n_slots() < B || be.slot_ctx() < MtpCostSlotCtx(o))
    return absl::InvalidArgumentError(absl::StrCat("MTP cost: need ", B, " slots of ",
                                                   MtpCostSlotCtx(o), " tokens"));
  if (be.max_speculative_tokens() < k + 1 || be.max_speculative_seqs() < B)
    return absl::FailedPreconditionError(absl::StrCat(
        "MTP cost: the backend verifies ", be.max_speculative_tokens(), " tokens x ",
        be.max_speculative_seqs(), " sequences; ", k + 1, " x ", B, " needed (SpeculativeRoom)"));
  const int V = be.config().n_vocab, H = be.config().n_embd;
  MtpCost c;
  std::vector<SeqStep> batch(B);
  StepOutput out;
  for (int i = 0; i < B; ++i) {
    be.ResetSlot(i);
    batch[i] = SeqStep{};
    batch[i].slot = i;
    for (int t = 0; t < o.depth; ++t) batch[i].tokens.push_back((t * 7919 + 13 + i) % V);
  }
  // Stream 0's prompt twice without the MTP fill (the first warms the prefill shapes up), once
  // with it; every prompt then holds the MTP layer's KV over its rows, as a served sequence does
  // (the draft attention reads depth rows).
  auto timed = [&](std::span<const SeqStep> b) -> absl::StatusOr<double> {
    const auto t0 = std::chrono::steady_clock::now();
    DS_RETURN_IF_ERROR(be.Forward(b, StepOptions{}, &out));
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
        .count();
  };
  for (int rep = 0; rep < 2; ++rep) {
    be.ResetSlot(0);
    DS_ASSIGN_OR_RETURN(c.prompt_plain_ms, timed({&batch[0], 1}));
  }
  be.ResetSlot(0);
  for (SeqStep& s : batch) s.fill_mtp = true;
  DS_ASSIGN_OR_RETURN(c.prompt_fill_ms, timed({&batch[0], 1}));
  if (B > 1) DS_RETURN_IF_ERROR(be.Forward(std::span<const SeqStep>(batch).subspan(1), {}, &out));
  for (SeqStep& s : batch) s.fill_mtp = false;
  std::vector<float> lg, ho;

  sampling::SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<DeviceSampleRow> rows(static_cast<size_t>(B) * (k + 1));
  for (auto& r : rows) {
    r.mode = DeviceSampleRow::Mode::kSample;
    r.params = &greedy;
  }
  // kVerifyChain: kVerifyDevice whose drafts are the ones each stream's last deferred chain left
  // on the device (SeqStep::chain_drafts).
  enum class Shape { kDecode, kVerifyDevice, kVerifyHost, kPath, kVerifyChain };
  auto q_speculative = [](Shape s) {
    return s == Shape::kVerifyDevice || s == Shape::kVerifyHost || s == Shape::kVerifyChain;
  };
  auto step = [&](Shape s) -> absl::Status {
    size_t n_out = 0;
    for (int i = 0; i < B; ++i) {
      SeqStep& q = batch[i];
      q = SeqStep{};
      q.slot = i;
      q.pos0 = be.SlotLength(i);
      q.tokens.assign(s == Shape::kDecode ? 1 : k + 1, 17);
      for (size_t t = 0; t < q.tokens.size(); ++t) q.tokens[t] += static_cast<int32_t>(t);
      q.all_logits = s != Shape::kDecode;
      q.speculative = q_speculative(s);
      q.chain_drafts = s == Shape::kVerifyChain;
      q.decode_path = s == Shape::kPath;
      n_out += q.all_logits ? q.tokens.size() : 1;
    }
    StepOptions so;
    if (s == Shape::kVerifyHost) so.want_hidden = true;  // logits too: no device rows
    // (A backend without device sampling, the CPU's, returns the logits instead.)
    else if (be.SupportsDeviceSampling())
      so.device_sample = std::span<const DeviceSampleRow>(rows.data(), n_out);
    DS_RETURN_IF_ERROR(be.Forward(batch, so, &out));
    if (q_speculative(s))
      for (int i = 0; i < B; ++i) DS_RETURN_IF_ERROR(be.CommitSpeculative(i, 1));
    return absl::OkStatus();
  };
  for (int w = 0; w < 3; ++w) {  // graph capture, lazily created state
    DS_RETURN_IF_ERROR(step(Shape::kDecode));
    DS_RETURN_IF_ERROR(step(Shape::kVerifyDevice));
    DS_RETURN_IF_ERROR(step(Shape::kVerifyHost));
  }
  DS_ASSIGN_OR_RETURN(c.decode_ms, MedianMs(o.iters, [&] { return step(Shape::kDecode); }));
  DS_ASSIGN_OR_RETURN(c.verify_dev_ms,
                      MedianMs(o.iters, [&] { return step(Shape::kVerifyDevice); }));
  DS_ASSIGN_OR_RETURN(c.verify_host_ms,
                      MedianMs(o.iters, [&] { return step(Shape::kVerifyHost); }));
  if (o.profile) {
    for (const Shape sh : {Shape::kDecode, Shape::kVerifyDevice}) {
      const char* name = sh == Shape::kDecode ? "decode" : "verify(dev)";
      o.profile(name, true);
      for (int r = 0; r < 8; ++r) DS_RETURN_IF_ERROR(step(sh));
      o.profile(name, false);
    }
  }
  if (o.decode_path) {
    DS_RETURN_IF_ERROR(step(Shape::kPath));
    DS_ASSIGN_OR_RETURN(c.path_ms, MedianMs(o.iters, [&] { return step(Shape::kPath); }));
  }
  if (be.SupportsDraftChain()) {
    const std::vector<int32_t> one = {17};
    std::vector<int32_t> drafts;
    auto cycle = [&]() -> absl::Status {
      DS_RETURN_IF_ERROR(step(Shape::kVerifyDevice));
      for (int i = 0; i < B; ++i)
        DS_RETURN_IF_ERROR(be.MtpDraftGreedy(i, be.SlotLength(i) - 1, one, i * (k + 1), k, &drafts));
      return absl::OkStatus();
    };
    absl::Status st;
    for (int w = 0; w < 3 && st.ok(); ++w) st = cycle();  // eager, capture, replay
    if (st.ok()) {
      DS_ASSIGN_OR_RETURN(c.cycle_ms, MedianMs(o.iters, cycle));
      // The same cycle with the drafts deferred (Backend::MtpDraftDeferred): the verify takes
      // them where the chain left them, the host waits once per cycle.
      bool deferred = false;
      auto cycle_deferred = [&]() -> absl::Status {
        DS_RETURN_IF_ERROR(step(deferred ? Shape::kVerifyChain : Shape::kVerifyDevice));
        for (int i = 0; i < B; ++i)
          DS_RETURN_IF_ERROR(be.MtpDraftDeferred(i, be.SlotLength(i) - 1, one, i * (k + 1), k));
        deferred = true;
        return absl::OkStatus();
      };
      for (int w = 0; w < 3; ++w) DS_RETURN_IF_ERROR(cycle_deferred());
      DS_ASSIGN_OR_RETURN(c.cycle_deferred_ms, MedianMs(o.iters, cycle_deferred));
      // Take the last drafts: the slots end with nothing pending.
      DS_RETURN_IF_ERROR(step(Shape::kVerifyChain));
    } else if (st.code() != absl::StatusCode::kFailedPrecondition) {
      return st;  // (FailedPrecondition: the verify rows did not fit one micro-step: no figure)
    }
  }
  // Drafts of stream 0 after a verify: the catch-up rows from the verify's first position, then
  // chained steps past them.
  const std::vector<int32_t> toks(k + 1, 17);
  const std::vector<float> h(static_cast<size_t>(k + 1) * H, 0.01f);
  const int32_t p0 = be.SlotLength(0) - 1;
  auto rows_call = [&](int n) {
    return be.MtpRows(0, p0, std::span<const int32_t>(toks).first(n),
                      std::span<const float>(h).first(static_cast<size_t>(n) * H), &lg, &ho);
  };
  DS_RETURN_IF_ERROR(rows_call(1));
  DS_ASSIGN_OR_RETURN(c.rows1_ms, MedianMs(o.iters, [&] { return rows_call(1); }));
  DS_ASSIGN_OR_RETURN(c.rows_k1_ms, MedianMs(o.iters, [&] { return rows_call(k + 1); }));
  std::vector<float> hd(H, 0.01f);
  DS_ASSIGN_OR_RETURN(c.step_ms, MedianMs(o.iters, [&] {
                        return be.MtpStep(0, 17, p0 + k + 1, hd, &lg, &ho);
                      }));
  return c;
}

double MtpTokensPerStep(int k, std::span<const double> rates) {
  double tokens = 1, run = 1;
  for (int i = 0; i < k; ++i) {
    run *= rates.empty() ? 0.0 : rates[std::min<size_t>(i, rates.size() - 1)];
    tokens += run;
  }
  return tokens;
}

double MtpProjectedTokS(const MtpCost& c, const MtpCostOptions& o, std::span<const double> rates) {
  const int k = o.k;
  // P(kept = j): drafts 1..j kept, j + 1 not (j = k: all kept); the catch-up is j + 1 rows.
  double draft = (k - 1) * c.step_ms, run = 1;
  for (int j = 0; j <= k; ++j) {
    const double r = j < k && !rates.empty() ? rates[std::min<size_t>(j, rates.size() - 1)] : 0.0;
    const double p = j < k ? run * (1 - r) : run;
    draft += p * (c.rows1_ms + (c.rows_k1_ms - c.rows1_ms) * j / k);
    run *= r;
  }
  const double step_ms = c.verify_host_ms + o.streams * draft;
  return o.streams * MtpTokensPerStep(k, rates) / (step_ms * 1e-3);
}

double MtpChainProjectedTokS(const MtpCost& c, const MtpCostOptions& o,
                             std::span<const double> rates) {
  return c.cycle_ms > 0 ? o.streams * MtpTokensPerStep(o.k, rates) / (c.cycle_ms * 1e-3) : 0.0;
}

}  // namespace ds
