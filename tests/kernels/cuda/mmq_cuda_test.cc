// Int8 MMQ over tiled Q6_K (kernels/cuda/mmq.cuh) against the tiled column kernel (bit for bit:
// the dispatch may switch between them by column count without changing any row) and against
// the CPU reference of the int8 product (kernels/cpu/mmq_ref.h), for every block shape, every
// column count 1..64, odd shapes and the 27B shapes. MmqTiming.Table27B is the benchmark that
// fills the shape table of worker/cuda/matmul_dispatch.cc (prints only). Needs a GPU (sm_80+).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/mmq_ref.h"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/mmq.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/tiled_test_util.h"

namespace ds::cuda {
namespace {

std::mt19937& Rng() {
  static std::mt19937 rng(2222);
  return rng;
}

// Random raw Q6_K rows: every quant bit pattern, sane f16 scales.
std::vector<uint8_t> RandomQ6K(int64_t rows, int K) {
  return RandomQ6KRows(Rng(), rows, K, 2e-4f, 4e-3f);
}

// Activations with outliers (block scales that differ a lot, as in a real model) and one
// all-zero 32-block per column.
std::vector<float> RandomActs(int nc, int K) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> pick(0, K - 1);
  std::vector<float> x(static_cast<size_t>(nc) * K);
  for (auto& v : x) v = u(Rng());
  for (int c = 0; c < nc; ++c) {
    for (int i = 0; i < K / 64; ++i) x[static_cast<size_t>(c) * K + pick(Rng())] *= 40.f;
    std::fill_n(x.begin() + static_cast<size_t>(c) * K + 32 * (c % (K / 32)), 32, 0.f);
  }
  return x;
}

Dev<uint8_t> Tile(const Dev<uint8_t>& raw, int M, int K) { return TileQ6K(raw, M, K); }

const MmqShape kShapes[] = {{2, 2, 0}, {4, 2, 0}, {2, 1, 0}, {2, 2, 32}, {4, 2, 16}};

TEST(Mmq, QuantizerMatchesCpu) {
  const int nc = 7, K = 2048;
  const auto x = RandomActs(nc, K);
  Dev<float> dx(x);
  Dev<int8_t> dq(x.size());
  Dev<float> dd(x.size() / 32);
  ASSERT_OK(QuantizeActivations(dx.p, nc, K, dq.p, dd.p, nullptr));
  std::vector<int8_t> q(x.size());
  std::vector<float> d(x.size() / 32);
  cpu::QuantizeActivationsQ8(x.data(), static_cast<int64_t>(x.size()), q.data(), d.data());
  EXPECT_EQ(dq.Down(), q);
  EXPECT_EQ(dd.Down(), d);
}

struct Case {
  int M, K, nc;
  GemvEpilogue ep;
  int cpu_row_step = 1;  // rows checked against the CPU (every n-th): the 27B shapes are large
};

// One case: the tiled kernel once, MMQ in every shape; MMQ == tiled bit for bit; the plain
// outputs also == the CPU kernel-order reference bit for bit, and every output within f32
// rounding of the exact int8 product.
void RunCase(const Case& c) {
  SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " nc=" << c.nc
                                    << " ep=" << static_cast<int>(c.ep));
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
  Dev<float> dx(x);
  Dev<int8_t> dq(x.size());
  Dev<float> dd(x.size() / 32);
  ASSERT_OK(QuantizeActivations(dx.p, c.nc, c.K, dq.p, dd.p, nullptr));
  GemvArgs a;
  a.type = GgmlType::Q6_K;
  a.w = tw.p;
  a.w2 = pair ? tw2.p : nullptr;
  a.M = c.M;
  a.K = c.K;
  a.nc = c.nc;
  a.xq = dq.p;
  a.xd = dd.p;
  a.epilogue = c.ep;
  Dev<float> yt(y0);
  a.y = yt.p;
  ASSERT_OK(TiledGemvMulti(&a, 1, nullptr));
  const auto ref_tiled = yt.Down();

  // CPU: kernel-order f32 (bit-exact target for plain outputs) and the exact product.
  const auto xq = dq.Down();
  const auto xd = dd.Down();
  const uint64_t rb = GgmlRowBytes(GgmlType::Q6_K, c.K);
  int bad_cpu = 0, bitwise_cpu = 0, checked = 0;
  double worst = 0;
  for (int col = 0; col < c.nc; ++col)
    for (int r = 0; r < c.M; r += c.cpu_row_step) {
      const int8_t* q = xq.data() + static_cast<size_t>(col) * c.K;
      const float* d = xd.data() + static_cast<size_t>(col) * (c.K / 32);
      double abs1 = 0, abs2 = 0;
      const double e1 = cpu::MmqDotQ6K(w.data() + r * rb, q, d, c.K, &abs1);
      const size_t o = static_cast<size_t>(col) * c.M + r;
      double expect = e1, tol = 2e-6 * abs1 + 1e-7;
      if (pair) {
        const double e2 = cpu::MmqDotQ6K(w2.data() + r * rb, q, d, c.K, &abs2);
        const double sa = e1 / (1 + std::exp(-e1));
        expect = sa * e2;
        tol = 1.1 * std::fabs(e2) * tol + std::fabs(sa) * (2e-6 * abs2) + 1e-6 * std::fabs(expect) +
              1e-7;
      } else {
        const float ko = cpu::MmqDotQ6KKernelOrder(w.data() + r * rb, q, d, c.K);
        const float got = c.ep == GemvEpilogue::kAccumulate ? y0[o] + ko : ko;
        bitwise_cpu += got == ref_tiled[o] ? 0 : 1;
        if (c.ep == GemvEpilogue::kAccumulate) {
          expect += y0[o];
          tol += 1e-7 * std::fabs(y0[o]);
        }
      }
      const double err = std::fabs(ref_tiled[o] - expect);
      worst = std::max(worst, err / tol);
      ++checked;
      if (!(err <= tol) && bad_cpu++ < 5)
        ADD_FAILURE() << "tiled kernel vs CPU: row " << r << " col " << col << " got "
                      << ref_tiled[o] << " want " << expect << " tol " << tol;
    }
  EXPECT_EQ(bad_cpu, 0);
  EXPECT_EQ(bitwise_cpu, 0) << "outputs that differ from the CPU kernel-order f32 reference";

  for (const MmqShape& sh : kShapes) {
    SCOPED_TRACE(::testing::Message() << "shape slots=" << sh.slots << " stages=" << sh.stages
                                      << " max_cols=" << sh.max_cols);
    Dev<float> ym(y0);
    a.y = ym.p;
    ASSERT_OK(MmqTiledMulti(&a, 1, sh, nullptr));
    const auto got = ym.Down();
    int diff = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &ref_tiled[i], 4) != 0 && diff++ < 3)
        ADD_FAILURE() << "MMQ != tiled at col " << i / c.M << " row " << i % c.M << ": " << got[i]
                      << " vs " << ref_tiled[i];
    EXPECT_EQ(diff, 0);
  }
  std::printf(
      "  mmq M=%6d K=%6d nc=%2d ep=%d: %d outputs vs CPU, max err/tol %.3f, %d not bitwise\n", c.M,
      c.K, c.nc, static_cast<int>(c.ep), checked, worst, bitwise_cpu);
}

TEST(Mmq, EveryColumnCountOddShape) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  // M = 37: a partial last tile and a partial block; K = 768: 3 units, a partial round.
  for (int nc = 1; nc <= 64; ++nc) RunCase({37, 768, nc, GemvEpilogue::kStore});
}

TEST(Mmq, EpiloguesAndLongK) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  for (int nc : {1, 9, 17, 33, 64}) RunCase({21, 512, nc, GemvEpilogue::kSiluMul});
  for (int nc : {5, 16, 40, 64}) RunCase({50, 1280, nc, GemvEpilogue::kAccumulate});
  RunCase({70, 4352, 24, GemvEpilogue::kStore});  // 17 units: 4 full rounds + 1 unit
}

TEST(Mmq, ModelShapes27B) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  RunCase({17408, 5120, 64, GemvEpilogue::kSiluMul, 211});
  RunCase({5120, 17408, 48, GemvEpilogue::kAccumulate, 97});
  RunCase({10240, 5120, 16, GemvEpilogue::kStore, 101});
}

// Several matrices in one launch give the single-matrix results.
TEST(Mmq, MultiSegmentsMatchSingle) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  const int K = 1024, nc = 20;
  const int Ms[3] = {40, 7, 90};
  const auto x = RandomActs(nc, K);
  Dev<float> dx(x);
  Dev<int8_t> dq(x.size());
  Dev<float> dd(x.size() / 32);
  ASSERT_OK(QuantizeActivations(dx.p, nc, K, dq.p, dd.p, nullptr));
  std::vector<Dev<uint8_t>> raw, tiled;
  std::vector<Dev<float>> ys, ym;
  GemvArgs segs[3];
  for (int i = 0; i < 3; ++i) {
    raw.emplace_back(RandomQ6K(Ms[i], K));
    tiled.push_back(Tile(raw.back(), Ms[i], K));
    ys.emplace_back(static_cast<size_t>(nc) * Ms[i]);
    ym.emplace_back(static_cast<size_t>(nc) * Ms[i]);
  }
  for (const MmqShape& sh : kShapes) {
    for (int i = 0; i < 3; ++i) {
      GemvArgs& a = segs[i];
      a.type = GgmlType::Q6_K;
      a.w = tiled[i].p;
      a.M = Ms[i];
      a.K = K;
      a.nc = nc;
      a.xq = dq.p;
      a.xd = dd.p;
      a.y = ys[i].p;
      ASSERT_OK(TiledGemvMulti(&a, 1, nullptr));
      a.y = ym[i].p;
    }
    ASSERT_OK(MmqTiledMulti(segs, 3, sh, nullptr));
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(ys[i].Down(), ym[i].Down()) << "segment " << i << " slots " << sh.slots;
  }
}

TEST(Mmq, RejectsBadArguments) {
  GemvArgs a;
  a.type = GgmlType::Q8_0;
  EXPECT_FALSE(MmqTiledMulti(&a, 1, {}, nullptr).ok());
  a.type = GgmlType::Q6_K;
  a.M = 16;
  a.K = 256;
  a.nc = 65;
  Dev<int8_t> q(256 * 65);
  Dev<float> d(8 * 65), y(16 * 65);
  Dev<uint8_t> w(kTileUnitBytes);
  a.w = w.p;
  a.xq = q.p;
  a.xd = d.p;
  a.y = y.p;
  EXPECT_FALSE(MmqTiledMulti(&a, 1, {}, nullptr).ok());  // too many columns
  a.nc = 4;
  EXPECT_FALSE(MmqTiledMulti(&a, 1, {3, 2, 0}, nullptr).ok());  // no such shape
  a.xq = q.p + 4;
  EXPECT_FALSE(MmqTiledMulti(&a, 1, {}, nullptr).ok());  // unaligned activations
  a.xq = q.p;
  EXPECT_TRUE(MmqTiledMulti(&a, 1, {}, nullptr).ok());
}

// Benchmark (prints only): the 27B matrices at 8..64 columns, the tiled column kernel against
// every MMQ shape; several weight copies rotate so that L2 does not hold them.
TEST(MmqTiming, Table27B) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  std::printf("%-12s %3s %10s", "matrix", "nc", "tiled us");
  for (const MmqShape& sh : kShapes)
    std::printf("  mmq%d/%d/%-2d", sh.slots, sh.stages, sh.max_cols);
  std::printf("   (us; GB/s of weights for the best)\n");
  for (const Matrix27B& m : k27BMatrices) {
    const RotatingTiled w(Rng(), m);
    const auto x = RandomActs(64, m.K);
    Dev<float> dx(x);
    Dev<int8_t> dq(x.size());
    Dev<float> dd(x.size() / 32);
    ASSERT_OK(QuantizeActivations(dx.p, 64, m.K, dq.p, dd.p, nullptr));
    Dev<float> y(static_cast<size_t>(64) * m.M);
    CK(cudaMemset(y.p, 0, y.n * 4));
    for (int nc : {8, 16, 24, 32, 48, 64}) {
      auto args = [&](int rep) {
        GemvArgs a = w.Args(m, rep, nc, y.p);
        a.xq = dq.p;
        a.xd = dd.p;
        return a;
      };
      const double tt = MedianLaunchUs([&](int rep) {
        const GemvArgs a = args(rep);
        return TiledGemvMulti(&a, 1, nullptr);
      });
      std::printf("%-12s %3d %10.1f", m.name, nc, tt);
      double best = tt;
      for (const MmqShape& sh : kShapes) {
        const double t = MedianLaunchUs([&](int rep) {
          const GemvArgs a = args(rep);
          return MmqTiledMulti(&a, 1, sh, nullptr);
        });
        best = std::min(best, t);
        std::printf("  %10.1f", t);
      }
      std::printf("   %.0f GB/s\n", w.tb * (w.pair ? 2.0 : 1.0) / (best * 1e-6) / 1e9);
    }
  }
}

}  // namespace
}  // namespace ds::cuda
