// CpuBackend end-to-end on synthesized tiny models: prefill/decode equivalence, batching,
// snapshots, error atomicity, MTP.
#include "worker/model/cpu_backend.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "tests/model/test_util.h"

namespace ds {
namespace {

std::unique_ptr<CpuBackend> Make(const std::string& path, int n_slots = 1, int ctx = 256) {
  BackendOptions o;
  o.n_slots = n_slots;
  o.slot_ctx = ctx;
  o.n_threads = 2;
  auto b = CpuBackend::Create(path, o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

std::vector<int32_t> Tokens(int n, int n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % n_vocab);
  return t;
}

double RelErr(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / std::max(den, 1e-30);
}

StepOutput RunSeq(Backend& be, int slot, const std::vector<int32_t>& toks, bool all = true,
               bool hidden = false) {
  SeqStep s{slot, be.SlotLength(slot), toks, all};
  StepOutput out;
  StepOptions o;
  o.want_hidden = hidden;
  absl::Status st = be.Forward({&s, 1}, o, &out);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

// Prompt in one all_logits Forward vs token by token (decode path): the chunked GDN form and
// the recurrence must give the same logits.
TEST(CpuBackend, PrefillEqualsTokenByTokenDecode) {
  for (int chunk : {64, 16, 5}) {
    auto a = Make(testing::TinyModelPath());
    auto b = Make(testing::TinyModelPath());
    a->set_gdn_chunk(chunk);
    const int V = a->config().n_vocab;
    const auto toks = Tokens(70, V, 1);
    StepOutput pre = RunSeq(*a, 0, toks);
    ASSERT_EQ(pre.n_rows, 70);
    for (int t = 0; t < 70; ++t) {
      StepOutput d = RunSeq(*b, 0, {toks[t]}, false);
      ASSERT_EQ(d.n_rows, 1);
      std::span<const float> row(pre.logits.data() + static_cast<size_t>(t) * V, V);
      EXPECT_LT(RelErr(row, d.logits), 1e-4) << "chunk " << chunk << " token " << t;
    }
    EXPECT_EQ(a->SlotLength(0), 70);
    EXPECT_EQ(b->SlotLength(0), 70);
  }
}

TEST(CpuBackend, ChunkedPrefillSplitAcrossCallsEqualsOneCall) {
  auto a = Make(testing::TinyModelPath());
  auto b = Make(testing::TinyModelPath());
  const int V = a->config().n_vocab;
  const auto toks = Tokens(60, V, 2);
  StepOutput one = RunSeq(*a, 0, toks);
  std::vector<float> pieces;
  size_t t0 = 0;
  for (int n : {17, 1, 30, 12}) {
    StepOutput o = RunSeq(*b, 0, std::vector<int32_t>(toks.begin() + t0, toks.begin() + t0 + n));
    pieces.insert(pieces.end(), o.logits.begin(), o.logits.end());
    t0 += n;
  }
  ASSERT_EQ(t0, toks.size());
  EXPECT_LT(RelErr(pieces, one.logits), 1e-4);
}

TEST(CpuBackend, BatchedMultiSlotStepEqualsEachAlone) {
  const std::string& p = testing::TinyModelPath();
  auto batched = Make(p, 3);
  std::vector<std::unique_ptr<CpuBackend>> alone;
  for (int i = 0; i < 3; ++i) alone.push_back(Make(p, 1));
  const int V = batched->config().n_vocab;
  // Two steps mixing prefill chunks and decode tokens; slot 1 wants all logits.
  const std::vector<std::vector<std::vector<int32_t>>> steps = {
      {Tokens(10, V, 3), Tokens(7, V, 4), Tokens(1, V, 5)},
      {Tokens(1, V, 6), Tokens(5, V, 7), Tokens(1, V, 8)},
  };
  for (const auto& step : steps) {
    std::vector<SeqStep> batch;
    for (int s = 2; s >= 0; --s)  // batch order differs from slot order on purpose
      batch.push_back(SeqStep{s, batched->SlotLength(s), step[s], s == 1});
    StepOutput out;
    StepOptions so;
    so.want_hidden = true;
    ASSERT_TRUE(batched->Forward(batch, so, &out).ok());
    ASSERT_EQ(out.n_rows, 1 + static_cast<int>(step[1].size()) + 1);
    ASSERT_EQ(out.hidden.size(), static_cast<size_t>(out.n_rows) * batched->config().n_embd);
    size_t row = 0;
    for (const SeqStep& s : batch) {
      StepOutput ref = RunSeq(*alone[s.slot], 0, s.tokens, s.all_logits);
      const size_t n = static_cast<size_t>(ref.n_rows) * V;
      EXPECT_LT(RelErr({out.logits.data() + row * V, n}, ref.logits), 1e-5) << "slot " << s.slot;
      row += ref.n_rows;
    }
  }
}

TEST(CpuBackend, LastOnlyRowsAndHiddenAreFinalNormedStates) {
  auto be = Make(testing::TinyModelPath(), 2);
  const ModelConfig& c = be->config();
  const int V = c.n_vocab, H = c.n_embd;
  std::vector<SeqStep> batch = {{0, 0, Tokens(4, V, 9), false}, {1, 0, Tokens(3, V, 10), true}};
  StepOutput out;
  StepOptions so;
  so.want_hidden = true;
  ASSERT_TRUE(be->Forward(batch, so, &out).ok());
  ASSERT_EQ(out.n_rows, 4);
  ASSERT_EQ(out.logits.size(), 4u * V);
  ASSERT_EQ(out.hidden.size(), 4u * H);
  // logits = output.weight · hidden for every row, and hidden rows are RMS-normed (times g).
  std::vector<float> lg(4 * V);
  cpu::MatMul(be->weights().output, out.hidden.data(), 4, lg.data(), nullptr);
  EXPECT_EQ(lg, out.logits);
  // Row 0 is slot 0's last token: same as running slot 0 alone with last-only logits.
  auto ref = Make(testing::TinyModelPath());
  StepOutput r = RunSeq(*ref, 0, batch[0].tokens, false);
  EXPECT_LT(RelErr({out.logits.data(), static_cast<size_t>(V)}, r.logits), 1e-6);
  StepOutput no_hidden;
  ASSERT_TRUE(be->Forward(std::vector<SeqStep>{{0, 4, {1}, false}}, {}, &no_hidden).ok());
  EXPECT_TRUE(no_hidden.hidden.empty());
  EXPECT_GT(no_hidden.forward_seconds, 0.0);
}

TEST(CpuBackend, SnapshotRestoreReplaysIdentically) {
  auto be = Make(testing::TinyModelPath(), 2);
  const int V = be->config().n_vocab;
  RunSeq(*be, 0, Tokens(12, V, 11));
  auto snap = be->Snapshot(0);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->n_past, 12);
  const auto more = Tokens(6, V, 12);
  StepOutput first = RunSeq(*be, 0, {more.begin(), more.begin() + 4});
  StepOutput first2 = RunSeq(*be, 0, {more[4]}, false);
  RunSeq(*be, 0, {more[5]}, false);
  EXPECT_EQ(be->SlotLength(0), 18);
  ASSERT_TRUE(be->Restore(0, *snap).ok());
  EXPECT_EQ(be->SlotLength(0), 12);
  StepOutput again = RunSeq(*be, 0, {more.begin(), more.begin() + 4});
  StepOutput again2 = RunSeq(*be, 0, {more[4]}, false);
  EXPECT_EQ(first.logits, again.logits);
  EXPECT_EQ(first2.logits, again2.logits);
  // The snapshot also transplants the sequence into another slot.
  ASSERT_TRUE(be->Restore(1, *snap).ok());
  StepOutput other = RunSeq(*be, 1, {more.begin(), more.begin() + 4});
  EXPECT_EQ(first.logits, other.logits);
  // A corrupted snapshot is rejected without changing the slot.
  SlotSnapshot bad = *snap;
  bad.bytes.pop_back();
  EXPECT_FALSE(be->Restore(1, bad).ok());
  EXPECT_EQ(be->SlotLength(1), 16);
  EXPECT_FALSE(be->Restore(5, *snap).ok());
}

TEST(CpuBackend, ResetSlotStartsFresh) {
  auto be = Make(testing::TinyModelPath());
  const int V = be->config().n_vocab;
  const auto p = Tokens(9, V, 13);
  StepOutput a = RunSeq(*be, 0, p);
  RunSeq(*be, 0, Tokens(3, V, 14));
  be->ResetSlot(0);
  EXPECT_EQ(be->SlotLength(0), 0);
  StepOutput b = RunSeq(*be, 0, p);
  EXPECT_EQ(a.logits, b.logits);
}

TEST(CpuBackend, InvalidStepsFailWithoutTouchingState) {
  auto be = Make(testing::TinyModelPath(), 2, 32);
  const int V = be->config().n_vocab;
  RunSeq(*be, 0, Tokens(5, V, 15));
  RunSeq(*be, 1, Tokens(3, V, 16));
  auto s0 = be->Snapshot(0), s1 = be->Snapshot(1);
  ASSERT_TRUE(s0.ok() && s1.ok());
  const SeqStep good{1, 3, {1, 2}, false};
  struct Case {
    const char* what;
    std::vector<SeqStep> batch;
    absl::StatusCode code;
    const char* needle;
  } cases[] = {
      {"empty", {}, absl::StatusCode::kInvalidArgument, "empty"},
      {"slot -1", {good, {-1, 0, {1}, false}}, absl::StatusCode::kInvalidArgument, "slot -1"},
      {"slot 2", {good, {2, 0, {1}, false}}, absl::StatusCode::kInvalidArgument, "slot 2"},
      {"dup", {good, {1, 3, {1}, false}}, absl::StatusCode::kInvalidArgument, "more than once"},
      {"pos", {good, {0, 4, {1}, false}}, absl::StatusCode::kInvalidArgument, "pos0 4"},
      {"tok-", {good, {0, 5, {1, -1}, false}}, absl::StatusCode::kInvalidArgument, "token id -1"},
      {"tok+", {good, {0, 5, {V}, false}}, absl::StatusCode::kInvalidArgument,
       "token id"},
      {"no tokens", {good, {0, 5, {}, false}}, absl::StatusCode::kInvalidArgument, "no tokens"},
      {"capacity", {good, {0, 5, std::vector<int32_t>(28, 1), false}},
       absl::StatusCode::kOutOfRange, "slot_ctx"},
  };
  for (const Case& cs : cases) {
    StepOutput out;
    absl::Status st = be->Forward(cs.batch, {}, &out);
    EXPECT_EQ(st.code(), cs.code) << cs.what << ": " << st;
    EXPECT_NE(st.message().find(cs.needle), std::string::npos) << cs.what << ": " << st;
    EXPECT_EQ(be->SlotLength(0), 5) << cs.what;
    EXPECT_EQ(be->SlotLength(1), 3) << cs.what;
    EXPECT_EQ(be->Snapshot(0)->bytes, s0->bytes) << cs.what;
    EXPECT_EQ(be->Snapshot(1)->bytes, s1->bytes) << cs.what;
  }
  // Exactly filling the slot is fine.
  StepOutput out;
  SeqStep fill{0, 5, std::vector<int32_t>(27, 1), false};
  EXPECT_TRUE(be->Forward({&fill, 1}, {}, &out).ok());
  EXPECT_EQ(be->SlotLength(0), 32);
}

// The CPU backend keeps f32 KV: a quantized --kv-type is an error naming the flag, not ignored.
TEST(CpuBackend, RejectsQuantizedKvType) {
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    BackendOptions o;
    o.slot_ctx = 64;
    o.kv_type = t;
    auto b = CpuBackend::Create(testing::TinyModelPath(), o);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find("--kv-type"), std::string::npos) << b.status();
    EXPECT_NE(b.status().message().find("f32"), std::string::npos) << b.status();
  }
  BackendOptions o;
  o.slot_ctx = 64;
  o.kv_type = GgmlType::F16;  // the default: accepted (the cache stays f32)
  EXPECT_TRUE(CpuBackend::Create(testing::TinyModelPath(), o).ok());
}

TEST(CpuBackend, MtpStepIsDeterministicAndRollsBack) {
  const std::string& p = testing::TinyModelPath();
  auto a = Make(p), b = Make(p);
  ASSERT_TRUE(a->weights().has_mtp);
  const int V = a->config().n_vocab, H = a->config().n_embd;
  const auto prompt = Tokens(8, V, 17);
  StepOutput pa = RunSeq(*a, 0, prompt, true, true);
  StepOutput pb = RunSeq(*b, 0, prompt, true, true);
  ASSERT_EQ(pa.hidden, pb.hidden);
  // Fill the MTP cache over the prompt: row t pairs h_t with token x_{t+1}.
  auto step = [&](Backend& be, int32_t tok, int32_t pos, std::span<const float> h,
                  std::vector<float>* lg, std::vector<float>* ho) {
    absl::Status s = be.MtpStep(0, tok, pos, h, lg, ho);
    EXPECT_TRUE(s.ok()) << s;
  };
  std::vector<float> la, ha, lb, hb;
  for (int t = 0; t + 1 < 8; ++t) {
    std::span<const float> h(pa.hidden.data() + t * H, H);
    step(*a, prompt[t + 1], t, h, &la, &ha);
    step(*b, prompt[t + 1], t, h, &lb, &hb);
    ASSERT_EQ(la, lb);
    ASSERT_EQ(ha, hb);
  }
  ASSERT_EQ(la.size(), static_cast<size_t>(V));
  ASSERT_EQ(ha.size(), static_cast<size_t>(H));
  for (float x : la) ASSERT_TRUE(std::isfinite(x));
  // Draft two tokens from the last position, then roll back and redo the first draft.
  std::span<const float> h7(pa.hidden.data() + 7 * H, H);
  std::vector<float> d1, dh1, d2, dh2, r1, rh1;
  step(*a, 5, 7, h7, &d1, &dh1);
  step(*a, 6, 8, dh1, &d2, &dh2);
  EXPECT_NE(d1, d2);
  auto snap = a->Snapshot(0);
  ASSERT_TRUE(snap.ok());
  step(*a, 5, 7, h7, &r1, &rh1);  // rewrites row 7, drops row 8
  EXPECT_EQ(d1, r1);
  EXPECT_EQ(dh1, rh1);
  // A different draft token changes the result.
  step(*a, 7, 8, dh1, &r1, &rh1);
  EXPECT_NE(d2, r1);
  // The snapshot (8 positions) keeps the MTP rows that hold for any continuation of them, [0, 7)
  // (MtpRowsKept): rows 7 and 8 paired the last state with a token and a draft after it. So
  // after the restore row 7 is written again and row 8 stays a gap, as on b, which never had
  // row 8.
  ASSERT_TRUE(a->Restore(0, *snap).ok());
  step(*a, 5, 7, h7, &r1, &rh1);
  EXPECT_EQ(d1, r1);
  EXPECT_EQ(dh1, rh1);
  std::vector<float> d3, dh3;
  step(*a, 9, 9, dh2, &d3, &dh3);
  step(*b, 5, 7, h7, &r1, &rh1);
  std::vector<float> d4, dh4;
  step(*b, 9, 9, dh2, &d4, &dh4);
  EXPECT_EQ(d3, d4);
  step(*b, 6, 8, rh1, &r1, &rh1);  // with row 8 the result differs: the gap is real
  step(*b, 9, 9, dh2, &d4, &dh4);
  EXPECT_NE(d3, d4);
  // Argument errors.
  std::vector<float> lg, ho;
  EXPECT_FALSE(a->MtpStep(0, -1, 0, h7, &lg, &ho).ok());
  EXPECT_FALSE(a->MtpStep(0, V, 0, h7, &lg, &ho).ok());
  EXPECT_FALSE(a->MtpStep(3, 1, 0, h7, &lg, &ho).ok());
  EXPECT_FALSE(a->MtpStep(0, 1, a->slot_ctx(), h7, &lg, &ho).ok());
  EXPECT_FALSE(a->MtpStep(0, 1, 0, h7.subspan(1), &lg, &ho).ok());
}

// MtpRows (one pass over n rows: every row's K/V and attention, the MLP and head of the last
// only) gives what n MtpStep calls give, bit for bit: the last row's logits and hidden state, the
// MTP K/V (in the snapshot), and the next draft step after it. Also after rows of rejected drafts
// (the rows are rewritten from pos0 and the later ones dropped).
TEST(CpuBackend, MtpRowsEqualsMtpStepCalls) {
  const std::string& p = testing::TinyModelPath();
  auto a = Make(p), b = Make(p);
  const int V = a->config().n_vocab, H = a->config().n_embd;
  const auto prompt = Tokens(12, V, 23);
  StepOutput pa = RunSeq(*a, 0, prompt, true, true);
  RunSeq(*b, 0, prompt, true, true);
  for (auto [p0, n] : {std::pair{0, 11}, std::pair{6, 4}, std::pair{9, 1}, std::pair{7, 3}}) {
    std::vector<int32_t> toks(prompt.begin() + p0 + 1, prompt.begin() + p0 + 1 + n);
    std::span<const float> h(pa.hidden.data() + static_cast<size_t>(p0) * H,
                             static_cast<size_t>(n) * H);
    std::vector<float> la, ha, lb, hb;
    ASSERT_TRUE(a->MtpRows(0, p0, toks, h, &la, &ha).ok());
    for (int i = 0; i < n; ++i)
      ASSERT_TRUE(b->MtpStep(0, toks[i], p0 + i, h.subspan(static_cast<size_t>(i) * H, H), &lb, &hb).ok());
    EXPECT_EQ(la, lb) << "rows [" << p0 << ", " << p0 + n << ")";
    EXPECT_EQ(ha, hb) << "rows [" << p0 << ", " << p0 + n << ")";
    std::vector<float> da, dha, db, dhb;
    ASSERT_TRUE(a->MtpStep(0, 5, p0 + n, ha, &da, &dha).ok());
    ASSERT_TRUE(b->MtpStep(0, 5, p0 + n, hb, &db, &dhb).ok());
    EXPECT_EQ(da, db);
    auto sa = a->Snapshot(0), sb = b->Snapshot(0);
    ASSERT_TRUE(sa.ok() && sb.ok());
    EXPECT_EQ(sa->bytes, sb->bytes);
  }
}

// Quantized weights: K-quant / IQ4 / Q8_0 matrices run and keep prefill == decode.
TEST(CpuBackend, QuantizedModelsRunAndAgree) {
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::IQ4_XS}) {
    SynthOptions o = SynthOptions::Tiny();
    o.n_embd = 256;
    o.n_ff = 512;
    o.weight_type = t;
    const std::string p = testing::SynthPath(std::string("q_") + std::string(GgmlInfo(t).name), o);
    auto a = Make(p), b = Make(p);
    ASSERT_TRUE(a && b);
    const int V = a->config().n_vocab;
    const auto toks = Tokens(20, V, 20);
    StepOutput pre = RunSeq(*a, 0, toks);
    for (int i = 0; i < 20; ++i) {
      StepOutput d = RunSeq(*b, 0, {toks[i]}, false);
      EXPECT_LT(RelErr({pre.logits.data() + static_cast<size_t>(i) * V, static_cast<size_t>(V)},
                       d.logits),
                1e-4)
          << GgmlInfo(t).name << " token " << i;
    }
  }
}

// Weights are scaled so activations stay sane through many layers.
TEST(CpuBackend, DeepSynthModelKeepsActivationsSane) {
  SynthOptions o = SynthOptions::Tiny();
  o.n_layer = 16;
  const std::string p = testing::SynthPath("deep", o);
  auto be = Make(p);
  const int V = be->config().n_vocab;
  StepOutput out = RunSeq(*be, 0, Tokens(24, V, 21));
  double ss = 0;
  for (float x : out.logits) {
    ASSERT_TRUE(std::isfinite(x));
    ss += double(x) * x;
  }
  const double rms = std::sqrt(ss / out.logits.size());
  EXPECT_GT(rms, 0.1);
  EXPECT_LT(rms, 100.0);
}

}  // namespace
}  // namespace ds
