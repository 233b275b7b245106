// The tiled Q6_K layout and its column kernel (kernels/cuda/gemv_tiled.cuh) against themselves
// and the v2 GEMV: multi-segment launches, the tiled dequantization, agreement with the dp4a GEMV
// on the same int8 activations, bit-identity with and without the activations' 16-element sums,
// and argument checks. (Tiled vs the CPU reference: kernels_cuda_test's Tiled.Gemv*.) Needs a GPU
// of sm_80+.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/weights_test_util.h"

namespace ds::cuda {
namespace {

std::mt19937& Rng() {
  static std::mt19937 rng(4321);
  return rng;
}
std::vector<float> RandVec(size_t n, float lo, float hi) { return ds::cuda::RandVec(Rng(), n, lo, hi); }
std::vector<uint8_t> RandomWeights(GgmlType t, int64_t rows, int64_t K) {
  return ds::cuda::RandomWeights(Rng(), t, rows, K);
}

// Several tiled matrices in one launch give exactly the single-matrix results.
TEST(Tiled, MultiSegmentsMatchSingle) {
  if (!HaveTiled()) GTEST_SKIP() << "tiled Q6_K needs sm_80+";
  const GgmlType t = GgmlType::Q6_K;
  const int K = 768, nc = 5;
  const int Ms[3] = {40, 7, 33};
  auto x = RandVec(static_cast<size_t>(nc) * K, -2.f, 2.f);
  Dev<float> dx(x);
  Dev<int8_t> dxq(static_cast<size_t>(nc) * K);
  Dev<float> dxd(static_cast<size_t>(nc) * K / 32);
  ASSERT_OK(QuantizeActivations(dx.p, nc, K, dxq.p, dxd.p, nullptr));
  std::vector<Dev<uint8_t>> raw, tiled;
  std::vector<Dev<float>> ys, ym;
  GemvArgs segs[3];
  for (int i = 0; i < 3; ++i) {
    raw.emplace_back(RandomWeights(t, Ms[i], K));
    tiled.push_back(TileOnDevice(t, raw.back(), Ms[i], K));
    ys.emplace_back(static_cast<size_t>(nc) * Ms[i]);
    ym.emplace_back(static_cast<size_t>(nc) * Ms[i]);
  }
  for (int i = 0; i < 3; ++i) {
    GemvArgs& a = segs[i];
    a.type = t;
    a.w = tiled[i].p;
    a.M = Ms[i];
    a.K = K;
    a.nc = nc;
    a.xq = dxq.p;
    a.xd = dxd.p;
    a.y = ys[i].p;
    ASSERT_OK(TiledGemvMulti(&a, 1, nullptr));
    a.y = ym[i].p;
  }
  ASSERT_OK(TiledGemvMulti(segs, 3, nullptr));
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ys[i].Down(), ym[i].Down()) << "segment " << i;
}

// Dequantizing the tiled copy gives what dequantizing the raw rows gives, for any row range.
TEST(Tiled, DequantMatchesRaw) {
  if (!HaveTiled()) GTEST_SKIP() << "tiled Q6_K needs sm_80+";
  const GgmlType t = GgmlType::Q6_K;
  const int M = 45, K = 512;
  Dev<uint8_t> raw(RandomWeights(t, M, K));
  Dev<uint8_t> tiled = TileOnDevice(t, raw, M, K);
  Dev<uint16_t> ref(static_cast<size_t>(M) * K), got(static_cast<size_t>(M) * K);
  for (bool bf16 : {true, false}) {
    ASSERT_OK(DequantizeRows(t, raw.p, M, K, ref.p, bf16, nullptr));
    ASSERT_OK(DequantizeTiledRows(t, tiled.p, 0, M, K, got.p, bf16, nullptr));
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(got.Down(), ref.Down()) << (bf16 ? "bf16" : "f16");
    // An unaligned row range (rows 5..29) lands at the start of out.
    ASSERT_OK(DequantizeTiledRows(t, tiled.p, 5, 25, K, got.p, bf16, nullptr));
    CK(cudaDeviceSynchronize());
    const auto g = got.Down(), r = ref.Down();
    EXPECT_TRUE(std::equal(g.begin(), g.begin() + 25 * K, r.begin() + 5 * K)) << "row range";
  }
}

// The tiled kernel and the v2 dp4a GEMV multiply the same int8 activations by the same Q6_K
// quants: only float summation orders differ, so they must agree far below the int8-activation
// tolerance of RunGemvCase (which cannot see errors under ~2% of a dot product). Activations with
// outliers make the 32-block scales differ a lot between blocks (as in a real model), so a wrong
// block scale anywhere would show.
void TiledVsV2(int M, int K, int nc, GemvEpilogue ep) {
  SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " nc=" << nc << " ep=" << static_cast<int>(ep));
  const GgmlType t = GgmlType::Q6_K;
  const bool pair = ep == GemvEpilogue::kSiluMul;
  auto w = RandomWeights(t, M, K);
  auto w2 = pair ? RandomWeights(t, M, K) : std::vector<uint8_t>(1);
  auto x = RandVec(static_cast<size_t>(nc) * K, -1.f, 1.f);
  std::uniform_int_distribution<int> pick(0, K - 1);
  for (int c = 0; c < nc; ++c)
    for (int i = 0; i < K / 64; ++i) x[static_cast<size_t>(c) * K + pick(Rng())] *= 40.f;  // outliers
  auto y0 = RandVec(static_cast<size_t>(nc) * M, -1.f, 1.f);
  Dev<uint8_t> dw(w), dw2(w2);
  Dev<float> dx(x);
  Dev<int8_t> dxq(static_cast<size_t>(nc) * K);
  Dev<float> dxd(static_cast<size_t>(nc) * K / 32);
  ASSERT_OK(QuantizeActivations(dx.p, nc, K, dxq.p, dxd.p, nullptr));
  Dev<uint8_t> tw = TileOnDevice(t, dw, M, K);
  Dev<uint8_t> tw2 = pair ? TileOnDevice(t, dw2, M, K) : Dev<uint8_t>(1);
  Dev<float> yv(y0), yt(y0);
  GemvArgs a;
  a.type = t; a.M = M; a.K = K; a.nc = nc; a.xq = dxq.p; a.xd = dxd.p; a.epilogue = ep;
  a.w = dw.p; a.w2 = pair ? dw2.p : nullptr; a.y = yv.p;
  for (int c0 = 0; c0 < nc; c0 += kGemvMaxCols) {  // v2 takes 16 columns per launch
    GemvArgs b = a;
    b.nc = std::min(kGemvMaxCols, nc - c0);
    b.xq = dxq.p + static_cast<int64_t>(c0) * K;
    b.xd = dxd.p + static_cast<int64_t>(c0) * (K / 32);
    b.y = yv.p + static_cast<int64_t>(c0) * M;
    ASSERT_OK(Gemv(b, nullptr));
  }
  a.w = tw.p; a.w2 = pair ? tw2.p : nullptr; a.y = yt.p;
  ASSERT_OK(TiledGemvMulti(&a, 1, nullptr));
  const auto v = yv.Down(), g = yt.Down();
  // Scale of each output: Σ|w·x| over its row with the dequantized int8 activations.
  const auto W = DequantAll(t, w, M, K);
  const auto xq = dxq.Down();
  const auto xd = dxd.Down();
  double worst = 0;
  int bad = 0;
  for (int c = 0; c < nc; ++c)
    for (int r = 0; r < M; ++r) {
      double abs_sum = 0;
      for (int i = 0; i < K; ++i)
        abs_sum += std::fabs(W[static_cast<size_t>(r) * K + i] * xq[static_cast<size_t>(c) * K + i] *
                             xd[static_cast<size_t>(c) * (K / 32) + i / 32]);
      const size_t o = static_cast<size_t>(c) * M + r;
      // Pair outputs are silu(g)·u: scale by the larger factor's size too.
      const double scale = pair ? abs_sum * (std::fabs(v[o]) + 1.0) : abs_sum + std::fabs(y0[o]);
      const double rel = std::fabs(g[o] - v[o]) / (scale + 1e-12);
      worst = std::max(worst, rel);
      if (!(rel < 1e-5) && bad++ < 5)
        ADD_FAILURE() << "row " << r << " col " << c << ": tiled " << g[o] << " v2 " << v[o];
    }
  EXPECT_EQ(bad, 0);
  std::printf("  tiled vs v2 M=%6d K=%6d nc=%2d ep=%d: max |diff| / sum|w x| %.2e\n", M, K, nc,
              static_cast<int>(ep), worst);
}

TEST(Tiled, MatchesV2GemvOnTheSameActivations) {
  if (!HaveTiled()) GTEST_SKIP() << "tiled Q6_K needs sm_80+";
  TiledVsV2(5120, 6144, 1, GemvEpilogue::kAccumulate);   // ssm_out / attn_output
  TiledVsV2(2048, 17408, 1, GemvEpilogue::kAccumulate);  // ffn_down rows
  TiledVsV2(4096, 5120, 1, GemvEpilogue::kSiluMul);      // ffn gate/up rows
  TiledVsV2(1000, 5120, 1, GemvEpilogue::kStore);        // a partial last tile
  TiledVsV2(512, 5120, 16, GemvEpilogue::kStore);
  TiledVsV2(300, 5120, 32, GemvEpilogue::kSiluMul);
}

// With the activations' 16-element sums (GemvArgs::xsum) the column kernel feeds the unsigned
// quants to the mma and subtracts 32 * sum through C: the same exact integers, so every output
// must be bit-identical to the kernel without them, for 1 column (kOneCol) and 2-8.
TEST(Tiled, ActivationSumsGiveTheSameBits) {
  if (!HaveTiled()) GTEST_SKIP() << "tiled Q6_K needs sm_80+";
  const GgmlType t = GgmlType::Q6_K;
  for (const int K : {5120, 6144}) {
    const int M = 1000;  // a partial last tile
    auto w = RandomWeights(t, M, K), w2 = RandomWeights(t, M, K);
    Dev<uint8_t> dw(w), dw2(w2);
    Dev<uint8_t> tw = TileOnDevice(t, dw, M, K), tw2 = TileOnDevice(t, dw2, M, K);
    for (const int nc : {1, 2, 3, 4, 5, 8}) {
      auto x = RandVec(static_cast<size_t>(nc) * K, -1.f, 1.f);
      for (size_t i = 0; i < x.size(); i += 97) x[i] *= 40.f;  // outliers: some blocks near +-127
      for (int i = 0; i < 64; ++i) x[i] = 3.f;                 // one all-maximal block: sums 16 * 127
      Dev<float> dx(x);
      Dev<int8_t> dxq(static_cast<size_t>(nc) * K);
      Dev<float> dxd(static_cast<size_t>(nc) * K / 32);
      Dev<int32_t> dsum(static_cast<size_t>(nc) * K / 16);
      ASSERT_OK(QuantizeActivations(dx.p, nc, K, dxq.p, dxd.p, nullptr, dsum.p));
      const auto xq = dxq.Down();
      const auto sums = dsum.Down();
      for (size_t b = 0; b < sums.size(); ++b) {
        int want = 0;
        for (int i = 0; i < 16; ++i) want += xq[16 * b + i];
        ASSERT_EQ(sums[b], want) << "sum of block " << b;
      }
      EXPECT_EQ(sums[0], 16 * 127);
      for (GemvEpilogue ep : {GemvEpilogue::kStore, GemvEpilogue::kAccumulate, GemvEpilogue::kSiluMul}) {
        SCOPED_TRACE(::testing::Message() << "K=" << K << " nc=" << nc << " ep=" << static_cast<int>(ep));
        const auto y0 = RandVec(static_cast<size_t>(nc) * M, -1.f, 1.f);
        Dev<float> ya(y0), yb(y0);
        GemvArgs a;
        a.type = t; a.M = M; a.K = K; a.nc = nc; a.xq = dxq.p; a.xd = dxd.p; a.epilogue = ep;
        a.w = tw.p; a.w2 = ep == GemvEpilogue::kSiluMul ? tw2.p : nullptr; a.y = ya.p;
        ASSERT_OK(TiledGemvMulti(&a, 1, nullptr));
        a.xsum = dsum.p;
        a.y = yb.p;
        ASSERT_OK(TiledGemvMulti(&a, 1, nullptr));
        const auto ga = ya.Down(), gb = yb.Down();
        int differ = 0;
        for (size_t i = 0; i < ga.size(); ++i)
          if (std::memcmp(&ga[i], &gb[i], sizeof(float)) != 0 && differ++ < 5)
            ADD_FAILURE() << "output " << i << ": " << gb[i] << " with sums vs " << ga[i];
        EXPECT_EQ(differ, 0);
      }
    }
  }
}

// Activations staged in shared memory (GemvArgs::stage_activations, the default; one column)
// give exactly the unstaged kernel's outputs, with and without sums, every epilogue, several
// segments in one launch, M with a partial tile, fewer units than warps (K = 256) and the 27B's
// longest K; at 2..8 columns the flag changes nothing (those forms never stage).
TEST(Tiled, StagedActivationsGiveTheSameBits) {
  if (!HaveTiled()) GTEST_SKIP() << "tiled Q6_K needs sm_80+";
  const GgmlType t = GgmlType::Q6_K;
  for (const int K : {256, 5120, 17408}) {
    const int M = K == 17408 ? 120 : 200;  // partial last tiles
    Dev<uint8_t> dw(RandomWeights(t, M, K)), dw2(RandomWeights(t, M, K)), dw3(RandomWeights(t, 40, K));
    Dev<uint8_t> tw = TileOnDevice(t, dw, M, K), tw2 = TileOnDevice(t, dw2, M, K), tw3 = TileOnDevice(t, dw3, 40, K);
    for (const int nc : {1, 2, 3, 5, 8}) {
      auto x = RandVec(static_cast<size_t>(nc) * K, -1.f, 1.f);
      for (size_t i = 0; i < x.size(); i += 89) x[i] *= 30.f;
      Dev<float> dx(x);
      Dev<int8_t> dxq(static_cast<size_t>(nc) * K);
      Dev<float> dxd(static_cast<size_t>(nc) * K / 32);
      Dev<int32_t> dsum(static_cast<size_t>(nc) * K / 16);
      ASSERT_OK(QuantizeActivations(dx.p, nc, K, dxq.p, dxd.p, nullptr, dsum.p));
      for (int form = 0; form < 5; ++form) {  // store, accumulate, pair, sums, two segments
        SCOPED_TRACE(::testing::Message() << "K=" << K << " nc=" << nc << " form=" << form);
        const auto y0 = RandVec(static_cast<size_t>(nc) * (M + 40), -1.f, 1.f);
        Dev<float> ya(y0), yb(y0);
        auto run = [&](bool stage, float* y) {
          GemvArgs a[2];
          a[0].type = t; a[0].M = M; a[0].K = K; a[0].nc = nc; a[0].xq = dxq.p; a[0].xd = dxd.p;
          a[0].w = tw.p; a[0].y = y; a[0].stage_activations = stage;
          if (form == 1) a[0].epilogue = GemvEpilogue::kAccumulate;
          if (form == 2) { a[0].epilogue = GemvEpilogue::kSiluMul; a[0].w2 = tw2.p; }
          if (form == 3 && nc == 1) a[0].xsum = dsum.p;
          int n = 1;
          if (form == 4) {
            a[1] = a[0];
            a[1].M = 40;
            a[1].w = tw3.p;
            a[1].y = y + static_cast<int64_t>(nc) * M;
            n = 2;
          }
          return TiledGemvMulti(a, n, nullptr);
        };
        ASSERT_OK(run(false, ya.p));
        ASSERT_OK(run(true, yb.p));
        const auto ga = ya.Down(), gb = yb.Down();
        int differ = 0;
        for (size_t i = 0; i < ga.size(); ++i)
          if (std::memcmp(&ga[i], &gb[i], sizeof(float)) != 0 && differ++ < 5)
            ADD_FAILURE() << "output " << i << ": " << gb[i] << " staged vs " << ga[i];
        EXPECT_EQ(differ, 0);
      }
    }
  }
}

TEST(Tiled, RejectsBadArguments) {
  GemvArgs a;
  a.type = GgmlType::Q8_0;
  EXPECT_FALSE(TiledGemvMulti(&a, 1, nullptr).ok());
  // F16 has no tiled layout; Q8_0 has one (tiled_formats.cuh) of the raw bytes' size, but the
  // int8 column kernel above takes Q6_K only.
  EXPECT_EQ(TiledBytes(GgmlType::F16, 16, 256), 0u);
  EXPECT_EQ(TiledBytes(GgmlType::Q8_0, 16, 256), static_cast<uint64_t>(TiledUnitBytes(GgmlType::Q8_0)));
  EXPECT_EQ(TiledBytes(GgmlType::Q8_0, 16, 256), 16u * GgmlRowBytes(GgmlType::Q8_0, 256));
  EXPECT_EQ(TiledBytes(GgmlType::Q6_K, 17, 512), 2u * 2 * kTileUnitBytes);
  EXPECT_FALSE(TileRows(GgmlType::Q6_K, nullptr, 8, 16, 256, nullptr, nullptr).ok());
  // Up to 8 columns the block scales are read 16 bytes at a time: a misaligned xd is refused
  // before any launch (the pointers are only checked, never dereferenced here).
  alignas(16) static int8_t xq[256];
  alignas(16) static float xd[12];
  GemvArgs m;
  m.type = GgmlType::Q6_K;
  m.M = 16;
  m.K = 256;
  m.nc = 1;
  m.w = xq;
  m.xq = xq;
  m.xd = xd + 1;
  m.y = xd;
  const absl::Status st = TiledGemvMulti(&m, 1, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("16-byte"), std::string_view::npos) << st;
}

}  // namespace
}  // namespace ds::cuda
