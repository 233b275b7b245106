// MTP speculative decoding on the CUDA device (issue #15; label `gpu`, not run in CI; on a device:
// tools/device/mtp_gpu_check.sh), on tiny synthetic models with an MTP block:
//
//  * MtpSteps: CUDA MtpStep against the CPU reference over a prompt's MTP rows (with a gap of
//    rows never written, which both must mask out) and three chained draft steps, then a
//    rollback (rewriting an earlier row drops the later ones). Both devices get the same inputs
//    (the CPU's hidden states and tokens); logits and draft hidden states within the bounds of
//    gpu_vs_cpu_test (F32 2e-3, quantized 0.3).
//  * VerifyThenCommit: a speculative verify of k+1 = 4 tokens, then CommitSpeculative(n_keep)
//    for every n_keep, then one more decode token, against a slot that only ever saw the kept
//    tokens (as decode_path: the same decode kernels): the verify logits of the kept rows and the
//    next step's logits are bit-identical. Also with micro-steps of 3 rows, so that a
//    speculative run is cut in two and its second piece continues from the first's entry.
//  * MtpRows: n = 1..5 catch-up rows of one slot in one call (and the prompt's rows), against n
//    MtpStep calls on CUDA (tight bound: only the K/V matmuls' row count differs) and against
//    the CPU (gpu_vs_cpu bounds), each followed by a chained MtpStep; also with the device's
//    pass capped at 3 rows (max_step_tokens 3), so longer runs go in chunks.
//  * DraftChain: MtpDraftGreedy (drafts on the device, graph-replayed) against the host path.
//  * Fill: SeqStep::fill_mtp (the MTP K/V written inside prefill Forwards, across micro-steps)
//    against MtpRows over the prompt's hidden rows.
//  * SavedStatesCarryTheMtpRows: host snapshots and device checkpoints restore the MTP rows.
//  * SampledWithDraftsEqualsPlainSamplingPerSeed: sampled MTP on the device path gives plain
//    sampling's tokens per seed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/util/model_alias.h"
#include "common/util/status.h"
#include "tests/gpu_test_options.h"
#include "tests/model/mtp_gpu_fixtures.h"
#include "tools/synth/synth.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_options.h"
#include "worker/model/backend.h"
#include "worker/spec/mtp_speculator.h"

namespace ds {
namespace {

using namespace mtp_test;  // the shared fixtures of the MTP GPU tests (mtp_gpu_fixtures.h)

constexpr Model kModels[] = {{"F32", GgmlType::F32, 2e-3}, {"Q8_0", GgmlType::Q8_0, 0.3}};

class Mtp : public ::testing::TestWithParam<Model> {};

TEST_P(Mtp, MtpStepsMatchCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const Model& m = GetParam();
  auto file = Synth(m);
  ASSERT_TRUE(file);
  auto cpu = CreateCpuBackend(file, Opts());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = Cuda(file);
  ASSERT_TRUE(gpu);
  const int V = (*cpu)->config().n_vocab, H = (*cpu)->config().n_embd;
  // The prompt on the CPU: its final-normed hidden states feed both devices' MTP.
  SeqStep s;
  s.slot = 1;
  s.tokens = Prompt(kPrompt, V);
  s.all_logits = true;
  StepOptions so;
  so.want_hidden = true;
  StepOutput out;
  ASSERT_TRUE((*cpu)->Forward({&s, 1}, so, &out).ok());
  ASSERT_EQ(out.hidden.size(), static_cast<size_t>(kPrompt) * H);
  // The GPU's slot holds the same prompt (its main KV is not read by the MTP, but the runner
  // maps pages as the slot grows; an MTP row past the length maps its own).
  StepOutput gout;
  ASSERT_TRUE(gpu->Forward({&s, 1}, StepOptions{}, &gout).ok());

  double worst = 0;
  auto step = [&](int32_t tok, int32_t pos, std::span<const float> h, const char* what,
                  std::vector<float>* h_next, int32_t* d_next) {
    std::vector<float> cl, ch, gl, gh;
    absl::Status a = (*cpu)->MtpStep(1, tok, pos, h, &cl, &ch);
    absl::Status b = gpu->MtpStep(1, tok, pos, h, &gl, &gh);
    ASSERT_TRUE(a.ok()) << a;
    ASSERT_TRUE(b.ok()) << b;
    const double rl = RelDiff(gl, cl), rh = RelDiff(gh, ch);
    worst = std::max({worst, rl, rh});
    EXPECT_LE(rl, m.bound) << what << " pos " << pos << " logits";
    EXPECT_LE(rh, m.bound) << what << " pos " << pos << " hidden";
    if (h_next) *h_next = ch;
    if (d_next) *d_next = Argmax(cl.data(), V);
  };
  // MTP rows over the prompt (row t pairs h_t with x_{t+1}), leaving rows 10..14 unwritten.
  for (int t = 0; t + 1 < kPrompt; ++t) {
    if (t >= 10 && t < 15) continue;
    step(s.tokens[t + 1], t, std::span<const float>(out.hidden).subspan(t * H, H), "prompt",
         nullptr, nullptr);
  }
  // Three chained drafts from the last position: (x_P, h_{P-1}) at P-1, then (d_j, h'_j).
  const int last = Argmax(out.logits.data() + static_cast<size_t>(kPrompt - 1) * V, V);
  std::vector<float> h(out.hidden.end() - H, out.hidden.end());
  int32_t tok = last;
  for (int j = 0; j < 3; ++j) {
    std::vector<float> hn;
    int32_t d = 0;
    step(tok, kPrompt - 1 + j, h, "draft", &hn, &d);
    h = hn;
    tok = d;
  }
  // Rollback: rewrite row P-1 (drops the draft rows P and P+1), then draft once more.
  std::vector<float> hn;
  int32_t d = 0;
  step(last, kPrompt - 1, std::span<const float>(out.hidden).subspan((kPrompt - 1) * H, H),
       "rewrite", &hn, &d);
  step(d, kPrompt, hn, "after rollback", nullptr, nullptr);
  std::printf("mtp_gpu %-5s MtpStep max rel %.3e (bound %.1e)\n", m.name, worst, m.bound);
}

// MtpRows (the catch-up rows after a verify: n rows of one slot in one pass) against n MtpStep
// calls on the same device and against the CPU (whose MtpRows is the MtpStep loop), n = 1..5,
// each followed by a chained MtpStep that attends to the rows just written. Every n starts two
// rows earlier than the last, so each call also drops rows written before (rejected drafts).
// max_step_tokens 3 caps the device's MtpRows pass at 3 rows: the prompt's rows and n > 3 go
// in chunks.
void MtpRowsCase(const Model& m, int max_step_tokens) {
  SCOPED_TRACE(::testing::Message() << m.name << " max_step_tokens " << max_step_tokens);
  auto file = Synth(m);
  ASSERT_TRUE(file);
  auto cpu = CreateCpuBackend(file, Opts());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = Cuda(file, max_step_tokens);
  ASSERT_TRUE(gpu);
  const int V = (*cpu)->config().n_vocab, H = (*cpu)->config().n_embd;
  SeqStep s;
  s.slot = 1;
  s.tokens = Prompt(kPrompt, V);
  s.all_logits = true;
  StepOptions so;
  so.want_hidden = true;
  StepOutput out;
  ASSERT_TRUE((*cpu)->Forward({&s, 1}, so, &out).ok());
  // GPU slot 0 takes MtpRows, slot 1 the same rows one MtpStep at a time.
  for (int slot : {0, 1}) {
    SeqStep g = s;
    g.slot = slot;
    StepOutput gout;
    ASSERT_TRUE(gpu->Forward({&g, 1}, StepOptions{}, &gout).ok());
  }
  const std::span<const float> hid(out.hidden);
  struct Out {
    std::vector<float> logits, hidden;
  };
  // Rows [p0, p0 + n): hidden row p0 + i with token p0 + i + 1.
  auto rows = [&](Backend& be, int slot, int p0, int n, bool one_call, Out* o) -> absl::Status {
    const std::span<const int32_t> toks(s.tokens.data() + p0 + 1, n);
    const std::span<const float> h = hid.subspan(static_cast<size_t>(p0) * H,
                                                 static_cast<size_t>(n) * H);
    if (one_call) return be.MtpRows(slot, p0, toks, h, &o->logits, &o->hidden);
    for (int i = 0; i < n; ++i)
      DS_RETURN_IF_ERROR(be.MtpStep(slot, toks[i], p0 + i, h.subspan(static_cast<size_t>(i) * H, H),
                                    &o->logits, &o->hidden));
    return absl::OkStatus();
  };
  // Tight bound between the device's two paths: they differ only in how many rows the K/V
  // matmuls take at once (up to 32 rows the column kernels, each row as alone; the 39 prompt
  // rows take dequantization + cuBLAS: fp32 on F32, f16 activations on Q8_0 instead of int8).
  const double same_bound = m.type == GgmlType::F32 ? 1e-4 : 2e-2;
  double worst_cpu = 0, worst_same = 0;
  auto compare = [&](const Out& a, const Out& b, const Out& c, const std::string& what) {
    const double r_same = std::max(RelDiff(a.logits, b.logits), RelDiff(a.hidden, b.hidden));
    const double r_cpu = std::max(RelDiff(a.logits, c.logits), RelDiff(a.hidden, c.hidden));
    worst_same = std::max(worst_same, r_same);
    worst_cpu = std::max(worst_cpu, r_cpu);
    EXPECT_LE(r_same, same_bound) << what << ": MtpRows vs MtpStep calls on CUDA";
    EXPECT_LE(r_cpu, m.bound) << what << ": CUDA MtpRows vs the CPU";
    ASSERT_EQ(a.logits.size(), static_cast<size_t>(V));
    ASSERT_EQ(a.hidden.size(), static_cast<size_t>(H));
  };
  {  // The prompt's rows [0, P - 1) (the speculator's Start).
    Out a, b, c;
    ASSERT_TRUE(rows(*gpu, 0, 0, kPrompt - 1, true, &a).ok());
    ASSERT_TRUE(rows(*gpu, 1, 0, kPrompt - 1, false, &b).ok());
    ASSERT_TRUE(rows(**cpu, 1, 0, kPrompt - 1, true, &c).ok());
    compare(a, b, c, "prompt rows");
  }
  for (int n = 1; n <= 5; ++n) {
    const int p0 = 32 - 2 * n;
    const std::string what = "n " + std::to_string(n) + " at " + std::to_string(p0);
    Out a, b, c;
    absl::Status st = rows(*gpu, 0, p0, n, true, &a);
    ASSERT_TRUE(st.ok()) << st;
    st = rows(*gpu, 1, p0, n, false, &b);
    ASSERT_TRUE(st.ok()) << st;
    st = rows(**cpu, 1, p0, n, true, &c);
    ASSERT_TRUE(st.ok()) << st;
    compare(a, b, c, what);
    // A chained draft step on each: the CPU's draft token and draft hidden state at p0 + n.
    const int32_t d = Argmax(c.logits.data(), V);
    const std::vector<float> h = c.hidden;
    Out a2, b2, c2;
    ASSERT_TRUE(gpu->MtpStep(0, d, p0 + n, h, &a2.logits, &a2.hidden).ok());
    ASSERT_TRUE(gpu->MtpStep(1, d, p0 + n, h, &b2.logits, &b2.hidden).ok());
    ASSERT_TRUE((*cpu)->MtpStep(1, d, p0 + n, h, &c2.logits, &c2.hidden).ok());
    compare(a2, b2, c2, what + ", then a chained MtpStep");
  }
  std::printf("mtp_gpu %-5s MtpRows (pass <= %d rows): max rel vs MtpStep calls %.3e (bound %.0e), "
              "vs CPU %.3e (bound %.1e)\n",
              m.name, max_step_tokens > 0 ? std::min(max_step_tokens, 64) : 64, worst_same,
              same_bound, worst_cpu, m.bound);
}

TEST_P(Mtp, MtpRowsMatchesStepsAndCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  MtpRowsCase(GetParam(), 0);
}

TEST_P(Mtp, MtpRowsInChunks) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  MtpRowsCase(GetParam(), 3);
}

// SeqStep::fill_mtp on CUDA (Device::MtpFill): the prompt in two Forwards cut at 17, the MTP
// K/V written inside them (mtp_next pairs row 16 with token 17), against the same Forwards with
// every row's hidden state followed by MtpRows over the prompt's rows (the old Start). An MtpRows
// at the prompt's last position then attends over all rows on both slots: its logits and draft
// state agree within the tight bound of MtpRowsCase (only the K/V matmuls' row counts differ).
// max_step_tokens 7: micro-steps of 7 rows, so fills run per piece and pieces hand their last
// row's token over.
void FillCase(const Model& m, int max_step_tokens) {
  SCOPED_TRACE(::testing::Message() << m.name << " max_step_tokens " << max_step_tokens);
  auto file = Synth(m);
  ASSERT_TRUE(file);
  auto gpu = Cuda(file, max_step_tokens);
  ASSERT_TRUE(gpu);
  const int V = gpu->config().n_vocab, H = gpu->config().n_embd;
  const std::vector<int32_t> prompt = Prompt(kPrompt, V);
  const int cut = 17;
  std::vector<float> hidden;  // slot 0's rows
  for (const auto& [c0, c1] : {std::pair{0, cut}, std::pair{cut, kPrompt}}) {
    SeqStep s;
    s.pos0 = c0;
    s.tokens.assign(prompt.begin() + c0, prompt.begin() + c1);
    s.all_logits = true;
    StepOptions so;
    so.want_hidden = true;
    StepOutput out;
    absl::Status st = gpu->Forward({&s, 1}, so, &out);
    ASSERT_TRUE(st.ok()) << st;
    hidden.insert(hidden.end(), out.hidden.begin(), out.hidden.end());
    s.slot = 1;
    s.all_logits = false;
    s.fill_mtp = true;
    s.mtp_next = c1 < kPrompt ? prompt[c1] : -1;
    st = gpu->Forward({&s, 1}, StepOptions{}, &out);
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_EQ(hidden.size(), static_cast<size_t>(kPrompt) * H);
  std::vector<float> la, ha, lb, hb;
  ASSERT_TRUE(gpu->MtpRows(0, 0, std::span<const int32_t>(prompt).subspan(1),
                           std::span<const float>(hidden).first((kPrompt - 1) * H), &la, &ha)
                  .ok());
  const int32_t next = 7;
  const std::span<const float> last = std::span<const float>(hidden).last(H);
  ASSERT_TRUE(gpu->MtpRows(0, kPrompt - 1, {&next, 1}, last, &la, &ha).ok());
  ASSERT_TRUE(gpu->MtpRows(1, kPrompt - 1, {&next, 1}, last, &lb, &hb).ok());
  const double bound = m.type == GgmlType::F32 ? 1e-4 : 2e-2;
  const double r = std::max(RelDiff(lb, la), RelDiff(hb, ha));
  EXPECT_LE(r, bound) << "filled in the Forwards vs MtpRows over the prompt";
  // Without the fill the last row attends to itself only: far from the reference (the test
  // can tell the two apart).
  gpu->ResetSlot(1);
  SeqStep s;
  s.slot = 1;
  s.tokens = prompt;
  StepOutput out;
  ASSERT_TRUE(gpu->Forward({&s, 1}, StepOptions{}, &out).ok());
  std::vector<float> lc, hc;
  ASSERT_TRUE(gpu->MtpRows(1, kPrompt - 1, {&next, 1}, last, &lc, &hc).ok());
  EXPECT_GT(RelDiff(hc, ha), 10 * bound);
  std::printf("mtp_gpu %-5s fill (micro-steps of %d rows): max rel vs MtpRows %.3e (bound %.0e), "
              "no fill %.3e\n",
              m.name, max_step_tokens > 0 ? max_step_tokens : 0, r, bound, RelDiff(hc, ha));
}

TEST_P(Mtp, FillInTheForwardMatchesMtpRows) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  FillCase(GetParam(), 0);
}

TEST_P(Mtp, FillAcrossMicroSteps) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  FillCase(GetParam(), 7);
}

// Snapshots and device checkpoints carry the MTP layer's rows (slot_bytes.h): a slot restored
// from either, then one MtpRows at the prompt's last position, gives bit for bit the logits and
// draft state of the slot it was saved from (the saved mask drops the last position's row,
// which MtpRows writes again on both).
TEST_P(Mtp, SavedStatesCarryTheMtpRows) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto file = Synth(GetParam());
  ASSERT_TRUE(file);
  auto gpu = Cuda(file);
  ASSERT_TRUE(gpu);
  const int V = gpu->config().n_vocab, H = gpu->config().n_embd;
  SeqStep s;
  s.tokens = Prompt(kPrompt, V);
  s.fill_mtp = true;
  StepOptions so;
  so.want_hidden = true;
  StepOutput out;
  ASSERT_TRUE(gpu->Forward({&s, 1}, so, &out).ok());
  const int32_t next = 11;
  const std::vector<float> last = out.hidden;  // [H]: the prompt's last row
  ASSERT_EQ(last.size(), static_cast<size_t>(H));
  std::vector<float> l0, h0;
  ASSERT_TRUE(gpu->MtpRows(0, kPrompt - 1, {&next, 1}, last, &l0, &h0).ok());
  auto snap = gpu->Snapshot(0);
  ASSERT_TRUE(snap.ok()) << snap.status();
  auto ckpt = gpu->SaveCheckpoint(0);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  for (const bool device : {false, true}) {
    SCOPED_TRACE(device ? "device checkpoint" : "host snapshot");
    gpu->ResetSlot(1);
    SeqStep other;  // slot 1's pages and MTP rows held another sequence before
    other.slot = 1;
    other.tokens = Prompt(kPrompt + 9, V - 1);
    other.fill_mtp = true;
    ASSERT_TRUE(gpu->Forward({&other, 1}, StepOptions{}, &out).ok());
    gpu->ResetSlot(1);
    absl::Status st = device ? gpu->LoadCheckpoint(1, **ckpt) : gpu->Restore(1, *snap);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(gpu->SlotLength(1), kPrompt);
    std::vector<float> l1, h1;
    ASSERT_TRUE(gpu->MtpRows(1, kPrompt - 1, {&next, 1}, last, &l1, &h1).ok());
    EXPECT_EQ(l1, l0);
    EXPECT_EQ(h1, h0);
  }
  // Without the rows (a slot that holds the prompt but never wrote its MTP K/V) the same call
  // differs: the comparison above can fail.
  gpu->ResetSlot(1);
  SeqStep plain = s;
  plain.slot = 1;
  plain.fill_mtp = false;
  ASSERT_TRUE(gpu->Forward({&plain, 1}, StepOptions{}, &out).ok());
  std::vector<float> l2, h2;
  ASSERT_TRUE(gpu->MtpRows(1, kPrompt - 1, {&next, 1}, last, &l2, &h2).ok());
  EXPECT_NE(h2, h0);
}

// Prefill `prompt` into `slot` (after a reset).
void Prefill(Backend& be, int slot, const std::vector<int32_t>& prompt) {
  be.ResetSlot(slot);
  SeqStep s;
  s.slot = slot;
  s.tokens = prompt;
  StepOutput out;
  absl::Status st = be.Forward({&s, 1}, StepOptions{}, &out);
  ASSERT_TRUE(st.ok()) << st;
}

void VerifyThenCommit(const Model& m, int max_step_tokens) {
  auto file = Synth(m);
  ASSERT_TRUE(file);
  auto gpu = Cuda(file, max_step_tokens);
  ASSERT_TRUE(gpu);
  ASSERT_EQ(gpu->max_speculative_tokens(), 4);
  ASSERT_EQ(gpu->max_speculative_seqs(), 2);
  const int V = gpu->config().n_vocab;
  const std::vector<int32_t> prompt = Prompt(kPrompt, V);
  const std::vector<int32_t> verify = {11, 42, 7, 99};  // x_{t+1} and 3 drafts
  const int32_t next = 5;
  for (int n_keep = 1; n_keep <= 4; ++n_keep) {
    SCOPED_TRACE(::testing::Message() << m.name << " n_keep " << n_keep << " max_step_tokens "
                                      << max_step_tokens);
    // Slot 0: speculative verify, keep n_keep, then `next`.
    Prefill(*gpu, 0, prompt);
    SeqStep v;
    v.slot = 0;
    v.pos0 = kPrompt;
    v.tokens = verify;
    v.all_logits = true;
    v.speculative = true;
    StepOutput vout;
    absl::Status st = gpu->Forward({&v, 1}, StepOptions{}, &vout);
    ASSERT_TRUE(st.ok()) << st;
    st = gpu->CommitSpeculative(0, n_keep);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(gpu->SlotLength(0), kPrompt + n_keep);
    SeqStep a;
    a.slot = 0;
    a.pos0 = kPrompt + n_keep;
    a.tokens = {next};
    StepOutput aout;
    st = gpu->Forward({&a, 1}, StepOptions{}, &aout);
    ASSERT_TRUE(st.ok()) << st;

    // Slot 1: only the kept tokens (decode path), then `next`.
    Prefill(*gpu, 1, prompt);
    SeqStep k;
    k.slot = 1;
    k.pos0 = kPrompt;
    k.tokens.assign(verify.begin(), verify.begin() + n_keep);
    k.all_logits = true;
    k.decode_path = true;
    StepOutput kout;
    st = gpu->Forward({&k, 1}, StepOptions{}, &kout);
    ASSERT_TRUE(st.ok()) << st;
    SeqStep b = a;
    b.slot = 1;
    StepOutput bout;
    st = gpu->Forward({&b, 1}, StepOptions{}, &bout);
    ASSERT_TRUE(st.ok()) << st;

    ASSERT_EQ(vout.logits.size(), 4u * V);
    ASSERT_EQ(kout.logits.size(), static_cast<size_t>(n_keep) * V);
    EXPECT_EQ(std::memcmp(vout.logits.data(), kout.logits.data(), kout.logits.size() * 4), 0)
        << "verify rows differ from decoding the kept tokens";
    ASSERT_EQ(aout.logits.size(), bout.logits.size());
    EXPECT_EQ(std::memcmp(aout.logits.data(), bout.logits.data(), aout.logits.size() * 4), 0)
        << "after the commit: max rel " << RelDiff(aout.logits, bout.logits);
  }
}

TEST_P(Mtp, VerifyThenCommitEqualsKeptTokensOnly) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  VerifyThenCommit(GetParam(), 0);
}

TEST_P(Mtp, VerifyCutIntoMicroSteps) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  VerifyThenCommit(GetParam(), 3);
}

// The greedy draft chain (Backend::MtpDraftGreedy: hidden rows from the verify's last
// micro-step on the device, argmax fed to the next pass there, replayed from a graph from the
// second call of a shape on) against the host path on another slot with the same history:
// MtpRows over the catch-up rows with the hidden states read back, then MtpStep with the host's
// argmax. Same inputs, same kernels: the same drafts, round after round (eager, capture, replay)
// and with fewer catch-up rows; the last round drafts the most a request may ask for
// (kMaxMtpDrafts: the chain held 8 until 2026-12-07, and `--mtp 10` failed).
TEST_P(Mtp, DraftChainMatchesHostDrafts) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const Model& m = GetParam();
  auto file = Synth(m);
  ASSERT_TRUE(file);
  auto gpu = Cuda(file);
  ASSERT_TRUE(gpu);
  ASSERT_TRUE(gpu->SupportsDraftChain());
  const int V = gpu->config().n_vocab, H = gpu->config().n_embd;
  std::vector<int32_t> toks = Prompt(kPrompt, V);
  for (int slot : {0, 1}) {
    const absl::Status st = PrefillWithMtpRows(*gpu, slot, toks);
    ASSERT_TRUE(st.ok()) << st;
  }
  toks.push_back(3);
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(::testing::Message() << m.name << " round " << round);
    const int n_rows = round < 3 ? 4 : 2;  // catch-up rows: a new shape in round 3
    const int n_drafts = round < 4 ? 3 : sampling::kMaxMtpDrafts;
    const int32_t pos0 = static_cast<int32_t>(toks.size()) - 1;
    std::vector<int32_t> rows(toks.end() - 1, toks.end());
    for (int i = 1; i < n_rows; ++i) rows.push_back((round * 31 + i * 7) % V);
    std::vector<int32_t> catchup(rows.begin() + 1, rows.end());
    catchup.push_back((round * 13 + 1) % V);  // the token after the last row
    std::vector<int32_t> chain, host;
    for (int slot : {0, 1}) {
      SeqStep s;
      s.slot = slot;
      s.pos0 = pos0;
      s.tokens = rows;
      s.all_logits = true;
      s.decode_path = true;
      StepOptions o;
      o.want_hidden = slot == 1;
      StepOutput out;
      absl::Status st = gpu->Forward({&s, 1}, o, &out);
      ASSERT_TRUE(st.ok()) << st;
      if (slot == 0) {
        st = gpu->MtpDraftGreedy(0, pos0, catchup, 0, n_drafts, &chain);
        ASSERT_TRUE(st.ok()) << st;
        continue;
      }
      std::vector<float> l, h, ch;
      st = gpu->MtpRows(1, pos0, catchup, out.hidden, &l, &h);
      ASSERT_TRUE(st.ok()) << st;
      for (int j = 0; j < n_drafts; ++j) {
        if (j > 0) {
          ch = h;
          st = gpu->MtpStep(1, host.back(), pos0 + n_rows - 1 + j, ch, &l, &h);
          ASSERT_TRUE(st.ok()) << st;
        }
        host.push_back(Argmax(l.data(), V));
      }
      ASSERT_EQ(static_cast<int>(h.size()), H);
    }
    EXPECT_EQ(chain, host);
    toks.insert(toks.end(), catchup.begin(), catchup.end());
  }
}

// Sampling with drafts on the device (MtpSpeculator's draft-chain path: verify rows sampled where
// the logits are, each with the uniform of its position; drafts chained on the device) gives,
// per seed, the tokens of plain decoding sampled on the host: the verify rows run the decode
// kernels (decode_path), so their logits are a decode step's, and the device sampler picks the
// host sampler's token for the same uniform (kernels/cuda/README.md "Sampling v2").
TEST_P(Mtp, SampledWithDraftsEqualsPlainSamplingPerSeed) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const Model& m = GetParam();
  auto file = Synth(m);
  ASSERT_TRUE(file);
  auto gpu = Cuda(file);
  ASSERT_TRUE(gpu);
  ASSERT_TRUE(gpu->SupportsDraftChain() && gpu->SupportsDeviceSampling());
  const int V = gpu->config().n_vocab;
  const std::vector<int32_t> prompt = Prompt(kPrompt, V);
  const int kNew = 48;
  int64_t kept = 0;
  for (uint64_t seed : {11ULL, 12ULL, 13ULL}) {
    SCOPED_TRACE(::testing::Message() << m.name << " seed " << seed);
    sampling::SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 40;
    p.seed = seed;
    // Plain: one token per Forward, logits to the host, the host sampler.
    sampling::Sampler plain_sampler(p);
    std::vector<int32_t> plain = prompt;
    gpu->ResetSlot(0);
    SeqStep s;
    s.slot = 0;
    s.tokens = prompt;
    StepOutput out;
    ASSERT_TRUE(gpu->Forward({&s, 1}, StepOptions{}, &out).ok());
    while (static_cast<int>(plain.size() - prompt.size()) < kNew) {
      plain.push_back(plain_sampler.Sample(out.logits, plain).token);
      s.pos0 = static_cast<int32_t>(plain.size()) - 1;
      s.tokens = {plain.back()};
      s.decode_path = true;
      ASSERT_TRUE(gpu->Forward({&s, 1}, StepOptions{}, &out).ok());
    }
    // With three drafts per verify on slot 1.
    sampling::Sampler spec_sampler(p);
    gpu->ResetSlot(1);
    spec::SpecSequence seq;
    seq.slot = 1;
    seq.tokens = prompt;
    seq.sampler = &spec_sampler;
    seq.max_new = kNew;
    spec::MtpSpeculatorOptions so;
    so.k = 3;
    auto sp = spec::MtpSpeculator::Create(gpu.get(), so);
    ASSERT_TRUE(sp.ok()) << sp.status();
    spec::SpecSequence* seqs[] = {&seq};
    ASSERT_TRUE(sp->Start(seqs).ok());
    while (seq.n_generated() < kNew) {
      absl::Status st = sp->Step(seqs);
      ASSERT_TRUE(st.ok()) << st;
    }
    EXPECT_EQ(seq.tokens, plain);
    for (int64_t a : sp->stats().accepted) kept += a;
  }
  std::printf("%s: %lld drafts kept over 3 x %d sampled tokens\n", m.name,
              static_cast<long long>(kept), kNew);
}

INSTANTIATE_TEST_SUITE_P(Models, Mtp, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<Model>& i) {
                           return std::string(i.param.name);
                         });

// The coarse draft head (CudaBackendOptions::coarse_draft_head, kernels/cuda/draft_head.cuh)
// on a model whose head is tiled Q6_K (the 27B's width, 4 layers, 4,096 tokens): MtpStep's
// hidden state is the full head's bit for bit (the head only makes the logits), and its logits
// are the full head's within the coarse values' error (RMS under 8% of the logits' RMS, and not
// zero: the copy is coarse). Greedy outputs do not depend on it (verification runs the trunk).
TEST(MtpCoarseHead, DraftLogitsNearTheFullHeadsHiddenEqual) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  if (ds::testing::ForcePortable()) GTEST_SKIP() << "the portable path has no tiled layout";
  SynthOptions o = SynthOptions::Qwen27B();
  o.n_layer = 4;
  o.n_vocab = 4096;
  o.weight_type = GgmlType::Q6_K;
  o.quant_mode = SynthQuantMode::kRandomBlocks;
  o.seed = 9;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("ds_mtp_coarse_" + std::to_string(getpid()) + ".gguf"))
                               .string();
  ASSERT_TRUE(SynthesizeGguf(o, path).ok());
  auto opened = gguf::File::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::filesystem::remove(path);  // the mapping stays valid
  std::shared_ptr<const gguf::File> file(std::move(*opened));
  std::vector<float> logits[2], hidden[2];
  for (int coarse = 0; coarse < 2; ++coarse) {
    CudaBackendOptions c;
    c.spec_tokens = 4;
    c.spec_seqs = 1;
    c.coarse_draft_head = coarse == 1;
    auto b = CreateCudaBackend(file, Opts(), c);
    ASSERT_TRUE(b.ok()) << b.status();
    const int H = (*b)->config().n_embd, n_vocab = (*b)->config().n_vocab;
    SeqStep p;
    p.tokens = Prompt(12, n_vocab);
    StepOptions so;
    so.want_hidden = true;
    StepOutput out;
    ASSERT_TRUE((*b)->Forward({&p, 1}, so, &out).ok());
    ASSERT_GE(out.hidden.size(), static_cast<size_t>(H));  // the last row's is last
    const std::vector<float> h(out.hidden.end() - H, out.hidden.end());
    ASSERT_TRUE((*b)->MtpStep(0, 7, 11, h, &logits[coarse], &hidden[coarse]).ok());
    ASSERT_EQ(logits[coarse].size(), static_cast<size_t>(n_vocab));
  }
  ASSERT_EQ(hidden[0].size(), hidden[1].size());
  EXPECT_EQ(std::memcmp(hidden[0].data(), hidden[1].data(), hidden[0].size() * sizeof(float)), 0);
  double diff = 0, ref = 0;
  for (size_t i = 0; i < logits[0].size(); ++i) {
    diff += (static_cast<double>(logits[1][i]) - logits[0][i]) * (logits[1][i] - logits[0][i]);
    ref += static_cast<double>(logits[0][i]) * logits[0][i];
  }
  const double rel = std::sqrt(diff / std::max(ref, 1e-30));
  EXPECT_GT(rel, 0.0);
  EXPECT_LT(rel, 0.08);
  std::printf("coarse draft head: logits RMS difference %.4f of the full head's\n", rel);
}

// Two sequences (slots 0 and 1, prompts[i], sampler seed seed + i, top-k 40) speculated with k
// drafts to max_new tokens each by MtpSpeculator: their tokens and the acceptance.
void Speculate(Backend& gpu, const std::vector<std::vector<int32_t>>& prompts, int k, bool deferred,
               float temperature, uint64_t seed, int max_new, std::vector<int32_t> (&tokens)[2],
               spec::SpecStats* stats) {
  spec::MtpSpeculatorOptions so;
  so.k = k;
  so.deferred_drafts = deferred;
  auto sp = spec::MtpSpeculator::Create(&gpu, so);
  ASSERT_TRUE(sp.ok()) << sp.status();
  std::vector<sampling::Sampler> samplers;
  for (int i = 0; i < 2; ++i) {
    sampling::SamplingParams p;
    p.temperature = temperature;
    p.top_k = 40;
    p.seed = seed + i;
    samplers.emplace_back(p);
  }
  std::vector<spec::SpecSequence> seqs(2);
  std::vector<spec::SpecSequence*> ptrs;
  for (int i = 0; i < 2; ++i) {
    gpu.ResetSlot(i);
    seqs[i].slot = i;
    seqs[i].tokens = prompts[i];
    seqs[i].sampler = &samplers[i];
    seqs[i].max_new = max_new;
    ptrs.push_back(&seqs[i]);
  }
  ASSERT_TRUE(sp->Start(ptrs).ok());
  while (seqs[0].n_generated() < max_new || seqs[1].n_generated() < max_new) {
    std::vector<spec::SpecSequence*> live;
    for (spec::SpecSequence* s : ptrs)
      if (s->n_generated() < max_new) live.push_back(s);
    const absl::Status st = sp->Step(live);
    ASSERT_TRUE(st.ok()) << st;
  }
  for (int i = 0; i < 2; ++i) tokens[i] = seqs[i].tokens;
  *stats = sp->stats();
}

// Deferred drafts on the device (MtpSpeculatorOptions::deferred_drafts): the chain leaves its
// drafts in the slot's row of the device's draft buffer, the verify's ids are copied from there
// (CudaDevice::Prepare) and the host reads them only after the verify. On the trained demo model
// (which keeps drafts), two sequences at once, greedy and sampled, k = 3 and 4, with the fused
// chain and without: the same tokens and the same acceptance at every position as drafts waited
// for. Then the runner's side directly: StepOutput::chain_drafts equals MtpDraftGreedy's drafts
// from the same state, and the verify's logits equal those of the drafts spelled out.
TEST(MtpDeferred, SameTokensAndAcceptanceAsWaitedForDrafts) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto opened = gguf::File::Open(ResolveModelAlias("demo"));
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::shared_ptr<const gguf::File> file(std::move(*opened));
  int64_t kept = 0;
  for (const bool fused : {true, false}) {
    CudaBackendOptions c;
    c.spec_tokens = 5;
    c.spec_seqs = 2;
    c.fused_draft_chain = fused;
    auto b = CreateCudaBackend(file, Opts(), c);
    ASSERT_TRUE(b.ok()) << b.status();
    Backend& gpu = **b;
    const int V = gpu.config().n_vocab;
    const std::vector<std::vector<int32_t>> prompts = {Prompt(24, V), Prompt(31, V)};
    for (const float temperature : {0.0f, 0.8f}) {
      for (const int k : {3, 4}) {
        SCOPED_TRACE(::testing::Message() << "fused " << fused << " temperature " << temperature
                                          << " k " << k);
        std::vector<int32_t> tokens[2][2];
        spec::SpecStats stats[2];
        for (int deferred = 0; deferred < 2; ++deferred)
          ASSERT_NO_FATAL_FAILURE(Speculate(gpu, prompts, k, deferred == 1, temperature, 7, 48,
                                            tokens[deferred], &stats[deferred]));
        EXPECT_EQ(tokens[0][0], tokens[1][0]);
        EXPECT_EQ(tokens[0][1], tokens[1][1]);
        EXPECT_EQ(stats[0].steps, stats[1].steps);
        EXPECT_EQ(stats[0].offered, stats[1].offered);
        EXPECT_EQ(stats[0].accepted, stats[1].accepted);
        for (int64_t a : stats[1].accepted) kept += a;
      }
    }
    // The runner's side: slot 0 defers, slot 1 waits, from the same state.
    const int V2 = gpu.config().n_vocab;
    const std::vector<int32_t> toks = Prompt(kPrompt, V2);
    for (int slot : {0, 1}) {
      const absl::Status st = PrefillWithMtpRows(gpu, slot, toks);
      ASSERT_TRUE(st.ok()) << st;
    }
    const int32_t pos0 = static_cast<int32_t>(toks.size());
    std::vector<int32_t> want;
    StepOutput out[2];
    for (int slot : {0, 1}) {
      SeqStep s;
      s.slot = slot;
      s.pos0 = pos0;
      s.tokens = {3};
      s.decode_path = true;
      ASSERT_TRUE(gpu.Forward({&s, 1}, StepOptions{}, &out[slot]).ok());
      const std::vector<int32_t> catch_up = {11};
      const absl::Status st = slot == 0 ? gpu.MtpDraftDeferred(0, pos0, catch_up, 0, 3)
                                        : gpu.MtpDraftGreedy(1, pos0, catch_up, 0, 3, &want);
      ASSERT_TRUE(st.ok()) << st;
    }
    ASSERT_EQ(want.size(), 3u);
    for (int slot : {0, 1}) {
      SeqStep v;
      v.slot = slot;
      v.pos0 = pos0 + 1;
      v.all_logits = true;
      v.speculative = true;
      v.decode_path = true;
      v.chain_drafts = slot == 0;
      v.tokens = slot == 0 ? std::vector<int32_t>{11, -1, -1, -1}
                           : std::vector<int32_t>{11, want[0], want[1], want[2]};
      ASSERT_TRUE(gpu.Forward({&v, 1}, StepOptions{}, &out[slot]).ok());
      ASSERT_TRUE(gpu.CommitSpeculative(slot, 1).ok());
    }
    EXPECT_EQ(out[0].chain_drafts, want);
    EXPECT_EQ(out[0].logits, out[1].logits);
  }
  EXPECT_GT(kept, 0);
}

// Greedy and sampled speculation on the demo model, two sequences, k = 4, deferred, on a backend
// built with a path off and on (`toggle`): the same tokens and acceptance, and the path really
// used (its counter `used`) only when on.
void SameTokensWithPathOffAndOn(const std::function<void(CudaBackendOptions&, bool)>& toggle,
                                const std::function<int64_t(const cuda::CudaBackend&)>& used) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto opened = gguf::File::Open(ResolveModelAlias("demo"));
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::shared_ptr<const gguf::File> file(std::move(*opened));
  constexpr int kNew = 64;
  std::vector<int32_t> tokens[2][2][2];  // [temperature > 0][path on][sequence]
  spec::SpecStats stats[2][2];
  for (const bool on : {false, true}) {
    CudaBackendOptions c;
    c.spec_tokens = 5;
    c.spec_seqs = 2;
    toggle(c, on);
    auto b = CreateCudaBackend(file, Opts(), c);
    ASSERT_TRUE(b.ok()) << b.status();
    Backend& gpu = **b;
    const int V = gpu.config().n_vocab;
    const std::vector<std::vector<int32_t>> prompts = {Prompt(24, V), Prompt(31, V)};
    for (const int sampled : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "path on " << on << " sampled " << sampled);
      ASSERT_NO_FATAL_FAILURE(Speculate(gpu, prompts, 4, /*deferred=*/true, sampled ? 0.8f : 0.0f,
                                        11, kNew, tokens[sampled][on], &stats[sampled][on]));
    }
    const auto* cb = dynamic_cast<const cuda::CudaBackend*>(&gpu);
    ASSERT_NE(cb, nullptr);
    if (on)
      EXPECT_GT(used(*cb), 0);
    else
      EXPECT_EQ(used(*cb), 0);
  }
  for (int sampled : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "sampled " << sampled);
    EXPECT_EQ(tokens[sampled][0][0], tokens[sampled][1][0]);
    EXPECT_EQ(tokens[sampled][0][1], tokens[sampled][1][1]);
    EXPECT_EQ(stats[sampled][0].offered, stats[sampled][1].offered);
    EXPECT_EQ(stats[sampled][0].accepted, stats[sampled][1].accepted);
    EXPECT_EQ(stats[sampled][0].steps, stats[sampled][1].steps);
    EXPECT_GT(stats[sampled][1].steps, 0);
  }
}

// CudaBackendOptions::side_copies: after a deferred chain the rollback's state copies and the
// next verify's index upload run on a second stream beside the chain.
TEST(MtpDeferred, SideCopiesSameTokens) {
  SameTokensWithPathOffAndOn([](CudaBackendOptions& c, bool on) { c.side_copies = on; },
                             [](const cuda::CudaBackend& b) { return b.SideCopyBatches(); });
}

// CudaBackendOptions::judged_chains: the fused chain queued right behind the verify's sampling
// judges the verify's drafts on the device (StepOptions::chain_after), two sequences' chains in
// one Forward, each from its own rows; off, the runner queues the chains after the verify.
TEST(MtpDeferred, JudgedChainsSameTokens) {
  SameTokensWithPathOffAndOn([](CudaBackendOptions& c, bool on) { c.judged_chains = on; },
                             [](const cuda::CudaBackend& b) { return b.JudgedDraftChains(); });
}

// Without spec_tokens the device holds no speculative entries nor MTP block: speculative steps
// and MtpStep are refused with clear errors, and nothing changes.
TEST(MtpOff, RefusedWithoutSpecTokens) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto file = Synth(kModels[0]);
  ASSERT_TRUE(file);
  auto b = CreateCudaBackend(file, Opts(), CudaBackendOptions{});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->max_speculative_tokens(), 0);
  SeqStep v;
  v.tokens = {1, 2};
  v.speculative = true;
  StepOutput out;
  EXPECT_EQ((*b)->Forward({&v, 1}, StepOptions{}, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*b)->SlotLength(0), 0);
  std::vector<float> h((*b)->config().n_embd, 0.f), l, ho;
  EXPECT_EQ((*b)->MtpStep(0, 1, 0, h, &l, &ho).code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace ds
