// The step runner's own rules: the micro-step split, the snapshot format, and the runner over the
// CPU device cutting steps as it does for a GPU (same logits as one whole step), ForwardGreedy.
#include "worker/runner/step_runner.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "tests/model/test_util.h"
#include "worker/model/cpu_backend.h"
#include "worker/runner/micro_steps.h"
#include "worker/runner/slot_snapshot.h"

namespace ds {
namespace {

std::vector<int32_t> Tokens(int n, int n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % n_vocab);
  return t;
}

SeqStep Seq(int slot, int32_t pos0, int n, bool all_logits) {
  SeqStep s;
  s.slot = slot;
  s.pos0 = pos0;
  s.tokens.assign(n, 1);
  s.all_logits = all_logits;
  return s;
}

int LogitRows(std::span<const SeqStep> batch, const std::vector<StepPiece>& m) {
  int n = 0;
  for (const StepPiece& p : m) n += batch[p.seq].all_logits ? p.n : (p.last ? 1 : 0);
  return n;
}

TEST(MicroSteps, EveryTokenOnceInOrderWithinLimits) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int max_rows = 1 + rng() % 40, max_logit = 1 + rng() % 10;
    std::vector<SeqStep> batch;
    const int n_seq = 1 + rng() % 6;
    for (int i = 0; i < n_seq; ++i) batch.push_back(Seq(i, 0, 1 + rng() % 50, rng() % 3 == 0));
    const auto steps = SplitIntoMicroSteps(batch, max_rows, max_logit);
    std::vector<int> next(batch.size(), 0);  // next token expected of every sequence
    int last_seq = 0;
    for (const auto& m : steps) {
      ASSERT_FALSE(m.empty());
      int rows = 0;
      for (const StepPiece& p : m) {
        ASSERT_GE(p.seq, last_seq);  // sequences in batch order
        last_seq = p.seq;
        EXPECT_EQ(p.t0, next[p.seq]);
        next[p.seq] += p.n;
        EXPECT_EQ(p.last, next[p.seq] == static_cast<int>(batch[p.seq].tokens.size()));
        rows += p.n;
      }
      EXPECT_LE(rows, max_rows);
      EXPECT_LE(LogitRows(batch, m), max_logit);
    }
    for (size_t i = 0; i < batch.size(); ++i)
      EXPECT_EQ(next[i], static_cast<int>(batch[i].tokens.size()));
  }
}

// The decode-row budget (DeviceLimits::max_decode_rows): pieces of one token and every row of a
// decode_path sequence count against it; a long decode_path run continues in the next micro-step.
TEST(MicroSteps, DecodeRowsStayWithinTheirBudget) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int max_rows = 4 + rng() % 60, max_decode = 1 + rng() % 12;
    std::vector<SeqStep> batch;
    const int n_seq = 1 + rng() % 8;
    for (int i = 0; i < n_seq; ++i) {
      const int kind = rng() % 3;  // a decode, a prefill chunk, a decode_path run
      batch.push_back(Seq(i, 0, kind == 0 ? 1 : 1 + rng() % 40, false));
      batch.back().decode_path = kind == 2;
    }
    const auto steps = SplitIntoMicroSteps(batch, max_rows, 64, max_decode);
    std::vector<int> next(batch.size(), 0);
    for (const auto& m : steps) {
      ASSERT_FALSE(m.empty());
      int rows = 0, decode_rows = 0;
      for (const StepPiece& p : m) {
        EXPECT_EQ(p.t0, next[p.seq]);
        next[p.seq] += p.n;
        rows += p.n;
        if (batch[p.seq].decode_path || p.n == 1) decode_rows += p.n;
      }
      EXPECT_LE(rows, max_rows);
      EXPECT_LE(decode_rows, max_decode) << "trial " << trial;
    }
    for (size_t i = 0; i < batch.size(); ++i)
      EXPECT_EQ(next[i], static_cast<int>(batch[i].tokens.size()));
  }
}

TEST(MicroSteps, DecodeBatchIsOnePureDecodeStep) {
  std::vector<SeqStep> batch = {Seq(0, 7, 1, false), Seq(3, 2, 1, false), Seq(1, 0, 1, false)};
  const auto steps = SplitIntoMicroSteps(batch, 4096, 64);
  ASSERT_EQ(steps.size(), 1u);
  MicroStep m;
  BuildMicroStep(batch, steps[0], &m);
  EXPECT_TRUE(m.pure_decode);
  EXPECT_EQ(m.rows(), 3);
  EXPECT_EQ(m.logit_rows, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(m.slots, (std::vector<int32_t>{0, 3, 1}));
  EXPECT_EQ(m.positions, (std::vector<int32_t>{7, 2, 0}));
  // A prefill piece, or an all_logits token, is no pure decode.
  batch.push_back(Seq(2, 0, 5, false));
  BuildMicroStep(batch, SplitIntoMicroSteps(batch, 4096, 64)[0], &m);
  EXPECT_FALSE(m.pure_decode);
  EXPECT_FALSE(m.decode_only);  // the 5-token prefill piece takes the prefill kernels
  std::vector<SeqStep> all = {Seq(0, 0, 1, true)};
  BuildMicroStep(all, SplitIntoMicroSteps(all, 4096, 64)[0], &m);
  EXPECT_FALSE(m.pure_decode);
  EXPECT_TRUE(m.decode_only);
}

TEST(MicroSteps, VerifyStepsAreDecodeOnlyAndKeyedByTheirRunShape) {
  // Two sequences verifying drafts (speculative decode-path runs) beside a plain decode: every
  // run takes the decode kernels, so a device may capture the step; the key names the shape.
  auto verify = [](int slot, int32_t pos0, int n) {
    SeqStep s = Seq(slot, pos0, n, true);
    s.speculative = true;
    s.decode_path = true;
    return s;
  };
  std::vector<SeqStep> a = {verify(0, 10, 4), Seq(1, 3, 1, false), verify(2, 7, 2)};
  std::vector<SeqStep> b = {verify(5, 99, 4), Seq(3, 40, 1, false), verify(4, 1, 2)};
  MicroStep ma, mb;
  BuildMicroStep(a, SplitIntoMicroSteps(a, 4096, 64)[0], &ma, std::vector<int32_t>{0, -1, 4});
  BuildMicroStep(b, SplitIntoMicroSteps(b, 4096, 64)[0], &mb, std::vector<int32_t>{0, -1, 4});
  EXPECT_TRUE(ma.decode_only);
  EXPECT_FALSE(ma.pure_decode);
  // Other slots, positions and tokens, same shape: the same key (one graph serves both).
  EXPECT_EQ(ma.ShapeKey(), mb.ShapeKey());
  EXPECT_EQ(ma.ShapeKey(), (std::vector<int32_t>{7, 7, 4 * 4 + 3, 1 * 4 + 1, 2 * 4 + 3}));
  // Another draft count, or the same rows without speculation: another key.
  std::vector<SeqStep> c = {verify(0, 10, 3), Seq(1, 3, 1, false), verify(2, 7, 3)};
  MicroStep mc;
  BuildMicroStep(c, SplitIntoMicroSteps(c, 4096, 64)[0], &mc, std::vector<int32_t>{0, -1, 3});
  EXPECT_NE(ma.ShapeKey(), mc.ShapeKey());
  MicroStep plain;
  BuildMicroStep(a, SplitIntoMicroSteps(a, 4096, 64)[0], &plain);
  EXPECT_NE(ma.ShapeKey(), plain.ShapeKey());
}

// SeqStep::chain_drafts (deferred MTP drafts): a device that keeps the drafts gets, per
// micro-step, which of its rows take which of the slot's drafts (MicroStep::chain_tokens): row r
// of a verify of pending + k drafts starting at token t0 holds draft t0 + r - 1, the pending token
// (token 0) never; pieces of a verify cut over micro-steps name their own share, in the step's
// rows, with the device slot; other sequences name none.
TEST(MicroSteps, ChainDraftRowsNameTheirDraftsAcrossPieces) {
  auto verify = [](int slot, int32_t pos0, int n) {
    SeqStep s = Seq(slot, pos0, n, true);
    s.speculative = true;
    s.decode_path = true;
    s.chain_drafts = true;
    return s;
  };
  using CT = MicroStep::ChainTokens;
  auto same = [](const std::vector<CT>& got, const std::vector<CT>& want) {
    if (got.size() != want.size()) return false;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i].row != want[i].row || got[i].slot != want[i].slot ||
          got[i].first != want[i].first || got[i].n != want[i].n)
        return false;
    return true;
  };
  // One micro-step: a plain decode, then a verify of 1 + 4 tokens at rows 1..5 of slot 2's
  // device slot 7, then a verify without chain drafts.
  std::vector<SeqStep> batch = {Seq(0, 3, 1, false), verify(2, 10, 5), Seq(1, 5, 3, true)};
  batch[2].speculative = true;
  batch[2].decode_path = true;
  MicroStep m;
  BuildMicroStep(batch, SplitIntoMicroSteps(batch, 4096, 64)[0], &m,
                 std::vector<int32_t>{-1, 0, 5}, std::vector<int32_t>{4, 7, 6});
  EXPECT_TRUE(same(m.chain_tokens, {CT{2, 7, 0, 4}}));
  EXPECT_TRUE(m.decode_only);
  // The same verify cut into micro-steps of 2 rows: tokens {0, 1} | {2, 3} | {4}.
  std::vector<SeqStep> one = {verify(2, 10, 5)};
  const auto steps = SplitIntoMicroSteps(one, 2, 64);
  ASSERT_EQ(steps.size(), 3u);
  const std::vector<CT> want[3] = {{CT{1, 2, 0, 1}}, {CT{0, 2, 1, 2}}, {CT{0, 2, 3, 1}}};
  for (int i = 0; i < 3; ++i) {
    BuildMicroStep(one, steps[i], &m, std::vector<int32_t>{0});
    EXPECT_TRUE(same(m.chain_tokens, want[i])) << "micro-step " << i;
  }
  // A piece holding only the pending token names nothing; without chain_drafts nothing either.
  const auto firsts = SplitIntoMicroSteps(one, 1, 64);
  BuildMicroStep(one, firsts[0], &m, std::vector<int32_t>{0});
  EXPECT_TRUE(m.chain_tokens.empty());
  one[0].chain_drafts = false;
  BuildMicroStep(one, steps[1], &m, std::vector<int32_t>{0});
  EXPECT_TRUE(m.chain_tokens.empty());
}

TEST(MicroSteps, LongPrefillCarriesOverAndOnlyItsLastPieceHasALogitRow) {
  std::vector<SeqStep> batch = {Seq(0, 10, 10, false)};
  const auto steps = SplitIntoMicroSteps(batch, 4, 64);
  ASSERT_EQ(steps.size(), 3u);
  MicroStep m;
  BuildMicroStep(batch, steps[0], &m);
  EXPECT_EQ(m.positions, (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_TRUE(m.logit_rows.empty());
  BuildMicroStep(batch, steps[2], &m);
  EXPECT_EQ(m.positions, (std::vector<int32_t>{18, 19}));
  EXPECT_EQ(m.logit_rows, (std::vector<int32_t>{1}));
}

TEST(SlotSnapshotFormat, RoundTripsAndRefusesWhatIsNotOne) {
  const std::vector<uint8_t> payload = {1, 2, 3, 4, 5};
  const auto bytes = EncodeSlotSnapshot("cpu f32 test", 42, payload);
  auto d = DecodeSlotSnapshot(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->layout, "cpu f32 test");
  EXPECT_EQ(d->n_past, 42);
  EXPECT_EQ(std::vector<uint8_t>(d->payload.begin(), d->payload.end()), payload);

  auto bad = bytes;
  bad[0] = 'X';
  EXPECT_NE(DecodeSlotSnapshot(bad).status().message().find("magic"), std::string::npos);
  bad = bytes;
  bad[8] = 99;  // version
  EXPECT_NE(DecodeSlotSnapshot(bad).status().message().find("version 99"), std::string::npos);
  bad = bytes;
  bad.pop_back();
  EXPECT_FALSE(DecodeSlotSnapshot(bad).ok());
  bad = bytes;
  bad.push_back(0);
  EXPECT_FALSE(DecodeSlotSnapshot(bad).ok());
  for (size_t n = 0; n < 20; ++n)
    EXPECT_FALSE(DecodeSlotSnapshot(std::span<const uint8_t>(bytes.data(), n)).ok());
}

std::unique_ptr<CpuBackend> Make(int n_slots) {
  BackendOptions o;
  o.n_slots = n_slots;
  o.slot_ctx = 256;
  o.n_threads = 2;
  auto b = CpuBackend::Create(testing::TinyModelPath(), o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  return d;
}

// A mixed step (an all_logits prefill, a last-row prefill, a decode) cut into micro-steps of 5
// rows and 3 logit rows gives the logits and hidden states of the whole step at once.
TEST(StepRunner, MicroStepsGiveTheLogitsOfTheWholeStep) {
  auto whole = Make(3);
  auto cut = Make(3);
  cut->set_micro_step_limits(5, 3);
  const int V = whole->config().n_vocab;
  std::vector<SeqStep> warm = {{2, 0, Tokens(6, V, 1), false}};
  StepOutput o1, o2;
  ASSERT_TRUE(whole->Forward(warm, {}, &o1).ok());
  ASSERT_TRUE(cut->Forward(warm, {}, &o2).ok());
  std::vector<SeqStep> batch = {{0, 0, Tokens(9, V, 2), true},
                                {1, 0, Tokens(13, V, 3), false},
                                {2, 6, Tokens(1, V, 4), false}};
  StepOptions so;
  so.want_hidden = true;
  ASSERT_TRUE(whole->Forward(batch, so, &o1).ok());
  ASSERT_TRUE(cut->Forward(batch, so, &o2).ok());
  EXPECT_EQ(whole->last_micro_steps(), 1);
  EXPECT_EQ(cut->last_micro_steps(), 6);  // 23 rows by 5, and 11 logit rows by 3
  EXPECT_EQ(o1.n_rows, 11);
  EXPECT_EQ(o2.n_rows, 11);
  EXPECT_LT(MaxAbsDiff(o1.logits, o2.logits), 1e-4);
  EXPECT_LT(MaxAbsDiff(o1.hidden, o2.hidden), 1e-5);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(whole->SlotLength(s), cut->SlotLength(s));
}

TEST(StepRunner, ForwardGreedyPicksTheArgmaxOfForward) {
  auto a = Make(2);
  auto b = Make(2);
  const int V = a->config().n_vocab;
  std::vector<SeqStep> batch = {{0, 0, Tokens(7, V, 8), false}, {1, 0, Tokens(3, V, 9), false}};
  StepOutput out;
  ASSERT_TRUE(a->Forward(batch, {}, &out).ok());
  std::vector<int32_t> tokens;
  double secs = -1;
  ASSERT_TRUE(b->ForwardGreedy(batch, &tokens, &secs).ok());
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_GE(secs, 0);
  for (int r = 0; r < 2; ++r) {
    const float* row = out.logits.data() + static_cast<size_t>(r) * V;
    EXPECT_EQ(tokens[r], std::max_element(row, row + V) - row);
  }
  EXPECT_EQ(b->SlotLength(0), 7);
  batch[0].all_logits = true;
  EXPECT_FALSE(b->ForwardGreedy(batch, &tokens, nullptr).ok());
}

TEST(StepRunner, RestoreRefusesASnapshotOfAnotherLayout) {
  auto be = Make(2);
  const int V = be->config().n_vocab;
  std::vector<SeqStep> batch = {{0, 0, Tokens(5, V, 3), false}};
  StepOutput out;
  ASSERT_TRUE(be->Forward(batch, {}, &out).ok());
  auto snap = be->Snapshot(0);
  ASSERT_TRUE(snap.ok()) << snap.status();
  auto d = DecodeSlotSnapshot(snap->bytes);
  ASSERT_TRUE(d.ok());
  SlotSnapshot foreign;
  foreign.n_past = snap->n_past;
  foreign.bytes = EncodeSlotSnapshot("cuda kv=f16 page=64", d->n_past, d->payload);
  absl::Status st = be->Restore(1, foreign);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cannot be restored"), std::string::npos) << st;
  EXPECT_EQ(be->SlotLength(1), 0);
  ASSERT_TRUE(be->Restore(1, *snap).ok());
  EXPECT_EQ(be->SlotLength(1), 5);
}

TEST(StepRunner, DeviceSamplingIsRefusedWhereTheDeviceHasNone) {
  auto be = Make(1);
  std::vector<SeqStep> batch = {{0, 0, {1, 2}, false}};
  DeviceSampleRow row;
  row.mode = DeviceSampleRow::Mode::kLogits;
  StepOptions so;
  so.device_sample = {&row, 1};
  StepOutput out;
  EXPECT_EQ(be->Forward(batch, so, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(be->SlotLength(0), 0);
}

TEST(StepRunner, ReportsTheMemoryItHolds) {
  auto one = Make(1);
  auto four = Make(4);
  EXPECT_GT(one->memory().kv_cache, 0u);
  EXPECT_EQ(four->memory().kv_cache, 4 * one->memory().kv_cache);
  EXPECT_EQ(four->memory().recurrent, 4 * one->memory().recurrent);
}

}  // namespace
}  // namespace ds

namespace ds {
namespace {

// Issue #23: recurrent state per active slot. A runner addressing 6 slots with state for 2
// sequences binds a slot to device state while it holds a sequence: a third start is refused
// with ResourceExhausted and nothing changes; after a reset it runs; every output equals that of
// a runner with state for every slot; a snapshot restores into another slot.
TEST(ActiveSlots, StateOnlyForActiveSequences) {
  const std::string& path = testing::TinyModelPath();
  BackendOptions full;
  full.n_slots = 6;
  full.slot_ctx = 64;
  full.n_threads = 1;
  BackendOptions few = full;
  few.max_active_slots = 2;
  auto a = CpuBackend::Create(path, few);
  auto b = CpuBackend::Create(path, full);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->max_active_sequences(), 2);
  EXPECT_EQ((*b)->max_active_sequences(), 6);
  EXPECT_LT((*a)->memory().recurrent, (*b)->memory().recurrent);
  const int V = (*a)->config().n_vocab;
  auto run = [&](Backend& be, int slot, int32_t pos0, std::vector<int32_t> toks,
                 StepOutput* out) { 
    SeqStep s;
    s.slot = slot;
    s.pos0 = pos0;
    s.tokens = std::move(toks);
    return be.Forward({&s, 1}, {}, out);
  };
  StepOutput oa, ob;
  const auto p0 = Tokens(7, V, 1), p4 = Tokens(5, V, 2), p5 = Tokens(9, V, 3);
  ASSERT_TRUE(run(**a, 0, 0, p0, &oa).ok());
  ASSERT_TRUE(run(**a, 4, 0, p4, &oa).ok());
  ASSERT_TRUE(run(**b, 4, 0, p4, &ob).ok());
  EXPECT_EQ(oa.logits, ob.logits);
  // A third sequence: no state left; refused before anything changes.
  EXPECT_EQ(run(**a, 5, 0, p5, &oa).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*a)->SlotLength(5), 0);
  EXPECT_EQ((*a)->SlotLength(4), 5);
  EXPECT_EQ((*a)->Snapshot(5).status().code(), absl::StatusCode::kFailedPrecondition);
  (*a)->ResetSlot(0);
  ASSERT_TRUE(run(**a, 5, 0, p5, &oa).ok());
  ASSERT_TRUE(run(**b, 5, 0, p5, &ob).ok());
  EXPECT_EQ(oa.logits, ob.logits);
  // Slot 4 goes on where it was, on whichever device slot it holds.
  ASSERT_TRUE(run(**a, 4, 5, {3}, &oa).ok());
  ASSERT_TRUE(run(**b, 4, 5, {3}, &ob).ok());
  EXPECT_EQ(oa.logits, ob.logits);
  // Move slot 4's sequence to slot 2 through a snapshot.
  auto snap = (*a)->Snapshot(4);
  ASSERT_TRUE(snap.ok()) << snap.status();
  (*a)->ResetSlot(4);
  ASSERT_TRUE((*a)->Restore(2, *snap).ok());
  EXPECT_EQ((*a)->SlotLength(2), 6);
  ASSERT_TRUE(run(**a, 2, 6, {8}, &oa).ok());
  ASSERT_TRUE(run(**b, 4, 6, {8}, &ob).ok());
  EXPECT_EQ(oa.logits, ob.logits);
  // Both device slots are taken (2 and 5): a restore into a third slot is refused.
  EXPECT_EQ((*a)->Restore(1, *snap).code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace ds
