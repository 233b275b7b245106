// GdnDecode's two launch forms (kernels/cuda/gdn.cu): launches of many blocks (heads x
// sequences >= 256) run the kernel compiled for two blocks per SM (registers capped, a few
// spilled), small ones the unspilled form that kernels_cuda_test checks against the CPU. The
// arithmetic is the same: a batch of 8 sequences of the 27B's GDN shape (48 heads: 384 blocks) in
// one launch gives outputs, states and conv rows bit-identical to the 8 sequences launched one
// by one (48 blocks each), over several steps, with the state in f32 and in bf16
// (GdnDecodeArgs::state_bf16). And the kernel's fused int8 output
// (GdnDecodeArgs::xq): it leaves the outputs as they were, is QuantizeActivations' copy bit for
// bit, and a run of tokens gives what the same tokens launched one by one give. Needs a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/gdn.cuh"
#include "kernels/cuda/gemv.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/gdn_layer_test_util.h"
#include "tests/kernels/cuda/gdn_state_test_util.h"

namespace ds::cuda {
namespace {

// Elements whose bits differ (a count, not a printout of a million floats).
size_t Differing(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// bf16: the state stored in bf16 (its start values rounded to it).
void RunManyInOneLaunch(bool bf16) {
  std::mt19937 rng(77);
  auto rand = [&](size_t n, float lo, float hi) { return RandVec(rng, n, lo, hi); };
  const GdnShape s{16, 48, 128, 128, 4};
  constexpr int kSeqs = 8, kSteps = 3, K = 4;
  const int C = s.channels(), Vw = s.v_heads * s.v_dim;
  const RandomGdnLayer layer(rng, s);
  const GdnLayerParams p = layer.p;
  const size_t ring1 = static_cast<size_t>(K) * C, st1 = static_cast<size_t>(Vw) * s.k_dim;
  // Two copies of every sequence's state: `one` launch for all, and one launch per sequence.
  const auto start_state = StateBytes(rand(kSeqs * st1, -0.5f, 0.5f), bf16);
  auto start_ring = rand(kSeqs * ring1, -1.f, 1.f);
  Dev<float> ring_all(start_ring), ring_one(start_ring);
  Dev<uint8_t> state_all(start_state), state_one(start_state);
  for (int step = 0; step < kSteps; ++step) {
    auto mixed = rand(static_cast<size_t>(kSeqs) * C, -2.f, 2.f);
    auto z = rand(static_cast<size_t>(kSeqs) * Vw, -3.f, 3.f);
    auto b = rand(static_cast<size_t>(kSeqs) * s.v_heads, -4.f, 4.f);
    auto al = rand(static_cast<size_t>(kSeqs) * s.v_heads, -6.f, 3.f);
    Dev<float> dm(mixed), dz(z), db(b), dal(al), out_all(static_cast<size_t>(kSeqs) * Vw),
        out_one(static_cast<size_t>(kSeqs) * Vw);
    std::vector<int32_t> rows(kSeqs), slots(kSeqs), pos(kSeqs);
    for (int i = 0; i < kSeqs; ++i) {
      rows[i] = i;
      slots[i] = i;
      pos[i] = 5 + step + i;  // different ring rows per sequence
    }
    Dev<int32_t> d_rows(rows), d_slots(slots), d_pos(pos);
    GdnDecodeArgs a = DecodeArgs(s, p, kSeqs, d_rows.p, d_slots.p, d_pos.p, dm, dz, db, dal,
                                 ring_all.p, state_all.p, out_all.p);
    a.state_bf16 = bf16;
    ASSERT_TRUE(GdnDecode(a, nullptr).ok());  // 48 x 8 = 384 blocks: the two-per-SM form
    for (int i = 0; i < kSeqs; ++i) {
      GdnDecodeArgs one = a;
      one.n_seqs = 1;
      one.rows = d_rows.p + i;
      one.slots = d_slots.p + i;
      one.pos = d_pos.p + i;
      one.conv_ring = ring_one.p;
      one.state = state_one.p;
      one.out = out_one.p;
      one.state_early = i % 2 == 1;               // the state's loads before the (here empty) wait
      ASSERT_TRUE(GdnDecode(one, nullptr).ok());  // 48 blocks: the unspilled form
    }
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(Differing(out_all.Down(), out_one.Down()), 0u) << "outputs, step " << step;
    EXPECT_TRUE(state_all.Down() == state_one.Down()) << "states, step " << step;
    EXPECT_EQ(Differing(ring_all.Down(), ring_one.Down()), 0u) << "conv rows, step " << step;
  }
}

TEST(GdnLaunch, ManySequencesInOneLaunchEqualOneByOne) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  RunManyInOneLaunch(false);
}

TEST(GdnLaunch, ManySequencesInOneLaunchEqualOneByOneBf16State) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  RunManyInOneLaunch(true);
}

// GdnDecodeArgs::bulk_state (the batched form with each head's state brought into shared memory
// by one bulk copy, sm_90) against the register form it replaces: the same outputs, states,
// conv rows and int8 copies, bit for bit, for 8 sequences of the 27B's GDN shape (384 blocks)
// as one-token rows and as runs of 3 tokens (an MTP verify at 8 streams: speculative entries,
// the state carried from token to token in shared memory), f32 and bf16 state; for the 27B's
// shape and a dk = 64 one (the register form's prologue split over the groups differently).
void RunBulkAgainstRegisters(bool bf16, int run_len, const GdnShape& s) {
  SCOPED_TRACE(::testing::Message() << (bf16 ? "bf16" : "f32") << " state, runs of " << run_len
                                    << ", dk " << s.k_dim);
  std::mt19937 rng(79 + run_len);
  auto rand = [&](size_t n, float lo, float hi) { return RandVec(rng, n, lo, hi); };
  constexpr int kSeqs = 8, K = 4;
  const int T = kSeqs * run_len, C = s.channels(), Vw = s.v_heads * s.v_dim;
  const RandomGdnLayer layer(rng, s);
  // Sequence i: slot i, its run's tokens write speculative entries kSeqs + i * run_len + t.
  const int n_states = kSeqs * (1 + run_len);
  const size_t ring1 = static_cast<size_t>(K) * C, st1 = static_cast<size_t>(Vw) * s.k_dim;
  const auto start_state = StateBytes(rand(n_states * st1, -0.5f, 0.5f), bf16);
  const auto start_ring = rand(n_states * ring1, -1.f, 1.f);
  Dev<float> dm(rand(static_cast<size_t>(T) * C, -2.f, 2.f)),
      dz(rand(static_cast<size_t>(T) * Vw, -3.f, 3.f)),
      db(rand(static_cast<size_t>(T) * s.v_heads, -4.f, 4.f)),
      dal(rand(static_cast<size_t>(T) * s.v_heads, -6.f, 3.f));
  std::vector<int32_t> rows(T), slots(T), in_slots(T), pos(T), first(kSeqs), len(kSeqs, run_len);
  for (int i = 0; i < kSeqs; ++i) {
    first[i] = i * run_len;
    for (int t = 0; t < run_len; ++t) {
      const int e = i * run_len + t;
      rows[e] = e;
      slots[e] = run_len == 1 ? i : kSeqs + e;
      in_slots[e] = t == 0 ? i : slots[e - 1];
      pos[e] = 7 + 3 * i + t;
    }
  }
  Dev<int32_t> d_rows(rows), d_slots(slots), d_in(in_slots), d_pos(pos), d_first(first),
      d_len(len);
  struct Result {
    std::vector<float> out, ring, xd;
    std::vector<uint8_t> state;
    std::vector<int8_t> xq;
  };
  auto run = [&](bool bulk, bool state_early) {
    Dev<float> ring(start_ring), out(static_cast<size_t>(T) * Vw),
        xd(static_cast<size_t>(T) * Vw / 32);
    Dev<uint8_t> state(start_state);
    Dev<int8_t> xq(static_cast<size_t>(T) * Vw);
    GdnDecodeArgs a = DecodeArgs(s, layer.p, kSeqs, d_rows.p, d_slots.p, d_pos.p, dm, dz, db,
                                 dal, ring.p, state.p, out.p);
    a.in_slots = run_len == 1 ? nullptr : d_in.p;
    if (run_len > 1) {
      a.run_first = d_first.p;
      a.run_len = d_len.p;
    }
    a.state_bf16 = bf16;
    a.xq = xq.p;
    a.xd = xd.p;
    a.bulk_state = bulk;
    a.state_early = state_early;
    const absl::Status st = GdnDecode(a, nullptr);  // >= 256 blocks: the batched forms
    EXPECT_TRUE(st.ok()) << st;
    return Result{out.Down(), ring.Down(), xd.Down(), state.Down(), xq.Down()};
  };
  const Result reg = run(false, false), bulk = run(true, false), early = run(true, true);
  for (const Result* r : {&bulk, &early}) {
    SCOPED_TRACE(r == &early ? "bulk, the state copy asked for before the wait" : "bulk");
    EXPECT_EQ(Differing(r->out, reg.out), 0u) << "outputs";
    EXPECT_TRUE(r->state == reg.state) << "states";
    EXPECT_EQ(Differing(r->ring, reg.ring), 0u) << "conv rows";
    EXPECT_EQ(r->xq, reg.xq) << "int8 copies";
    EXPECT_EQ(Differing(r->xd, reg.xd), 0u) << "int8 scales";
  }
  // Not a vacuous comparison: the launch wrote the outputs (they start as Dev's NaN poison).
  size_t written = 0;
  for (float v : bulk.out) written += std::isfinite(v) && v != 0.f;
  EXPECT_GT(written, bulk.out.size() * 9 / 10);
}

TEST(GdnLaunch, BulkStateEqualsRegisterState) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  if (!GdnBulkStateAvailable()) GTEST_SKIP() << "no sm_90 bulk copies on this device / build";
  // The 27B's GDN shape (48 heads x 8 = 384 blocks) and a dk = 64 one (64 heads: 512 blocks).
  for (const GdnShape& s : {GdnShape{16, 48, 128, 128, 4}, GdnShape{8, 64, 64, 64, 4}})
    for (const bool bf16 : {false, true})
      for (const int run_len : {1, 3}) RunBulkAgainstRegisters(bf16, run_len, s);
}

TEST(GdnLaunch, BulkStateIsRefusedWhereItCannotRun) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  if (GdnBulkStateAvailable()) GTEST_SKIP() << "bulk copies run here";
  GdnDecodeArgs a;
  a.shape = GdnShape{16, 48, 128, 128, 4};
  a.n_seqs = 8;
  a.bulk_state = true;
  EXPECT_FALSE(GdnDecode(a, nullptr).ok());
}

// Not a test: per-launch time of the 27B's GDN decode layer (the two-per-SM form) at 16 and 64
// sequences, and the state bandwidth that follows (one read and one write of every sequence's
// state; a copy on the H200 reaches ~4.3 TB/s). For ncu and A/B runs
// (tools/device/gdn_decode_profile.sh): --gtest_also_run_disabled_tests
// --gtest_filter='GdnLaunchTiming.*'.
TEST(GdnLaunchTiming, DISABLED_Batched27B) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  auto rand = [&](size_t n, float lo, float hi) { return RandVec(rng, n, lo, hi); };
  const GdnShape s{16, 48, 128, 128, 4};
  const int K = 4, C = s.channels(), Vw = s.v_heads * s.v_dim, Hv = s.v_heads;
  const RandomGdnLayer layer(rng, s);
  for (int n : {16, 64}) {
    const size_t st1 = static_cast<size_t>(Vw) * s.k_dim;
    Dev<float> state(rand(n * st1, -0.5f, 0.5f)),
        ring(rand(static_cast<size_t>(n) * K * C, -1.f, 1.f)),
        dm(rand(static_cast<size_t>(n) * C, -2.f, 2.f)),
        dz(rand(static_cast<size_t>(n) * Vw, -3.f, 3.f)),
        db(rand(static_cast<size_t>(n) * Hv, -4.f, 4.f)),
        dal(rand(static_cast<size_t>(n) * Hv, -6.f, 3.f)), out(static_cast<size_t>(n) * Vw);
    std::vector<int32_t> idx(n), pos(n, 9);
    for (int i = 0; i < n; ++i) idx[i] = i;
    Dev<int32_t> d_idx(idx), d_pos(pos);
    GdnDecodeArgs a = DecodeArgs(s, layer.p, n, d_idx.p, d_idx.p, d_pos.p, dm, dz, db, dal,
                                 ring.p, state.p, out.p);
    for (const bool bulk : {false, true}) {
      if (bulk && !GdnBulkStateAvailable()) continue;
      a.bulk_state = bulk;
      const double us = MeanLaunchUs(3, 20, [&] { return GdnDecode(a, nullptr); });
      const double bytes = 2.0 * n * st1 * 4;
      std::printf("GDN decode, 27B layer, %2d sequences, %s: %7.1f us, %6.0f GB/s of state\n", n,
                  bulk ? "bulk copy" : "registers", us, bytes / us * 1e-3);
    }
  }
}

TEST(GdnLaunch, FusedInt8OutputMatchesTheSeparateQuantization) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(78);
  auto rand = [&](size_t n, float lo, float hi) { return RandVec(rng, n, lo, hi); };
  const GdnShape s{16, 48, 128, 128, 4};
  constexpr int kSeqs = 3, K = 4;
  const int C = s.channels(), Vw = s.v_heads * s.v_dim, Hv = s.v_heads;
  const RandomGdnLayer layer(rng, s);
  const GdnLayerParams p = layer.p;
  const auto b = rand(static_cast<size_t>(kSeqs) * Hv, -4.f, 4.f);
  const auto al = rand(static_cast<size_t>(kSeqs) * Hv, -6.f, 3.f);
  Dev<float> d_b(b), d_al(al);
  const auto mixed = rand(static_cast<size_t>(kSeqs) * C, -2.f, 2.f);
  const auto z = rand(static_cast<size_t>(kSeqs) * Vw, -3.f, 3.f);
  Dev<float> dm(mixed), dz(z);
  // States: slot 0 and speculative entries 1..kSeqs (a run of kSeqs tokens of slot 0).
  const size_t ring1 = static_cast<size_t>(K) * C, st1 = static_cast<size_t>(Vw) * s.k_dim;
  const int n_states = 1 + kSeqs;
  auto start_state = rand(n_states * st1, -0.5f, 0.5f), start_ring = rand(n_states * ring1, -1.f, 1.f);
  std::vector<int32_t> rows(kSeqs), slots(kSeqs), in_slots(kSeqs), pos(kSeqs), first{0}, len{kSeqs};
  for (int i = 0; i < kSeqs; ++i) {
    rows[i] = i;
    slots[i] = 1 + i;
    in_slots[i] = i;  // token i reads the previous token's entry (slot 0 for the first)
    pos[i] = 9 + i;
  }
  Dev<int32_t> d_rows(rows), d_slots(slots), d_in(in_slots), d_pos(pos), d_first(first), d_len(len);
  auto args = [&](Dev<float>& ring, Dev<float>& state, Dev<float>& out) {
    GdnDecodeArgs a;
    a.shape = s;
    a.p = p;
    a.rows = d_rows.p;
    a.slots = d_slots.p;
    a.in_slots = d_in.p;
    a.pos = d_pos.p;
    a.mixed = dm.p;
    a.z = dz.p;
    a.b = d_b.p;
    a.alpha = d_al.p;
    a.conv_ring = ring.p;
    a.state = state.p;
    a.out = out.p;
    return a;
  };
  auto one_by_one = [&](GdnDecodeArgs a) {
    for (int i = 0; i < kSeqs; ++i) {
      GdnDecodeArgs w = a;
      w.n_seqs = 1;
      w.rows = d_rows.p + i;
      w.slots = d_slots.p + i;
      w.in_slots = d_in.p + i;
      w.pos = d_pos.p + i;
      ASSERT_OK(GdnDecode(w, nullptr));
    }
  };
  // Without the int8 output, token by token.
  Dev<float> ring_ref(start_ring), state_ref(start_state), out_ref(static_cast<size_t>(kSeqs) * Vw);
  one_by_one(args(ring_ref, state_ref, out_ref));
  // Fused, token by token (the decode waves) and as one run (an MTP verify).
  Dev<int8_t> xq_w(static_cast<size_t>(kSeqs) * Vw), xq_r(static_cast<size_t>(kSeqs) * Vw);
  Dev<float> xd_w(static_cast<size_t>(kSeqs) * Vw / 32), xd_r(static_cast<size_t>(kSeqs) * Vw / 32);
  auto fused = [&](GdnDecodeArgs a, Dev<int8_t>& xq, Dev<float>& xd) {
    a.xq = xq.p;
    a.xd = xd.p;
    return a;
  };
  Dev<float> ring_w(start_ring), state_w(start_state), out_w(static_cast<size_t>(kSeqs) * Vw);
  one_by_one(fused(args(ring_w, state_w, out_w), xq_w, xd_w));
  Dev<float> ring_r(start_ring), state_r(start_state), out_r(static_cast<size_t>(kSeqs) * Vw);
  GdnDecodeArgs run = fused(args(ring_r, state_r, out_r), xq_r, xd_r);
  run.n_seqs = 1;
  run.run_first = d_first.p;
  run.run_len = d_len.p;
  ASSERT_OK(GdnDecode(run, nullptr));
  // The run again with its tokens' prologues and epilogues spread over the thread groups.
  Dev<int8_t> xq_s(static_cast<size_t>(kSeqs) * Vw);
  Dev<float> xd_s(static_cast<size_t>(kSeqs) * Vw / 32);
  Dev<float> ring_s(start_ring), state_s(start_state), out_s(static_cast<size_t>(kSeqs) * Vw);
  GdnDecodeArgs spread = fused(args(ring_s, state_s, out_s), xq_s, xd_s);
  spread.n_seqs = 1;
  spread.run_first = d_first.p;
  spread.run_len = d_len.p;
  spread.spread_run_tokens = true;
  ASSERT_OK(GdnDecode(spread, nullptr));
  CK(cudaDeviceSynchronize());

  const auto o_ref = out_ref.Down(), o_w = out_w.Down();
  EXPECT_EQ(Differing(o_w, o_ref), 0u) << "outputs: with the int8 copy vs without";
  EXPECT_EQ(Differing(state_w.Down(), state_ref.Down()), 0u) << "states";
  EXPECT_EQ(Differing(out_r.Down(), o_w), 0u) << "run vs one by one: outputs";
  EXPECT_EQ(Differing(state_r.Down(), state_w.Down()), 0u) << "run vs one by one: states";
  EXPECT_EQ(Differing(ring_r.Down(), ring_w.Down()), 0u) << "run vs one by one: conv rows";
  EXPECT_EQ(Differing(out_s.Down(), o_w), 0u) << "spread run vs one by one: outputs";
  EXPECT_EQ(Differing(state_s.Down(), state_w.Down()), 0u) << "spread run vs one by one: states";
  EXPECT_EQ(Differing(ring_s.Down(), ring_w.Down()), 0u) << "spread run vs one by one: conv rows";
  EXPECT_EQ(xq_s.Down(), xq_r.Down()) << "spread run: int8 copies";
  EXPECT_EQ(Differing(xd_s.Down(), xd_r.Down()), 0u) << "spread run: int8 scales";
  // The int8 copy equals QuantizeActivations of the same output, in both forms.
  Dev<int8_t> xq_q(static_cast<size_t>(kSeqs) * Vw);
  Dev<float> xd_q(static_cast<size_t>(kSeqs) * Vw / 32);
  ASSERT_OK(QuantizeActivations(out_w.p, kSeqs, Vw, xq_q.p, xd_q.p, nullptr));
  EXPECT_EQ(xq_w.Down(), xq_q.Down());
  EXPECT_EQ(xq_r.Down(), xq_q.Down());
  EXPECT_EQ(Differing(xd_w.Down(), xd_q.Down()), 0u);
  EXPECT_EQ(Differing(xd_r.Down(), xd_q.Down()), 0u);

  // One row with the 16-element sums (the one-stream step), against QuantizeActivations' sums.
  Dev<float> ring_1(start_ring), state_1(start_state), out_1(Vw);
  Dev<int8_t> xq_1(Vw);
  Dev<float> xd_1(Vw / 32);
  Dev<int32_t> sum_1(Vw / 16), sum_q(Vw / 16);
  GdnDecodeArgs a1 = fused(args(ring_1, state_1, out_1), xq_1, xd_1);
  a1.n_seqs = 1;
  a1.xsum = sum_1.p;
  ASSERT_OK(GdnDecode(a1, nullptr));
  ASSERT_OK(QuantizeActivations(out_1.p, 1, Vw, xq_q.p, xd_q.p, nullptr, sum_q.p));
  EXPECT_EQ(xq_1.Down(), xq_q.Down(Vw));
  EXPECT_EQ(sum_1.Down(), sum_q.Down());
  // Misuse is refused, not run.
  GdnDecodeArgs bad = a1;
  bad.xd = nullptr;
  EXPECT_FALSE(GdnDecode(bad, nullptr).ok());
  bad = run;
  bad.xsum = sum_1.p;
  EXPECT_FALSE(GdnDecode(bad, nullptr).ok());
}

}  // namespace
}  // namespace ds::cuda
