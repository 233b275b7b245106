// The f16 tensor-core matmul on tiled Q6_K (kernels/cuda/tiled_f16.cuh) against its CPU
// reference (kernels/cpu/tiled_f16_ref.h: the same f16 operands, summed exactly) and against the
// f32 product of the dequantized weights (within f16 rounding); a column's result the same at
// every column count (batch invariance); the K-split path, epilogues, several matrices in one
// launch, argument checks. TiledF16Timing.Table27B is the benchmark that fills the dispatch table
// (worker/cuda/matmul_dispatch.cc): it prints only. Needs a GPU (sm_80+).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/tiled_f16_ref.h"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/mmq.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/tiled_f16.cuh"
#include "kernels/cuda/tiled_f16_split.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/tiled_f16_test_util.h"
#include "tests/kernels/cuda/tiled_test_util.h"

namespace ds::cuda {
namespace {

std::mt19937& Rng() {
  static std::mt19937 rng(4242);
  return rng;
}

// Random raw Q6_K rows (every quant and scale bit pattern), d in [2e-5, 4e-4).
std::vector<uint8_t> RandomQ6K(int64_t rows, int K) {
  return RandomQ6KRows(Rng(), rows, K, 2e-5f, 4e-4f);
}

std::vector<float> RandomActs(int nc, int K) { return RandomHalfActs(Rng(), nc, K); }

Dev<uint8_t> Tile(const Dev<uint8_t>& raw, int M, int K) { return TileQ6K(raw, M, K); }

using Scratch = F16Scratch;

struct HalfActs {
  Dev<uint16_t> xh;
  Dev<float> xs;
};
HalfActs Convert(const std::vector<float>& x, int nc, int K) {
  Dev<float> dx(x);
  HalfActs h{Dev<uint16_t>(x.size()), Dev<float>(static_cast<size_t>(nc))};
  EXPECT_TRUE(HalfActivations(dx.p, nc, K, h.xh.p, h.xs.p, nullptr).ok());
  return h;
}

// A launch's arguments on f16 activations (w2 only for the pair).
GemvArgs F16Args(const void* w, const void* w2, int M, int K, int nc, const HalfActs& h, float* y,
                 GemvEpilogue ep) {
  return F16LaunchArgs(GgmlType::Q6_K, w, w2, M, K, nc, h.xh.p, h.xs.p, nullptr, y, ep);
}

// Rows held in registers (K up to 20,480: 128..1024 threads) and rows read twice (longer).
TEST(TiledF16, HalfActivationsMatchCpu) {
  for (int K : {1280, 512, 6144, 17408, 24576}) {
    SCOPED_TRACE(::testing::Message() << "K=" << K);
    auto x = RandomActs(9, K);
    x[2 * K + 5] = 1e30f;                                   // a huge row: scaled down
    std::fill_n(x.begin() + 3 * K, K, 0.f);                 // all zero: scale 1
    std::fill_n(x.begin() + 4 * K, K, 1e-40f);              // subnormal floats: scaled up, capped
    x[5 * K + 7] = std::numeric_limits<float>::infinity();  // non-finite: scale 1
    const int nc = 9;
    HalfActs h = Convert(x, nc, K);
    {  // the two-read form (rows_in_registers off) gives the same bits
      HalfActs h2 = Convert(x, nc, K);
      Dev<float> dx(x);
      ASSERT_OK(HalfActivations(dx.p, nc, K, h2.xh.p, h2.xs.p, nullptr, false, nullptr, false, false));
      EXPECT_EQ(h2.xh.Down(), h.xh.Down());
      EXPECT_EQ(h2.xs.Down(), h.xs.Down());
    }
    std::vector<uint16_t> want(x.size());
    std::vector<float> want_s(nc);
    for (int c = 0; c < nc; ++c)
      cpu::HalfActivationsRow(x.data() + static_cast<size_t>(c) * K, K,
                              want.data() + static_cast<size_t>(c) * K, &want_s[c]);
    EXPECT_EQ(h.xh.Down(), want);
    EXPECT_EQ(h.xs.Down(), want_s);
    // Every finite row's largest value lands in [2^13, 2^14) (the zero, capped and inf rows aside).
    for (int c : {0, 1, 2, 6, 7, 8}) {
      float m = 0.f;
      for (int k = 0; k < K; ++k)
        m = std::max(m, std::fabs(F16ToF32(want[static_cast<size_t>(c) * K + k])));
      EXPECT_GE(m, 8192.f) << c;
      EXPECT_LE(m, 16384.f) << c;
    }
    EXPECT_EQ(want_s[3], 1.f);
    EXPECT_EQ(want_s[5], 1.f);
  }
}

// The fused norm's f16 copy is HalfActivations' of the normed rows, bit for bit, and its f32
// rows are RmsNormRows' (rows of 5120: one group per thread; 17408: several).
TEST(TiledF16, RmsNormHalfMatchesNormThenConvert) {
  for (int n : {5120, 17408, 256}) {
    const int T = 19;
    auto x = RandomActs(T, n);
    std::vector<float> w(n);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (auto& v : w) v = u(Rng());
    Dev<float> dx(x), dw(w), out_a(x.size()), out_b(x.size()), xs_a(T), xs_b(T);
    Dev<uint16_t> xh_a(x.size()), xh_b(x.size());
    ASSERT_OK(RmsNormHalf(dx.p, dw.p, out_a.p, xh_a.p, xs_a.p, T, n, 1e-6f, nullptr));
    ASSERT_OK(RmsNormRows(dx.p, n, nullptr, dw.p, out_b.p, T, n, 1e-6f, nullptr));
    ASSERT_OK(HalfActivations(out_b.p, T, n, xh_b.p, xs_b.p, nullptr));
    EXPECT_EQ(out_a.Down(), out_b.Down()) << n;
    EXPECT_EQ(xh_a.Down(), xh_b.Down()) << n;
    EXPECT_EQ(xs_a.Down(), xs_b.Down()) << n;
  }
}

struct Case {
  int M, K, nc;
  GemvEpilogue ep;
  int cpu_row_step = 1;  // rows checked against the CPU (every n-th): the 27B shapes are large
};

// GPU vs the CPU reference of the f16 operands (tight) and vs the f32 product (f16 rounding
// bound); returns the outputs. `wgmma`: the warpgroup form, on the activations in its order.
std::vector<float> RunCase(const Case& c, const Scratch& scratch, bool wgmma = false) {
  SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " nc=" << c.nc
                                    << " ep=" << static_cast<int>(c.ep) << " wgmma=" << wgmma);
  const bool pair = c.ep == GemvEpilogue::kSiluMul;
  const auto w = RandomQ6K(c.M, c.K);
  const auto w2 = pair ? RandomQ6K(c.M, c.K) : std::vector<uint8_t>(1);
  const auto x = RandomActs(c.nc, c.K);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> y0(static_cast<size_t>(c.nc) * c.M);
  for (auto& v : y0) v = u(Rng());
  Dev<uint8_t> dw(w), dw2(w2);
  Dev<uint8_t> tw = Tile(dw, c.M, c.K);
  Dev<uint8_t> tw2 = pair ? Tile(dw2, c.M, c.K) : Dev<uint8_t>(1);
  HalfActs h = Convert(x, c.nc, c.K);
  Dev<uint16_t> xh_wg = ToWarpgroupOrder(h.xh);
  GemvArgs a = F16Args(tw.p, tw2.p, c.M, c.K, c.nc, h, nullptr, c.ep);
  if (wgmma) a.xh = xh_wg.p;
  Dev<float> y(y0);
  a.y = y.p;
  EXPECT_TRUE(TiledF16Multi(&a, 1, scratch.get(true, wgmma), nullptr).ok());
  const auto got = y.Down();
  // Twice more into fresh outputs: the same bits (the K split's tickets were reset).
  for (int rep = 0; rep < 2; ++rep) {
    Dev<float> y2(y0);
    a.y = y2.p;
    EXPECT_TRUE(TiledF16Multi(&a, 1, scratch.get(true, wgmma), nullptr).ok());
    const auto again = y2.Down();
    EXPECT_EQ(0, std::memcmp(again.data(), got.data(), got.size() * 4)) << "run " << rep + 2;
  }

  const auto xh = h.xh.Down();
  const auto xs = h.xs.Down();
  const uint64_t rb = GgmlRowBytes(GgmlType::Q6_K, c.K);
  std::vector<float> wf(c.K);
  // The same f16 operands, exactly; and the f32 product of the dequantized row (f16 rounds every
  // weight above 2048 * |d| and every activation by <= 2^-11).
  auto dots = [&](int m, int r, int col) {
    const std::vector<uint8_t>& mat = m == 0 ? w : w2;
    const float* xc = x.data() + static_cast<size_t>(col) * c.K;
    RefDots d;
    d.exact = xs[col] * cpu::TiledF16DotQ6K(mat.data() + r * rb,
                                            xh.data() + static_cast<size_t>(col) * c.K, c.K, &d.abs);
    d.abs *= xs[col];
    cpu::DequantizeRow(GgmlType::Q6_K, mat.data() + r * rb, wf.data(), c.K);
    for (int k = 0; k < c.K; ++k) {
      d.f32 += static_cast<double>(wf[k]) * xc[k];
      d.f32_abs += std::fabs(static_cast<double>(wf[k]) * xc[k]);
    }
    d.rounded_abs = d.f32_abs;
    return d;
  };
  const std::string label = "Q6_K K=" + std::to_string(c.K);
  ExpectWithinReferences(label.c_str(), c.M, c.nc, c.ep, c.cpu_row_step, y0, got, dots);
  return got;
}

TEST(TiledF16, EveryColumnCountOddShape) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  // M = 37: a partial last tile and a partial block; K = 768: 3 units (one K split of 1 unit).
  for (int nc = 1; nc <= 64; ++nc) RunCase({37, 768, nc, GemvEpilogue::kStore}, s);
}

TEST(TiledF16, EpiloguesSplitAndLongK) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  for (int nc : {1, 9, 17, 33, 64}) RunCase({21, 512, nc, GemvEpilogue::kSiluMul}, s);
  for (int nc : {5, 16, 40, 64}) RunCase({50, 1280, nc, GemvEpilogue::kAccumulate}, s);
  // K splits (TiledF16SplitFor on a 132-SM H200): 6 row blocks x 4 ranges of 17 units; the pair's 5 row
  // blocks x 3 ranges of its 8 units (its gate and up partials both go through the scratch).
  RunCase({700, 4352, 24, GemvEpilogue::kStore, 3}, s);
  for (int nc : {17, 40}) RunCase({300, 2048, nc, GemvEpilogue::kSiluMul, 7}, s);
}

TEST(TiledF16, ModelShapes27B) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  RunCase({17408, 5120, 64, GemvEpilogue::kSiluMul, 211}, s);
  RunCase({5120, 17408, 48, GemvEpilogue::kAccumulate, 97}, s);
  RunCase({10240, 5120, 16, GemvEpilogue::kStore, 101}, s);
  RunCase({5120, 6144, 33, GemvEpilogue::kAccumulate, 89}, s);
}

// The warpgroup order of the activations: HalfActivations and RmsNormHalf with the flag write
// the plain bits permuted exactly as the definition (WarpgroupOrder) says, scales and sub-block
// sums unchanged; a K that is not a multiple of 16 is refused.
TEST(TiledF16Wgmma, WarpgroupOrderOfTheActivations) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  for (int n : {256, 768, 5120}) {
    const int T = 3;
    const auto x = RandomActs(T, n);
    Dev<float> dx(x);
    Dev<uint16_t> plain(x.size()), wg(x.size()), sums_p(x.size() / 16), sums_w(x.size() / 16);
    Dev<float> xs_p(T), xs_w(T);
    ASSERT_OK(HalfActivations(dx.p, T, n, plain.p, xs_p.p, nullptr, false, sums_p.p));
    ASSERT_OK(HalfActivations(dx.p, T, n, wg.p, xs_w.p, nullptr, false, sums_w.p, true));
    const auto want = WarpgroupOrder(plain.Down());
    EXPECT_EQ(wg.Down(), want) << n;
    if (n > 256) {  // (n = 256: one all-zero block)
      EXPECT_NE(wg.Down(), plain.Down()) << n;
    }
    EXPECT_EQ(xs_w.Down(), xs_p.Down()) << n;
    EXPECT_EQ(sums_w.Down(), sums_p.Down()) << n;
    std::vector<float> w(n, 1.25f);
    Dev<float> dw(w), out(x.size());
    Dev<uint16_t> normed(x.size());
    ASSERT_OK(RmsNormHalf(dx.p, dw.p, out.p, plain.p, xs_p.p, T, n, 1e-6f, nullptr));
    ASSERT_OK(RmsNormHalf(dx.p, dw.p, out.p, normed.p, xs_w.p, T, n, 1e-6f, nullptr, false,
                          nullptr, true));
    EXPECT_EQ(normed.Down(), WarpgroupOrder(plain.Down())) << n;
  }
  Dev<float> dx(24);
  Dev<uint16_t> xh(24);
  Dev<float> xs(1);
  EXPECT_FALSE(HalfActivations(dx.p, 1, 24, xh.p, xs.p, nullptr, false, nullptr, true).ok());
}

// The wgmma form against the CPU reference: every column count, the three epilogues, K splits
// (through clusters and the scratch), the 27B shapes.
TEST(TiledF16Wgmma, WithinTheReference) {
  if (!HaveWgmma()) GTEST_SKIP() << "needs sm_90a code on an sm_90 GPU";
  Scratch s;
  for (int nc = 1; nc <= 64; ++nc) RunCase({37, 768, nc, GemvEpilogue::kStore}, s, true);
  for (int nc : {1, 9, 17, 33, 64}) RunCase({21, 512, nc, GemvEpilogue::kSiluMul}, s, true);
  for (int nc : {5, 16, 40, 64}) RunCase({50, 1280, nc, GemvEpilogue::kAccumulate}, s, true);
  RunCase({700, 4352, 24, GemvEpilogue::kStore, 3}, s, true);
  for (int nc : {17, 40}) RunCase({300, 2048, nc, GemvEpilogue::kSiluMul, 7}, s, true);
  RunCase({17408, 5120, 64, GemvEpilogue::kSiluMul, 211}, s, true);
  RunCase({5120, 17408, 48, GemvEpilogue::kAccumulate, 97}, s, true);
  RunCase({10240, 5120, 16, GemvEpilogue::kStore, 101}, s, true);
}

// The same f16 operands summed per 256-element unit in f32 by the tensor cores: the wgmma form
// gives the mma.sync form's bits, at every column count (so a decode row's numbers do not depend
// on which form its step took), through clusters and the scratch alike.
TEST(TiledF16Wgmma, SameBitsAsMmaSync) {
  if (!HaveWgmma()) GTEST_SKIP() << "needs sm_90a code on an sm_90 GPU";
  Scratch s;
  for (const auto& [M, K, ep] : {std::tuple{40, 1024, GemvEpilogue::kStore},
                                 std::tuple{2000, 2048, GemvEpilogue::kAccumulate},
                                 std::tuple{300, 2048, GemvEpilogue::kSiluMul},
                                 std::tuple{5120, 17408, GemvEpilogue::kStore},
                                 std::tuple{17408, 5120, GemvEpilogue::kSiluMul}}) {
    Dev<uint8_t> raw(RandomQ6K(M, K)), raw2(RandomQ6K(M, K));
    Dev<uint8_t> t = Tile(raw, M, K), t2 = Tile(raw2, M, K);
    const auto x = RandomActs(64, K);
    HalfActs h = Convert(x, 64, K);
    Dev<uint16_t> xh_wg = ToWarpgroupOrder(h.xh);
    for (int nc : {1, 8, 9, 16, 24, 33, 64}) {
      std::vector<float> y0(static_cast<size_t>(nc) * M);
      for (size_t i = 0; i < y0.size(); ++i) y0[i] = 0.001f * static_cast<float>(i % 977);
      std::vector<float> got[3];
      for (int form = 0; form < 3; ++form) {  // mma.sync; wgmma with clusters; wgmma, scratch
        Dev<float> y(y0);
        GemvArgs a = F16Args(t.p, t2.p, M, K, nc, h, y.p, ep);
        if (form > 0) a.xh = xh_wg.p;
        ASSERT_OK(TiledF16Multi(&a, 1, s.get(form != 2, form > 0), nullptr));
        got[form] = y.Down();
      }
      for (int form = 1; form < 3; ++form)
        EXPECT_EQ(0, std::memcmp(got[form].data(), got[0].data(), got[0].size() * 4))
            << "M=" << M << " K=" << K << " nc=" << nc << " form " << form;
    }
  }
}

// A column's result is the same bits whatever the column count (the decode rows of a batch do
// not change each other), for single matrices (with and without a K split) and the pair.
struct Shape {
  int M, K;
  GemvEpilogue ep;
};

TEST(TiledF16, ColumnCountDoesNotChangeAColumn) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  for (const Shape& sh :
       {Shape{40, 1024, GemvEpilogue::kStore}, Shape{2000, 2048, GemvEpilogue::kStore},
        Shape{100, 512, GemvEpilogue::kSiluMul}, Shape{300, 2048, GemvEpilogue::kSiluMul},
        // The 27B pair: on 132 SMs its last 8 row blocks in a launch of their own (tail_split).
        Shape{17408, 5120, GemvEpilogue::kSiluMul}}) {
    Dev<uint8_t> raw(RandomQ6K(sh.M, sh.K)), raw2(RandomQ6K(sh.M, sh.K));
    Dev<uint8_t> t = Tile(raw, sh.M, sh.K), t2 = Tile(raw2, sh.M, sh.K);
    const auto x = RandomActs(64, sh.K);
    HalfActs h = Convert(x, 64, sh.K);
    std::vector<float> full;
    for (int nc : {64, 1, 8, 9, 16, 17, 32, 33, 63}) {
      Dev<float> y(static_cast<size_t>(nc) * sh.M);
      const GemvArgs a = F16Args(t.p, t2.p, sh.M, sh.K, nc, h, y.p, sh.ep);
      ASSERT_OK(TiledF16Multi(&a, 1, s.get(), nullptr));
      const auto got = y.Down();
      if (nc == 64) {
        full = got;
        continue;
      }
      EXPECT_EQ(0, std::memcmp(got.data(), full.data(), got.size() * 4))
          << "M=" << sh.M << " nc=" << nc;
    }
  }
}

// The tail split (TiledF16Scratch::tail_split: the last round's row blocks in a second launch,
// each launch at its own rows' K split): on a 132-SM card (H100 / H200) the 27B pair's 17,408
// rows are 264 row blocks of 64 and a tail of 8, and its outputs are bit for bit those of the
// two parts launched alone without it; they differ from the one launch's only by rounding (the
// same terms summed in other groups), and stay within the CPU reference (RunCase).
TEST(TiledF16, TailSplitIsTheTwoPartsAlone) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (sms != 132) GTEST_SKIP() << "the tail's rows are those of a 132-SM card";
  const int M = 17408, K = 5120, head = 264 * 64;
  Dev<uint8_t> raw(RandomQ6K(M, K)), raw2(RandomQ6K(M, K));
  Dev<uint8_t> t = Tile(raw, M, K), t2 = Tile(raw2, M, K);
  const uint64_t skip = TiledBytes(GgmlType::Q6_K, head, K);
  // The planner's charge for partial sums as shipped (0.4: the tail at split 5) and the one
  // before (0.5: at 4; docs/perf/h200.md "The f16 matmul's K split, scanned").
  for (const double cost : {kSplitCost, 0.5})
  for (int nc : {9, 16, 64}) {
    SCOPED_TRACE(::testing::Message() << "split cost " << cost);
    s.split_cost = cost;
    const auto x = RandomActs(nc, K);
    HalfActs h = Convert(x, nc, K);
    std::vector<float> one, tail, parts;
    for (int form = 0; form < 3; ++form) {
      Dev<float> y(static_cast<size_t>(nc) * M);
      const GemvArgs a = F16Args(t.p, t2.p, M, K, nc, h, y.p, GemvEpilogue::kSiluMul);
      if (form < 2) {
        ASSERT_OK(TiledF16Multi(&a, 1, s.get(true, false, form == 1), nullptr));
      } else {
        GemvArgs p0 = a, p1 = a;
        p0.M = head;
        p0.ldy = p1.ldy = M;
        p1.w = t.p + skip;
        p1.w2 = t2.p + skip;
        p1.y = y.p + head;
        p1.M = M - head;
        ASSERT_OK(TiledF16Multi(&p0, 1, s.get(true, false, false), nullptr));
        ASSERT_OK(TiledF16Multi(&p1, 1, s.get(true, false, false), nullptr));
      }
      (form == 0 ? one : form == 1 ? tail : parts) = y.Down();
    }
    EXPECT_EQ(0, std::memcmp(tail.data(), parts.data(), tail.size() * 4)) << "nc=" << nc;
    float top = 0.f;
    for (const float v : one) top = std::max(top, std::fabs(v));
    int differ = 0;
    for (size_t i = 0; i < one.size(); ++i)
      if (std::memcmp(&one[i], &tail[i], 4) != 0) {
        ++differ;
        ASSERT_NEAR(one[i], tail[i], 1e-4f * top) << "output " << i;
      }
    EXPECT_GT(differ, 0) << "nc=" << nc << ": the tail split was not taken";
  }
  s.split_cost = kSplitCost;
  RunCase({17408, 5120, 16, GemvEpilogue::kSiluMul, 5}, s);
  RunCase({5120, 6144, 33, GemvEpilogue::kAccumulate, 89}, s);  // ssm_out at split 5
  s.split_cost = 0.5;
  RunCase({17408, 5120, 16, GemvEpilogue::kSiluMul, 5}, s);
}

// A forced K split (TiledF16Scratch::split_override, for the calibration benchmark) keeps every
// output within the CPU reference, for single matrices and the pair, through clusters and the
// scratch; splits the launch cannot take are refused.
TEST(TiledF16, SplitOverrideWithinTheReference) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  for (int split : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE(::testing::Message() << "split=" << split);
    s.split_override = split;
    RunCase({300, 4096, 16, GemvEpilogue::kStore}, s);
    RunCase({300, 4096, 64, GemvEpilogue::kSiluMul}, s);
  }
  Dev<uint8_t> raw(RandomQ6K(300, 4096));
  Dev<uint8_t> t = Tile(raw, 300, 4096);
  HalfActs h = Convert(RandomActs(16, 4096), 16, 4096);
  Dev<float> y(16 * 300);
  const GemvArgs a = F16Args(t.p, nullptr, 300, 4096, 16, h, y.p, GemvEpilogue::kStore);
  for (int split : {9, 16}) {  // past kMaxSplit, then past half of the 16 units
    s.split_override = split;
    EXPECT_EQ(TiledF16Multi(&a, 1, s.get(), nullptr).code(), absl::StatusCode::kInvalidArgument)
        << "split=" << split;
  }
}

// On sm_90 the K split's partial sums meet in distributed shared memory (clusters); below, in
// the global scratch. Both add them in split order: the same bits, for single matrices, the
// pair, several segments, every column-count form. (TiledF16Multi still takes the scratch where
// clusters would not pay: for the 27B ffn_down shape, and the 27B pair at 1 and 9 columns,
// both runs below take it; every other case here runs clusters against the scratch.)
TEST(TiledF16, ClusterSplitEqualsScratchSplit) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  if (!HaveClusters()) GTEST_SKIP() << "needs sm_90 (clusters)";
  Scratch s;
  // Splits (132-SM H200): 4, 2, 6 (the 27B ffn_down), 3 (the 27B ffn pair), 4 (ssm_out).
  for (const Shape& sh :
       {Shape{700, 4352, GemvEpilogue::kStore}, Shape{300, 2048, GemvEpilogue::kSiluMul},
        Shape{5120, 17408, GemvEpilogue::kAccumulate}, Shape{17408, 5120, GemvEpilogue::kSiluMul},
        Shape{5120, 6144, GemvEpilogue::kAccumulate}}) {
    Dev<uint8_t> raw(RandomQ6K(sh.M, sh.K)), raw2(RandomQ6K(sh.M, sh.K));
    Dev<uint8_t> t = Tile(raw, sh.M, sh.K), t2 = Tile(raw2, sh.M, sh.K);
    const auto x = RandomActs(64, sh.K);
    HalfActs h = Convert(x, 64, sh.K);
    for (int nc : {1, 9, 24, 64}) {
      std::vector<float> y0(static_cast<size_t>(nc) * sh.M);
      for (size_t i = 0; i < y0.size(); ++i) y0[i] = 0.001f * static_cast<float>(i % 977);
      std::vector<float> got[2];
      for (int cl : {1, 0}) {
        Dev<float> y(y0);
        const GemvArgs a = F16Args(t.p, t2.p, sh.M, sh.K, nc, h, y.p, sh.ep);
        ASSERT_OK(TiledF16Multi(&a, 1, s.get(cl == 1), nullptr));
        got[cl] = y.Down();
      }
      EXPECT_EQ(0, std::memcmp(got[0].data(), got[1].data(), got[0].size() * 4))
          << "M=" << sh.M << " K=" << sh.K << " nc=" << nc;
    }
  }
  // Three segments in one launch (segments' row blocks meet in one grid).
  const int K = 4096, nc = 20, Ms[3] = {640, 7, 900};
  const auto x = RandomActs(nc, K);
  HalfActs h = Convert(x, nc, K);
  std::vector<Dev<uint8_t>> tiled;
  for (int i = 0; i < 3; ++i) {
    Dev<uint8_t> d(RandomQ6K(Ms[i], K));
    tiled.push_back(Tile(d, Ms[i], K));
  }
  std::vector<float> got[2][3];
  for (int cl : {0, 1}) {
    std::vector<Dev<float>> ys;
    GemvArgs segs[3];
    for (int i = 0; i < 3; ++i) {
      ys.emplace_back(static_cast<size_t>(nc) * Ms[i]);
      segs[i] = F16Args(tiled[i].p, nullptr, Ms[i], K, nc, h, ys[i].p, GemvEpilogue::kStore);
    }
    ASSERT_OK(TiledF16Multi(segs, 3, s.get(cl == 1), nullptr));
    for (int i = 0; i < 3; ++i) got[cl][i] = ys[i].Down();
  }
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(0, std::memcmp(got[0][i].data(), got[1][i].data(), got[0][i].size() * 4))
        << "segment " << i;
}

// Several matrices in one launch: each within the reference (the K split is the launch's).
TEST(TiledF16, MultiSegments) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  const int K = 1536, nc = 20;
  const int Ms[3] = {640, 7, 900};
  const auto x = RandomActs(nc, K);
  HalfActs h = Convert(x, nc, K);
  const auto xh = h.xh.Down();
  const auto xs = h.xs.Down();
  std::vector<std::vector<uint8_t>> raw;
  std::vector<Dev<uint8_t>> tiled;
  std::vector<Dev<float>> ys;
  GemvArgs segs[3];
  for (int i = 0; i < 3; ++i) {
    raw.push_back(RandomQ6K(Ms[i], K));
    Dev<uint8_t> d(raw.back());
    tiled.push_back(Tile(d, Ms[i], K));
    ys.emplace_back(static_cast<size_t>(nc) * Ms[i]);
    segs[i] = F16Args(tiled[i].p, nullptr, Ms[i], K, nc, h, ys[i].p, GemvEpilogue::kStore);
  }
  ASSERT_OK(TiledF16Multi(segs, 3, s.get(), nullptr));
  const uint64_t rb = GgmlRowBytes(GgmlType::Q6_K, K);
  for (int i = 0; i < 3; ++i) {
    const auto got = ys[i].Down();
    int bad = 0;
    for (int col = 0; col < nc; ++col)
      for (int r = 0; r < Ms[i]; ++r) {
        double abs = 0;
        const double want =
            xs[col] * cpu::TiledF16DotQ6K(raw[i].data() + r * rb,
                                          xh.data() + static_cast<size_t>(col) * K, K, &abs);
        const double tol = 3e-5 * xs[col] * abs + 1e-30;
        if (!(std::fabs(got[static_cast<size_t>(col) * Ms[i] + r] - want) <= tol) && bad++ < 3)
          ADD_FAILURE() << "segment " << i << " row " << r << " col " << col;
      }
    EXPECT_EQ(bad, 0) << "segment " << i;
  }
}

TEST(TiledF16, RejectsBadArguments) {
  Scratch s;
  GemvArgs a;
  a.type = GgmlType::Q8_0;
  EXPECT_FALSE(TiledF16Multi(&a, 1, s.get(), nullptr).ok());
  a.type = GgmlType::Q6_K;
  a.M = 16;
  a.K = 256;
  a.nc = 65;
  Dev<uint16_t> xh(256 * 65 + 8);
  Dev<float> xs(65), y(16 * 65);
  Dev<uint8_t> w(kTileUnitBytes);
  a.w = w.p;
  a.xh = xh.p;
  a.xs = xs.p;
  a.y = y.p;
  EXPECT_FALSE(TiledF16Multi(&a, 1, s.get(), nullptr).ok());  // too many columns
  a.nc = 4;
  a.xh = xh.p + 4;
  EXPECT_FALSE(TiledF16Multi(&a, 1, s.get(), nullptr).ok());  // unaligned activations
  a.xh = xh.p;
  a.xs = nullptr;
  EXPECT_FALSE(TiledF16Multi(&a, 1, s.get(), nullptr).ok());  // no scales
  a.xs = xs.p;
  EXPECT_TRUE(TiledF16Multi(&a, 1, s.get(), nullptr).ok());
  // A launch that splits K refuses to run without (enough) scratch.
  Dev<uint8_t> wide(TiledBytes(GgmlType::Q6_K, 256, 4096));
  a.w = wide.p;
  a.M = 256;
  a.K = 4096;
  Dev<uint16_t> xh2(4096 * 4);
  Dev<float> y2(256 * 4);
  a.xh = xh2.p;
  a.y = y2.p;
  EXPECT_FALSE(TiledF16Multi(&a, 1, TiledF16Scratch{}, nullptr).ok());
  EXPECT_FALSE(HalfActivations(nullptr, 1, 6, xh.p, xs.p, nullptr).ok());  // K % 4
}

// Benchmark (prints only): the 27B matrices at 8..64 columns, this kernel (and with the
// activation conversion) against the tiled column kernel and the best MMQ shape; several weight
// copies rotate so that L2 does not hold them.
TEST(TiledF16Timing, Table27B) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch scratch;
  const MmqShape mmq_shapes[] = {{2, 2, 0}, {4, 2, 0}, {2, 2, 32}};
  std::printf("%-12s %3s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "matrix", "nc", "tiled", "mmq best",
              "f16", "f16 scr.", "wgmma", "wg scr.", "convert", "2-read", "GB/s best");
  for (const Matrix27B& m : k27BMatrices) {
    const RotatingTiled w(Rng(), m);
    const auto x = RandomActs(64, m.K);
    Dev<float> dx(x);
    Dev<int8_t> dq(x.size());
    Dev<float> dd(x.size() / 32);
    ASSERT_OK(QuantizeActivations(dx.p, 64, m.K, dq.p, dd.p, nullptr));
    HalfActs h = Convert(x, 64, m.K);
    Dev<uint16_t> xh_wg = ToWarpgroupOrder(h.xh);
    Dev<float> y(static_cast<size_t>(64) * m.M);
    CK(cudaMemset(y.p, 0, y.n * 4));
    for (int nc : {8, 12, 16, 24, 32, 48, 64}) {
      auto args = [&](int rep) {
        GemvArgs a = w.Args(m, rep, nc, y.p);
        a.xq = dq.p;
        a.xd = dd.p;
        a.xh = h.xh.p;
        a.xs = h.xs.p;
        return a;
      };
      const double tt = MedianLaunchUs([&](int rep) {
        const GemvArgs a = args(rep);
        return TiledGemvMulti(&a, 1, nullptr);
      });
      double mmq = 1e30;
      for (const MmqShape& sh : mmq_shapes)
        mmq = std::min(mmq, MedianLaunchUs([&](int rep) {
                         const GemvArgs a = args(rep);
                         return MmqTiledMulti(&a, 1, sh, nullptr);
                       }));
      const double tf = MedianLaunchUs([&](int rep) {
        const GemvArgs a = args(rep);
        return TiledF16Multi(&a, 1, scratch.get(), nullptr);
      });
      const double tscr = MedianLaunchUs([&](int rep) {
        const GemvArgs a = args(rep);
        return TiledF16Multi(&a, 1, scratch.get(false), nullptr);
      });
      double twg = 0, twgs = 0;
      if (HaveWgmma()) {
        twg = MedianLaunchUs([&](int rep) {
          GemvArgs a = args(rep);
          a.xh = xh_wg.p;
          return TiledF16Multi(&a, 1, scratch.get(true, true), nullptr);
        });
        twgs = MedianLaunchUs([&](int rep) {
          GemvArgs a = args(rep);
          a.xh = xh_wg.p;
          return TiledF16Multi(&a, 1, scratch.get(false, true), nullptr);
        });
      }
      const double tc = MedianLaunchUs(
          [&](int) { return HalfActivations(dx.p, nc, m.K, h.xh.p, h.xs.p, nullptr); });
      const double tc2 = MedianLaunchUs([&](int) {
        return HalfActivations(dx.p, nc, m.K, h.xh.p, h.xs.p, nullptr, false, nullptr, false, false);
      });
      const double best = std::min(tf, twg > 0 ? twg : tf);
      std::printf("%-12s %3d %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.0f\n", m.name, nc, tt,
                  mmq, tf, tscr, twg, twgs, tc, tc2, w.tb * (w.pair ? 2.0 : 1.0) / (best * 1e-6) / 1e9);
    }
  }
}

// Benchmark (prints only): the gate+up pair's time per row as its row count crosses the
// grid's slots (2 blocks of 64 row-pairs per SM). The 27B's 17,408 rows are 272 row blocks,
// just over 2 x 132: the K split then decides how full the launch's last round is. Rows that
// fill the slots exactly (M = 64 x 2 x SMs) against the 27B's and past it.
TEST(TiledF16Timing, DISABLED_PairRowScan) {
  if (!HaveTiled() || !HaveWgmma()) GTEST_SKIP() << "needs the wgmma form (sm_90a)";
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  Scratch scratch;
  std::printf("%6s %5s %5s %5s %9s %12s\n", "M", "rb", "nc", "split", "us", "ns per row");
  for (const int M : {64 * sms, 64 * 2 * sms - 128, 64 * 2 * sms, 17408, 64 * 3 * sms}) {
    const Matrix27B m{"pair", M, 5120, GemvEpilogue::kSiluMul};
    const RotatingTiled w(Rng(), m);
    const auto x = RandomActs(64, m.K);
    HalfActs h = Convert(x, 64, m.K);
    Dev<uint16_t> xh_wg = ToWarpgroupOrder(h.xh);
    Dev<float> y(static_cast<size_t>(64) * m.M);
    for (int nc : {16, 64})
      for (int tail : {0, 1}) {
        const double us = MedianLaunchUs([&](int rep) {
          GemvArgs a = w.Args(m, rep, nc, y.p);
          a.xh = xh_wg.p;
          a.xs = h.xs.p;
          return TiledF16Multi(&a, 1, scratch.get(true, true, tail == 1), nullptr);
        });
        std::printf("%6d %5d %5d %5s %9.1f %12.2f\n", M, M / 64, nc, tail ? "tail" : "-", us,
                    1e3 * us / M);
      }
  }
}

// Where the 27B pair's time goes past 264 row blocks (benchmark): the one launch through
// clusters and through the scratch, and the same rows as two launches, the first 264 row blocks
// (whole rounds) and then the last 8, each alone and back to back.
TEST(TiledF16Timing, DISABLED_PairTwoLaunches) {
  if (!HaveTiled() || !HaveWgmma()) GTEST_SKIP() << "needs the wgmma form (sm_90a)";
  Scratch scratch;
  const int M = 17408, K = 5120, head = 16896;
  const Matrix27B m{"pair", M, K, GemvEpilogue::kSiluMul};
  const RotatingTiled w(Rng(), m);
  const auto x = RandomActs(64, K);
  HalfActs h = Convert(x, 64, K);
  Dev<uint16_t> xh_wg = ToWarpgroupOrder(h.xh);
  Dev<float> y(static_cast<size_t>(64) * M);
  const uint64_t off = TiledBytes(GgmlType::Q6_K, head, K);
  auto part = [&](int rep, int nc, int r0, int rows) {
    GemvArgs a = w.Args(m, rep, nc, y.p + r0);
    a.w = static_cast<const uint8_t*>(a.w) + (r0 ? off : 0);
    a.w2 = static_cast<const uint8_t*>(a.w2) + (r0 ? off : 0);
    a.M = rows;
    a.ldy = M;
    a.xh = xh_wg.p;
    a.xs = h.xs.p;
    return a;
  };
  // A timed unit: up to two launches, each of rows [r0, r0 + rows) with its scratch options.
  struct Launch {
    int r0, rows;
    bool cluster, tail_split, early;
  };
  struct Plan {
    const char* name;
    std::vector<Launch> launches;
  };
  const int tail = M - head;
  const Plan plans[] = {
      {"one, clusters", {{0, M, true, false, false}}},
      {"one, scratch", {{0, M, false, false, false}}},
      {"one call, tail launch", {{0, M, true, true, true}}},  // early, as the worker's steps
      {"head 264 rb alone", {{0, head, true, false, false}}},
      {"tail 8 rb alone", {{head, tail, true, false, false}}},
      {"head then tail", {{0, head, true, false, false}, {head, tail, true, false, false}}},
      {"head then tail (early)", {{0, head, true, false, false}, {head, tail, true, false, true}}},
      {"head then tail (early, scratch)",
       {{0, head, true, false, false}, {head, tail, false, false, true}}},
      {"tail then head", {{head, tail, true, false, false}, {0, head, true, false, false}}},
  };
  std::printf("%5s %32s %9s\n", "nc", "launches", "us");
  for (int nc : {16, 64})
    for (const Plan& plan : plans) {
      const double us = MedianLaunchUs([&](int rep) {
        for (const Launch& l : plan.launches) {
          GemvArgs a = part(rep, nc, l.r0, l.rows);
          a.early_launch = l.early;
          const absl::Status st =
              TiledF16Multi(&a, 1, scratch.get(l.cluster, true, l.tail_split), nullptr);
          if (!st.ok()) return st;
        }
        return absl::OkStatus();
      });
      std::printf("%5d %32s %9.1f\n", nc, plan.name, us);
    }
}

// Benchmark (prints only): each 27B launch shape at every K split the launch can take, 16, 32
// and 64 columns (the wgmma form, clusters where LaunchNt takes them), against TiledF16SplitFor's
// choice (*): the figures to calibrate SplitFor's cost model by. On an H100 (2026-12-06) the
// pair's 264 head row blocks ran 57.6 us unsplit where the one launch's split 3 cost ~10 more.
TEST(TiledF16Timing, DISABLED_SplitScan) {
  if (!HaveTiled() || !HaveWgmma()) GTEST_SKIP() << "needs the wgmma form (sm_90a)";
  Scratch scratch;
  // The table's matrices, then two of the worker's launches as one matrix of their rows (the
  // same row blocks and K): the GDN layer's qkv and z, the attention layer's q+gate, k and v.
  std::vector<Matrix27B> shapes(std::begin(k27BMatrices), std::end(k27BMatrices));
  shapes.push_back({"gdn_qkv+z", 16384, 5120, GemvEpilogue::kStore});
  shapes.push_back({"attn_q+g+k+v", 14336, 5120, GemvEpilogue::kStore});
  std::printf("%-12s %3s %5s %9s\n", "matrix", "nc", "split", "us");
  for (const Matrix27B& m : shapes) {
    const RotatingTiled w(Rng(), m);
    const auto x = RandomActs(64, m.K);
    HalfActs h = Convert(x, 64, m.K);
    Dev<uint16_t> xh_wg = ToWarpgroupOrder(h.xh);
    Dev<float> y(static_cast<size_t>(64) * m.M);
    const int rb = (m.M + 127) / 128 * (m.ep == GemvEpilogue::kSiluMul ? 2 : 1);
    const int chosen = TiledF16SplitFor(rb, m.K);
    for (int nc : {16, 32, 64})
      for (int split = 1; split <= kMaxSplit; ++split) {
        if (split > 1 && (2 * split > m.K / 256 || rb * split > kSplitBlocks)) break;
        scratch.split_override = split;
        const double us = MedianLaunchUs([&](int rep) {
          GemvArgs a = w.Args(m, rep, nc, y.p);
          a.xh = xh_wg.p;
          a.xs = h.xs.p;
          return TiledF16Multi(&a, 1, scratch.get(true, true, false), nullptr);
        });
        std::printf("%-12s %3d %4d%s %9.1f\n", m.name, nc, split, split == chosen ? "*" : " ",
                    us);
      }
  }
}

}  // namespace
}  // namespace ds::cuda
