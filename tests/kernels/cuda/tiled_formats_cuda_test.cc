// Tiled Q4_K / Q5_K / Q8_0 / IQ4_XS / IQ4_NL on the GPU (issue #22): the device repack equals the CPU
// packing of the layout definitions (kernels/cpu/tiled_*_layout.h) byte for byte;
// the dequantization of tiled rows equals that of the raw rows bit for bit; the activations'
// sub-block sums equal cpu::HalfSubBlockSums bit for bit, from HalfActivations and from the fused
// norm; and the f16 tensor-core kernel (TiledF16Multi) against its CPU reference
// (cpu::TiledF16DotKq / Q80 / Iq4Xs / Iq4Nl: the same f16 operands, summed exactly) and the f32
// product of the dequantized rows, at every column count, with every epilogue, a K split, several
// segments; a column's result the same bits at every column count, through clusters or the
// scratch. TiledFormatsTiming.DISABLED_Table27B is the benchmark the dispatch needs (f16 kernel vs
// the v2 GEMV on raw rows): it prints only, so it is disabled (--gtest_also_run_disabled_tests
// --gtest_filter='TiledFormatsTiming.*' runs it). Needs sm_80+.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/tiled_f16_ref.h"
#include "kernels/cpu/tiled_iq4nl_layout.h"
#include "kernels/cpu/tiled_iq4xs_layout.h"
#include "kernels/cpu/tiled_kquant_layout.h"
#include "kernels/cpu/tiled_q8_layout.h"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/tiled_f16.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/tiled_f16_test_util.h"
#include "tests/kernels/cuda/tiled_test_util.h"

namespace ds::cuda {
namespace {

std::mt19937& Rng() {
  static std::mt19937 rng(9191);
  return rng;
}

constexpr GgmlType kFormats[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q8_0, GgmlType::IQ4_XS,
                                 GgmlType::IQ4_NL};
std::string Name(GgmlType t) { return std::string(GgmlInfo(t).name); }
bool HasMins(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q5_K; }

// Random raw rows: every quant, index, scale and min bit pattern; f16 scales (d, and dmin for the
// K-quants) in [2e-5, 4e-4): normal and subnormal.
std::vector<uint8_t> RandomRows(GgmlType t, int64_t rows, int K) {
  const int bb = t == GgmlType::Q8_0     ? tiled_q8::kBlockBytes
                 : t == GgmlType::IQ4_XS ? tiled_iq4xs::kBlockBytes
                 : t == GgmlType::IQ4_NL ? tiled_iq4nl::kBlockBytes
                                         : tiled_kq::RawBlockBytes(t == GgmlType::Q5_K);
  std::vector<uint8_t> w(rows * GgmlRowBytes(t, K));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(2e-5f, 4e-4f);
  for (auto& b : w) b = static_cast<uint8_t>(byte(Rng()));
  for (size_t off = 0; off < w.size(); off += bb) {
    const uint16_t d = F32ToF16(sc(Rng())), dmin = F32ToF16(sc(Rng()));
    std::memcpy(&w[off], &d, 2);
    if (HasMins(t)) std::memcpy(&w[off + 2], &dmin, 2);
  }
  return w;
}

// The tiled copy, made in two TileRows calls (rows [0, 32) and the rest) as the upload does.
Dev<uint8_t> Tile(GgmlType t, const Dev<uint8_t>& raw, int M, int K) {
  Dev<uint8_t> d(TiledBytes(t, M, K));
  const int first = std::min(M, 32);
  EXPECT_TRUE(TileRows(t, raw.p, 0, first, K, d.p, nullptr).ok());
  if (M > first) {
    const uint8_t* rest = raw.p + first * GgmlRowBytes(t, K);
    EXPECT_TRUE(TileRows(t, rest, first, M - first, K, d.p, nullptr).ok());
  }
  return d;
}

// Tile-unit u of tile `tile` packed on the CPU by the layout definition.
std::vector<uint8_t> HostUnit(GgmlType t, const std::vector<uint8_t>& raw, int M, int K, int tile,
                              int u) {
  const size_t rb = GgmlRowBytes(t, K);
  const size_t ub = rb / (K / 256);  // raw bytes of one row's unit
  const uint8_t* rows[16];
  for (int r = 0; r < 16; ++r) {
    const int row = 16 * tile + r;
    rows[r] = row < M ? raw.data() + rb * row + ub * u : nullptr;
  }
  std::vector<uint8_t> unit(TiledUnitBytes(t));
  for (int T = 0; T < 32; ++T) {
    if (t == GgmlType::Q8_0)
      tiled_q8::PackLane(rows, T, unit.data());
    else if (t == GgmlType::IQ4_XS)
      tiled_iq4xs::PackLane(rows, T, unit.data());
    else if (t == GgmlType::IQ4_NL)
      tiled_iq4nl::PackLane(rows, T, unit.data());
    else
      tiled_kq::PackLane(rows, t == GgmlType::Q5_K, T, unit.data());
  }
  return unit;
}

// Every third column off zero mean: large sub-block sums for the minimum term.
std::vector<float> RandomActs(int nc, int K) { return RandomHalfActs(Rng(), nc, K, 0.7f); }

using Scratch = F16Scratch;

struct HalfActs {
  Dev<uint16_t> xh, sums;
  Dev<float> xs;
};
HalfActs Convert(const std::vector<float>& x, int nc, int K) {
  Dev<float> dx(x);
  HalfActs h{Dev<uint16_t>(x.size()), Dev<uint16_t>(x.size() / 32), Dev<float>(static_cast<size_t>(nc))};
  EXPECT_TRUE(HalfActivations(dx.p, nc, K, h.xh.p, h.xs.p, nullptr, false, h.sums.p).ok());
  return h;
}

GemvArgs Args(GgmlType t, const void* w, const void* w2, int M, int K, int nc, const HalfActs& h,
              float* y, GemvEpilogue ep) {
  return F16LaunchArgs(t, w, w2, M, K, nc, h.xh.p, h.xs.p, HasMins(t) ? h.sums.p : nullptr, y, ep);
}

TEST(TiledFormats, RepackEqualsTheLayoutDefinition) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  for (GgmlType t : kFormats) {
    const int M = 37, K = 768, nu = K / 256;
    const auto raw = RandomRows(t, M, K);
    Dev<uint8_t> draw(raw);
    const auto got = Tile(t, draw, M, K).Down();
    ASSERT_EQ(got.size(), TiledBytes(t, M, K));
    ASSERT_EQ(got.size(), static_cast<size_t>((M + 15) / 16 * 16) * GgmlRowBytes(t, K));
    for (int tile = 0; tile * 16 < M; ++tile)
      for (int u = 0; u < nu; ++u) {
        const auto want = HostUnit(t, raw, M, K, tile, u);
        EXPECT_EQ(0, std::memcmp(got.data() + (static_cast<size_t>(tile) * nu + u) * want.size(),
                                 want.data(), want.size()))
            << Name(t) << " tile " << tile << " unit " << u;
      }
  }
}

TEST(TiledFormats, DequantizeTiledRowsEqualsRaw) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  for (GgmlType t : kFormats)
    for (bool bf16 : {false, true}) {
      const int M = 45, K = 1024;
      Dev<uint8_t> raw(RandomRows(t, M, K));
      Dev<uint8_t> tiled = Tile(t, raw, M, K);
      Dev<uint16_t> a(static_cast<size_t>(M) * K), b(static_cast<size_t>(27) * K);
      ASSERT_OK(DequantizeRows(t, raw.p, M, K, a.p, bf16, nullptr));
      ASSERT_OK(DequantizeTiledRows(t, tiled.p, 5, 27, K, b.p, bf16, nullptr));
      const auto want = a.Down(), got = b.Down();
      EXPECT_EQ(0, std::memcmp(got.data(), want.data() + 5 * K, got.size() * 2))
          << Name(t) << " bf16=" << bf16;
    }
}

// An empty TP slice (a rank with no GDN heads) dequantizes to nothing at load: no zero-block
// launch error, and a negative count is still refused.
TEST(TiledFormats, DequantizeEmptyRowsIsNothingToDo) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Dev<uint16_t> out(256);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
    EXPECT_TRUE(DequantizeRows(t, out.p, 0, 256, out.p, false, nullptr).ok()) << Name(t);
    EXPECT_TRUE(DequantizeRows(t, out.p, 16, 0, out.p, false, nullptr).ok()) << Name(t);
    EXPECT_TRUE(DequantizeTiledRows(t, out.p, 0, 0, 256, out.p, false, nullptr).ok()) << Name(t);
    EXPECT_FALSE(DequantizeRows(t, out.p, -1, 256, out.p, false, nullptr).ok()) << Name(t);
  }
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
}

// The sums: HalfActivations' == the CPU's, and the fused norm's == HalfActivations' of its
// output, bit for bit (rows of one and of several groups per thread).
TEST(TiledFormats, SubBlockSumsMatchCpuAndNorm) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  for (int n : {5120, 17408, 256}) {
    const int T = 13;
    const auto x = RandomActs(T, n);
    HalfActs h = Convert(x, T, n);
    const auto xh = h.xh.Down();
    std::vector<uint16_t> want(x.size() / 32);
    for (int r = 0; r < T; ++r)
      cpu::HalfSubBlockSums(xh.data() + static_cast<size_t>(r) * n, n,
                            want.data() + static_cast<size_t>(r) * (n / 32));
    EXPECT_EQ(h.sums.Down(), want) << n;
    std::vector<float> w(n);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (auto& v : w) v = u(Rng());
    Dev<float> dx(x), dw(w), out(x.size()), xs(T);
    Dev<uint16_t> xh2(x.size()), sums2(x.size() / 32);
    ASSERT_OK(RmsNormHalf(dx.p, dw.p, out.p, xh2.p, xs.p, T, n, 1e-6f, nullptr, false, sums2.p));
    HalfActs h2 = Convert(out.Down(), T, n);
    EXPECT_EQ(sums2.Down(), h2.sums.Down()) << n;
    EXPECT_EQ(xh2.Down(), h2.xh.Down()) << n;
  }
}

struct Case {
  GgmlType type;
  int M, K, nc;
  GemvEpilogue ep;
  int cpu_row_step = 1;
};

// GPU vs the CPU reference of the f16 operands (tight) and vs the f32 product (f16 rounding of
// the activations and of the sums); returns the outputs.
std::vector<float> RunCase(const Case& c, const Scratch& scratch, bool wgmma = false) {
  SCOPED_TRACE(::testing::Message() << Name(c.type) << " M=" << c.M << " K=" << c.K
                                    << " nc=" << c.nc << " ep=" << static_cast<int>(c.ep)
                                    << " wgmma=" << wgmma);
  const bool pair = c.ep == GemvEpilogue::kSiluMul;
  const auto w = RandomRows(c.type, c.M, c.K);
  const auto w2 = pair ? RandomRows(c.type, c.M, c.K) : std::vector<uint8_t>(1);
  const auto x = RandomActs(c.nc, c.K);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> y0(static_cast<size_t>(c.nc) * c.M);
  for (auto& v : y0) v = u(Rng());
  Dev<uint8_t> dw(w), dw2(w2);
  Dev<uint8_t> tw = Tile(c.type, dw, c.M, c.K);
  Dev<uint8_t> tw2 = pair ? Tile(c.type, dw2, c.M, c.K) : Dev<uint8_t>(1);
  HalfActs h = Convert(x, c.nc, c.K);
  Dev<uint16_t> xh_wg = ToWarpgroupOrder(h.xh);
  GemvArgs a = Args(c.type, tw.p, tw2.p, c.M, c.K, c.nc, h, nullptr, c.ep);
  if (wgmma) a.xh = xh_wg.p;
  Dev<float> y(y0);
  a.y = y.p;
  EXPECT_TRUE(TiledF16Multi(&a, 1, scratch.get(true, wgmma), nullptr).ok());
  const auto got = y.Down();
  Dev<float> y2(y0);
  a.y = y2.p;
  EXPECT_TRUE(TiledF16Multi(&a, 1, scratch.get(true, wgmma), nullptr).ok());
  EXPECT_EQ(0, std::memcmp(y2.Down().data(), got.data(), got.size() * 4)) << "second run";

  const auto xh = h.xh.Down();
  const auto sums = h.sums.Down();
  const auto xs = h.xs.Down();
  const uint64_t rb = GgmlRowBytes(c.type, c.K);
  std::vector<float> wf(c.K);
  // The same f16 operands, exactly; and the f32 product of the dequantized row: f16 rounds the
  // activations (2^-11 each) and the sub-block sums (2^-11 of each min term) of the K-quants,
  // Q8_0's and the IQ4 formats' weights (2^-11 each).
  auto dots = [&](int m, int r, int col) {
    const std::vector<uint8_t>& mat = m == 0 ? w : w2;
    const float* xc = x.data() + static_cast<size_t>(col) * c.K;
    RefDots d;
    const uint16_t* hc = xh.data() + static_cast<size_t>(col) * c.K;
    const uint8_t* row = mat.data() + r * rb;
    d.exact = xs[col] * (c.type == GgmlType::Q8_0     ? cpu::TiledF16DotQ80(row, hc, c.K, &d.abs)
                         : c.type == GgmlType::IQ4_XS ? cpu::TiledF16DotIq4Xs(row, hc, c.K, &d.abs)
                         : c.type == GgmlType::IQ4_NL ? cpu::TiledF16DotIq4Nl(row, hc, c.K, &d.abs)
                                                      : cpu::TiledF16DotKq(
                                                            row, c.type == GgmlType::Q5_K, hc,
                                                            sums.data() + static_cast<size_t>(col) * (c.K / 32),
                                                            c.K, &d.abs));
    d.abs *= xs[col];
    cpu::DequantizeRow(c.type, mat.data() + r * rb, wf.data(), c.K);
    for (int k = 0; k < c.K; ++k) {
      d.f32 += static_cast<double>(wf[k]) * xc[k];
      d.f32_abs += std::fabs(static_cast<double>(wf[k]) * xc[k]);
    }
    d.rounded_abs = d.f32_abs + d.abs;
    return d;
  };
  const std::string label = Name(c.type) + " K=" + std::to_string(c.K);
  ExpectWithinReferences(label.c_str(), c.M, c.nc, c.ep, c.cpu_row_step, y0, got, dots);
  return got;
}

TEST(TiledFormats, EveryColumnCountOddShape) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  for (GgmlType t : kFormats)
    for (int nc = 1; nc <= 64; ++nc) RunCase({t, 37, 768, nc, GemvEpilogue::kStore}, s);
}

// The wgmma form (tiled_f16.cuh, TiledF16Scratch::warpgroup_order) on every format: within the
// CPU reference at every column count and in the epilogues, and the mma.sync form's bits.
TEST(TiledFormats, WgmmaWithinTheReferenceAndSameBits) {
  if (!HaveWgmma()) GTEST_SKIP() << "needs sm_90a code on an sm_90 GPU";
  Scratch s;
  for (GgmlType t : kFormats) {
    for (int nc = 1; nc <= 64; ++nc) RunCase({t, 37, 768, nc, GemvEpilogue::kStore}, s, true);
    for (int nc : {1, 9, 33, 64}) RunCase({t, 21, 512, nc, GemvEpilogue::kSiluMul}, s, true);
    RunCase({t, 700, 4352, 24, GemvEpilogue::kAccumulate, 3}, s, true);
    for (const auto& [M, K, ep] : {std::tuple{300, 2048, GemvEpilogue::kSiluMul},
                                   std::tuple{5120, 17408, GemvEpilogue::kStore}}) {
      Dev<uint8_t> raw(RandomRows(t, M, K)), raw2(RandomRows(t, M, K));
      Dev<uint8_t> tw = Tile(t, raw, M, K), tw2 = Tile(t, raw2, M, K);
      const auto x = RandomActs(64, K);
      HalfActs h = Convert(x, 64, K);
      Dev<uint16_t> xh_wg = ToWarpgroupOrder(h.xh);
      for (int nc : {1, 16, 33, 64}) {
        std::vector<float> got[2];
        for (int form = 0; form < 2; ++form) {
          Dev<float> y(static_cast<size_t>(nc) * M);
          GemvArgs a = Args(t, tw.p, tw2.p, M, K, nc, h, y.p, ep);
          if (form == 1) a.xh = xh_wg.p;
          ASSERT_OK(TiledF16Multi(&a, 1, s.get(true, form == 1), nullptr));
          got[form] = y.Down();
        }
        EXPECT_EQ(0, std::memcmp(got[1].data(), got[0].data(), got[0].size() * 4))
            << Name(t) << " M=" << M << " nc=" << nc;
      }
    }
  }
}

TEST(TiledFormats, EpiloguesSplitAndModelShapes) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  for (GgmlType t : kFormats) {
    for (int nc : {1, 9, 33, 64}) RunCase({t, 21, 512, nc, GemvEpilogue::kSiluMul}, s);
    for (int nc : {5, 16, 64}) RunCase({t, 50, 1280, nc, GemvEpilogue::kAccumulate}, s);
    RunCase({t, 700, 4352, 24, GemvEpilogue::kStore, 3}, s);  // a K split
    RunCase({t, 17408, 5120, 64, GemvEpilogue::kSiluMul, 211}, s);
    RunCase({t, 5120, 17408, 48, GemvEpilogue::kAccumulate, 97}, s);
    RunCase({t, 10240, 5120, 1, GemvEpilogue::kStore, 101}, s);
  }
}

// A column's result is the same bits at every column count, through the scratch and through
// clusters (sm_90) alike; several segments in one launch equal one launch each.
TEST(TiledFormats, ColumnCountClustersAndSegments) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  for (GgmlType t : kFormats)
    for (const auto& [M, K, ep] : {std::tuple{40, 1024, GemvEpilogue::kStore},
                                   std::tuple{2000, 2048, GemvEpilogue::kStore},
                                   std::tuple{300, 2048, GemvEpilogue::kSiluMul},
                                   std::tuple{5120, 17408, GemvEpilogue::kStore}}) {
      Dev<uint8_t> raw(RandomRows(t, M, K)), raw2(RandomRows(t, M, K));
      Dev<uint8_t> w = Tile(t, raw, M, K), w2 = Tile(t, raw2, M, K);
      HalfActs h = Convert(RandomActs(64, K), 64, K);
      std::vector<float> full;
      for (int nc : {64, 1, 8, 9, 16, 17, 32, 33, 63})
        for (bool cluster : {true, false}) {
          Dev<float> y(static_cast<size_t>(nc) * M);
          const GemvArgs a = Args(t, w.p, w2.p, M, K, nc, h, y.p, ep);
          ASSERT_OK(TiledF16Multi(&a, 1, s.get(cluster), nullptr));
          const auto got = y.Down();
          if (full.empty()) {
            full = got;
            continue;
          }
          EXPECT_EQ(0, std::memcmp(got.data(), full.data(), got.size() * 4))
              << Name(t) << " M=" << M << " nc=" << nc << " cluster=" << cluster;
        }
    }
  for (GgmlType t : kFormats) {
    const int K = 1536, nc = 20, Ms[3] = {640, 7, 900};
    HalfActs h = Convert(RandomActs(nc, K), nc, K);
    std::vector<Dev<uint8_t>> tiled;
    for (int i = 0; i < 3; ++i) {
      Dev<uint8_t> d(RandomRows(t, Ms[i], K));
      tiled.push_back(Tile(t, d, Ms[i], K));
    }
    std::vector<Dev<float>> ys;
    GemvArgs segs[3];
    for (int i = 0; i < 3; ++i) {
      ys.emplace_back(static_cast<size_t>(nc) * Ms[i]);
      segs[i] = Args(t, tiled[i].p, nullptr, Ms[i], K, nc, h, ys[i].p, GemvEpilogue::kStore);
    }
    ASSERT_OK(TiledF16Multi(segs, 3, s.get(), nullptr));
    for (int i = 0; i < 3; ++i) {
      Dev<float> alone(static_cast<size_t>(nc) * Ms[i]);
      GemvArgs a = segs[i];
      a.y = alone.p;
      ASSERT_OK(TiledF16Multi(&a, 1, s.get(), nullptr));
      // The K split is the launch's (all its row blocks): alone, a segment may split otherwise,
      // so the values agree to rounding, not bit for bit.
      const auto x = ys[i].Down(), y = alone.Down();
      for (size_t j = 0; j < x.size(); ++j)
        ASSERT_NEAR(x[j], y[j], 1e-4 * (std::fabs(y[j]) + 1e-3)) << "segment " << i << " " << j;
    }
  }
}

// Q4_K / Q5_K without their sums are refused (Q8_0 needs none); no int8 kernel takes these
// tiles; the sums need K % 32 == 0.
TEST(TiledFormats, RejectsMissingSumsAndInt8Kernels) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  const int M = 16, K = 256;
  HalfActs h = Convert(RandomActs(1, K), 1, K);
  Dev<float> y(M);
  for (GgmlType t : kFormats) {
    Dev<uint8_t> raw(RandomRows(t, M, K));
    Dev<uint8_t> w = Tile(t, raw, M, K);
    GemvArgs a = Args(t, w.p, nullptr, M, K, 1, h, y.p, GemvEpilogue::kStore);
    a.xhs = nullptr;
    EXPECT_EQ(TiledF16Multi(&a, 1, s.get(), nullptr).ok(), !HasMins(t)) << Name(t);
    EXPECT_FALSE(TiledGemvMulti(&a, 1, nullptr).ok()) << Name(t);
  }
  Dev<float> x(K);
  Dev<uint16_t> xh(K), sums(K / 32);
  EXPECT_FALSE(HalfActivations(x.p, 1, 100, xh.p, y.p, nullptr, false, sums.p).ok());  // K % 32
}

// The benchmark for the dispatch (prints only): us per launch of the f16 kernel on tiled Q4_K /
// Q5_K / Q8_0 / IQ4_XS / IQ4_NL and of the v2 GEMV on the raw rows (<= 16 columns: its range), the 27B shapes (single
// matrices), each launch on another copy of the weights (>= 256 MiB in all, so L2 holds none).
TEST(TiledFormatsTiming, DISABLED_Table27B) {
  if (!HaveTiled()) GTEST_SKIP() << "needs sm_80+";
  Scratch s;
  for (GgmlType t : kFormats)
    for (const Matrix27B& m : k27BMatrices) {
      if (m.ep == GemvEpilogue::kSiluMul) continue;
      const uint64_t tb = TiledBytes(t, m.M, m.K);  // == the raw bytes
      const int copies = std::max<int>(2, static_cast<int>((256ull << 20) / tb) + 1);
      Dev<uint8_t> raw0(RandomRows(t, m.M, m.K));
      Dev<uint8_t> t0 = Tile(t, raw0, m.M, m.K);
      Dev<uint8_t> raws(tb * copies), tiles(tb * copies);
      for (int i = 0; i < copies; ++i) {
        CK(cudaMemcpy(raws.p + tb * i, raw0.p, tb, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy(tiles.p + tb * i, t0.p, tb, cudaMemcpyDeviceToDevice));
      }
      HalfActs h = Convert(RandomActs(64, m.K), 64, m.K);
      Dev<float> x(RandomActs(64, m.K));
      Dev<int8_t> xq(static_cast<size_t>(64) * m.K);
      Dev<float> xd(static_cast<size_t>(64) * m.K / 32);
      ASSERT_OK(QuantizeActivations(x.p, 64, m.K, xq.p, xd.p, nullptr));
      Dev<float> y(static_cast<size_t>(64) * m.M);
      std::printf("%s %-12s", Name(t).c_str(), m.name);
      for (int nc : {1, 2, 4, 8, 16, 32, 64}) {
        const double f16 = MedianLaunchUs([&](int rep) {
          const GemvArgs a = Args(t, tiles.p + tb * (rep % copies), nullptr, m.M, m.K, nc, h, y.p,
                                  GemvEpilogue::kStore);
          return TiledF16Multi(&a, 1, s.get(), nullptr);
        });
        double v2 = 0;
        if (nc <= kGemvMaxCols)
          v2 = MedianLaunchUs([&](int rep) {
            GemvArgs g;
            g.type = t;
            g.w = raws.p + tb * (rep % copies);
            g.M = m.M;
            g.K = m.K;
            g.nc = nc;
            g.x = x.p;
            g.xq = xq.p;
            g.xd = xd.p;
            g.y = y.p;
            return Gemv(g, nullptr);
          });
        std::printf("  nc=%d f16 %.1f v2 %.1f", nc, f16, v2);
      }
      std::printf("  (us)\n");
    }
}

}  // namespace
}  // namespace ds::cuda
