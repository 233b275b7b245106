// The block-scaled FP8 prefill matmul (kernels/cuda/gemm_fp8.cuh) against its CPU reference
// (kernels/cpu/fp8_ref.h): both quantizers bit for bit, and the cuBLASLt product within a bound
// of the reference's exact sum at tile-edge shapes, with and without accumulation.
// The decode-width kernel (kernels/cuda/gemm_fp8_decode.cuh) likewise, alone at every token
// count and K split it takes, and inside Fp8Gemm. Fp8Timing.* (disabled:
// --gtest_also_run_disabled_tests) are the benchmarks against cuBLAS bf16 and cuBLASLt.
#include "kernels/cuda/gemm_fp8.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/fp8_ref.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemm_fp8_decode.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace ds::cuda {
namespace {

std::mt19937& Rng() {
  static std::mt19937 rng(20261205);
  return rng;
}

// Activations with a few outlier columns and an all-zero block.
std::vector<float> Activations(int rows, int K) {
  std::vector<float> x = RandVec(Rng(), static_cast<size_t>(rows) * K, -1.f, 1.f);
  for (int r = 0; r < rows; ++r) {
    x[static_cast<size_t>(r) * K + 7] *= 300.f;
    if (K >= 256 && r % 5 == 0)
      std::memset(&x[static_cast<size_t>(r) * K + 128], 0, 128 * sizeof(float));
  }
  return x;
}

std::unique_ptr<Fp8Gemm> MakeGemm(int max_tokens, int max_k, int max_m) {
  auto g = Fp8Gemm::Create(max_tokens, max_k, max_m);
  if (!g.ok()) return nullptr;
  return std::move(*g);
}

// Weights whose 128 x 128 blocks differ in magnitude (so that a block's scale read from another
// block shows), with one large value.
std::vector<float> Weights(int M, int K) {
  std::vector<float> w = RandVec(Rng(), static_cast<size_t>(M) * K, -0.05f, 0.05f);
  for (int r = 0; r < M; ++r)
    for (int k = 0; k < K; ++k)
      w[static_cast<size_t>(r) * K + k] *= 1.f + 0.7f * ((r / 128) * 3 + (k / 128) % 5);
  return w;
}

TEST(Fp8Quantize, SameBitsAsCpu) {
  if (ComputeMajor() < 8) GTEST_SKIP() << "needs a GPU";
  const int tokens = 37, K = 384, ld = 40;
  const std::vector<float> x = Activations(tokens, K);
  std::vector<uint8_t> q_ref(x.size());
  std::vector<float> s_ref(static_cast<size_t>(K / 128) * ld, 0.f);
  cpu::QuantizeTokensFp8(x.data(), tokens, K, q_ref.data(), s_ref.data(), ld);
  Dev<float> dx(x);
  Dev<uint8_t> dq(x.size());
  Dev<float> ds(s_ref.size());
  CK(cudaMemset(ds.p, 0, ds.n * sizeof(float)));
  ASSERT_OK(QuantizeTokensFp8(dx.p, tokens, K, dq.p, ds.p, ld, nullptr));
  EXPECT_EQ(dq.Down(), q_ref);
  EXPECT_EQ(ds.Down(), s_ref);
  // Weights from bf16 rows (as the upload makes them) and from f32.
  const int rows = 256;
  std::vector<float> wf = RandVec(Rng(), static_cast<size_t>(rows) * K, -0.05f, 0.05f);
  wf[3 * K + 200] = 2.f;
  std::vector<uint16_t> wh(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) {
    wh[i] = F32ToBf16(wf[i]);
    wf[i] = Bf16ToF32(wh[i]);
  }
  std::vector<uint8_t> wq_ref(wf.size());
  std::vector<float> ws_ref(Fp8BlockScaleFloats(rows, K), -1.f);
  cpu::QuantizeBlocksFp8(wf.data(), rows, K, wq_ref.data(), ws_ref.data());
  Dev<uint16_t> dwh(wh);
  Dev<float> dwf(wf);
  for (bool bf16 : {true, false}) {
    Dev<uint8_t> dwq(wf.size());
    Dev<float> dws(ws_ref.size());
    CK(cudaMemset(dws.p, 0, dws.n * 4));
    ASSERT_OK(QuantizeBlocksFp8(bf16 ? static_cast<const void*>(dwh.p) : dwf.p, bf16, rows, K,
                                dwq.p, dws.p, nullptr));
    EXPECT_EQ(dwq.Down(), wq_ref) << bf16;
    const std::vector<float> ws = dws.Down();
    for (int64_t rb = 0; rb < rows / 128; ++rb)
      for (int b = 0; b < K / 128; ++b)
        EXPECT_EQ(ws[rb * Fp8BlockScaleLd(K) + b], ws_ref[rb * Fp8BlockScaleLd(K) + b]) << bf16;
  }
  EXPECT_FALSE(QuantizeBlocksFp8(dwf.p, false, 100, K, nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(QuantizeTokensFp8(dx.p, 1, 100, nullptr, nullptr, 1, nullptr).ok());
}

struct Shape {
  int M, K, T;
};

// The products of e4m3 values are exact; Hopper's FP8 tensor cores add them with a
// narrower-than-f32 accumulator inside a 128-block (cuBLASLt and the decode kernel promote to f32
// between blocks): within 4e-3 of sum |terms| of the exact sum (measured: printed). Rows past M
// untouched. Returns the worst |gpu - ref| / sum |terms|.
double ExpectWithinTheReference(const std::vector<float>& got, const std::vector<float>& ref,
                                const std::vector<double>& mag, const std::vector<float>& y0,
                                int M, int T, int64_t ldy) {
  int bad = 0;
  double worst = 0;
  for (int t = 0; t < T; ++t) {
    for (int64_t r = 0; r < ldy; ++r) {
      const size_t i = static_cast<size_t>(t) * ldy + r;
      if (r >= M) {
        if (std::memcmp(&got[i], &y0[i], 4) != 0 && bad++ < 5) ADD_FAILURE() << "wrote " << i;
        continue;
      }
      const double err = std::fabs(got[i] - ref[i]);
      const double bound = 4e-3 * mag[i] + 1e-6 * std::fabs(ref[i]) + 1e-30;
      worst = std::max(worst, err / (mag[i] + 1e-30));
      if (!(err <= bound) && bad++ < 5)
        ADD_FAILURE() << "t " << t << " r " << r << ": " << got[i] << " vs " << ref[i]
                      << " (sum |terms| " << mag[i] << ")";
    }
  }
  EXPECT_EQ(bad, 0) << "worst " << worst;
  return worst;
}

// One product's inputs in e4m3 and the CPU reference's answer.
struct Fp8Case {
  Fp8Case(int M, int K, int T, int64_t ldy, bool accumulate) {
    const std::vector<float> wf = Weights(M, K);
    xf = Activations(T, K);
    wq.resize(wf.size());
    xq.resize(xf.size());
    ws.resize(Fp8BlockScaleFloats(M, K));
    xs.resize(static_cast<size_t>(K / 128) * T);
    cpu::QuantizeBlocksFp8(wf.data(), M, K, wq.data(), ws.data());
    cpu::QuantizeTokensFp8(xf.data(), T, K, xq.data(), xs.data(), T);
    y0 = RandVec(Rng(), static_cast<size_t>(T) * ldy, -1.f, 1.f);
    ref = y0;
    mag.assign(ref.size(), 0.);
    cpu::GemmFp8Ref(wq.data(), ws.data(), xq.data(), xs.data(), T, ref.data(), M, K, T, ldy,
                    accumulate, mag.data());
  }
  std::vector<float> xf, ws, xs, y0, ref;
  std::vector<uint8_t> wq, xq;
  std::vector<double> mag;
};

TEST(Fp8Gemm, WithinTheReference) {
  auto gemm = MakeGemm(512, 1024, 1024);
  if (!gemm) GTEST_SKIP() << Fp8Gemm::Create(512, 1024, 1024).status().ToString();
  // Both paths of the decode widths: the decode kernel (where the device has it) and cuBLASLt.
  for (bool decode_kernel : {true, false}) {
  gemm->set_decode_kernel(decode_kernel);
  // Token counts past whole groups of 4: over kFp8PadTokens (the tail's second product: 130, 77,
  // 65) and up to it (one padded product: 1, 3, 33, 63); a single token, wide K.
  const Shape shapes[] = {{128, 128, 128}, {256, 384, 256}, {384, 1024, 384}, {256, 384, 130},
                          {128, 640, 77},  {1024, 512, 16}, {128, 128, 1},   {256, 256, 8},
                          {128, 256, 300}, {256, 128, 3},   {256, 256, 33},  {128, 384, 63},
                          {128, 256, 65},  {384, 512, 64}};
  for (const Shape& sh : shapes) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(testing::Message() << "M " << sh.M << " K " << sh.K << " T " << sh.T
                                      << (accumulate ? " accumulate" : ""));
      const int64_t ldy = sh.M + 16;
      const Fp8Case c(sh.M, sh.K, sh.T, ldy, accumulate);
      Dev<uint8_t> dw(c.wq);
      Dev<float> dws(c.ws), dx(c.xf), dy(c.y0);
      ASSERT_OK(gemm->SetActivations(dx.p, sh.T, sh.K, nullptr));
      ASSERT_OK(gemm->Multiply(dw.p, dws.p, dy.p, sh.M, ldy, accumulate, nullptr));
      const double worst = ExpectWithinTheReference(dy.Down(), c.ref, c.mag, c.y0, sh.M, sh.T, ldy);
      std::printf("M %d K %d T %d%s%s: worst |gpu - ref| / sum |terms| = %.2e\n", sh.M, sh.K, sh.T,
                  accumulate ? " (accumulate)" : "",
                  decode_kernel && Fp8DecodeTakes(sh.M, sh.K, sh.T) ? " (decode kernel)" : "", worst);
    }
  }
  }
  Dev<uint8_t> w(256 * 128);
  Dev<float> s(256), y(256 * 256), x(128 * 4);
  ASSERT_OK(gemm->SetActivations(x.p, 4, 128, nullptr));
  EXPECT_FALSE(gemm->Multiply(w.p, s.p, y.p, 200, 256, false, nullptr).ok());  // M % 128
  EXPECT_FALSE(gemm->Multiply(w.p + 1, s.p, y.p, 256, 256, false, nullptr).ok());
  EXPECT_FALSE(gemm->Multiply(w.p, s.p, y.p, 2048, 2048, false, nullptr).ok());  // > max_m
  EXPECT_FALSE(gemm->SetActivations(x.p, 513, 128, nullptr).ok());  // > max_tokens
}

// The decode kernel alone: every width it instantiates (T = 1..64, partial tiles), one K block to
// many, runs from one block for everything to one weight block per block (row blocks split
// between 2..many runs, their partial tiles added by the last), with and without accumulation;
// the same bits when run again (the runs' order is fixed).
TEST(Fp8DecodeGemm, WithinTheReferenceAtEveryWidthAndRunSplit) {
  if (!Fp8DecodeAvailable()) GTEST_SKIP() << "no wgmma on this device or build";
  const int max_m = 1024;
  Dev<uint8_t> scratch(Fp8DecodeScratchBytes(max_m));
  ASSERT_OK(Fp8DecodeScratchInit(scratch.p, max_m, nullptr));
  const Shape shapes[] = {{128, 128, 1},  {256, 640, 5},   {384, 1024, 8},  {128, 2048, 9},
                          {512, 768, 16}, {256, 1280, 17}, {1024, 512, 24}, {128, 4096, 31},
                          {384, 2304, 32}, {128, 128, 33}, {256, 256, 2},   {640, 1152, 47},
                          {256, 3072, 48}, {384, 896, 49},  {1024, 1024, 64}, {128, 1664, 63}};
  for (const Shape& sh : shapes) {
    const int weight_blocks = sh.M / 128 * (sh.K / 128);
    for (int blocks : {0, 1, 2, 3, 7, weight_blocks}) {
      if (blocks > weight_blocks || blocks > kFp8DecodeMaxBlocks) continue;
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(testing::Message() << "M " << sh.M << " K " << sh.K << " T " << sh.T
                                        << " blocks " << blocks << (accumulate ? " accumulate" : ""));
        ASSERT_TRUE(Fp8DecodeTakes(sh.M, sh.K, sh.T));
        const int64_t ldy = sh.M + 8;
        const Fp8Case c(sh.M, sh.K, sh.T, ldy, accumulate);
        // The token scales in rows of a multiple of 4 (what the kernel copies), zeros past T.
        const int ld_xs = (sh.T + 3) / 4 * 4;
        std::vector<float> xs(static_cast<size_t>(sh.K / 128) * ld_xs, 0.f);
        for (int b = 0; b < sh.K / 128; ++b)
          for (int t = 0; t < sh.T; ++t) xs[static_cast<size_t>(b) * ld_xs + t] = c.xs[static_cast<size_t>(b) * sh.T + t];
        Dev<uint8_t> dw(c.wq), dx(c.xq);
        Dev<float> dws(c.ws), dxs(xs), dy(c.y0);
        Fp8DecodeArgs a;
        a.w = dw.p;
        a.ws = dws.p;
        a.x = dx.p;
        a.xs = dxs.p;
        a.ld_xs = ld_xs;
        a.y = dy.p;
        a.ldy = ldy;
        a.M = sh.M;
        a.K = sh.K;
        a.T = sh.T;
        a.accumulate = accumulate;
        a.blocks = blocks;
        ASSERT_OK(Fp8DecodeGemm(a, scratch.p, max_m, nullptr));
        const std::vector<float> got = dy.Down();
        ExpectWithinTheReference(got, c.ref, c.mag, c.y0, sh.M, sh.T, ldy);
        CK(cudaMemcpy(dy.p, c.y0.data(), c.y0.size() * 4, cudaMemcpyHostToDevice));
        ASSERT_OK(Fp8DecodeGemm(a, scratch.p, max_m, nullptr));
        EXPECT_EQ(dy.Down(), got) << "not the same bits again";
        if (blocks == 0) {  // the tiled images: the same shared-memory tiles, the same bits
          Dev<uint8_t> wt(c.wq.size()), xt(static_cast<size_t>(Fp8DecodeWidth(sh.T)) * sh.K);
          ASSERT_OK(Fp8TileWeights(dw.p, sh.M, sh.K, wt.p, nullptr));
          ASSERT_OK(Fp8TileActivations(dx.p, sh.T, sh.K, xt.p, nullptr));
          a.w = wt.p;
          a.w_tiled = true;
          a.x = xt.p;
          a.x_tiled = true;
          CK(cudaMemcpy(dy.p, c.y0.data(), c.y0.size() * 4, cudaMemcpyHostToDevice));
          ASSERT_OK(Fp8DecodeGemm(a, scratch.p, max_m, nullptr));
          EXPECT_EQ(dy.Down(), got) << "tiled images";
        }
      }
    }
  }
  // What it does not take: an error, nothing written.
  Fp8DecodeArgs a;
  Dev<uint8_t> w(256 * 256), x(80 * 256);
  Dev<float> s(80 * 2), y(80 * 256);
  a.w = w.p;
  a.ws = s.p;
  a.x = x.p;
  a.xs = s.p;
  a.ld_xs = 68;
  a.y = y.p;
  a.ldy = 256;
  a.M = 256;
  a.K = 256;
  a.T = 65;
  EXPECT_FALSE(Fp8DecodeGemm(a, scratch.p, max_m, nullptr).ok());  // > 64 tokens
  a.T = 4;
  a.ld_xs = 6;
  EXPECT_FALSE(Fp8DecodeGemm(a, scratch.p, max_m, nullptr).ok());  // ld_xs % 4
  a.ld_xs = 4;
  a.M = 200;
  EXPECT_FALSE(Fp8DecodeGemm(a, scratch.p, max_m, nullptr).ok());  // M % 128
  a.M = 2048;
  a.ldy = 2048;
  EXPECT_FALSE(Fp8DecodeGemm(a, scratch.p, max_m, nullptr).ok());  // > max_m
  a.M = 256;
  a.ldy = 256;
  a.blocks = 5;
  EXPECT_FALSE(Fp8DecodeGemm(a, scratch.p, max_m, nullptr).ok());  // more blocks than weight blocks
  a.blocks = 0;
  a.w = w.p + 8;
  EXPECT_FALSE(Fp8DecodeGemm(a, scratch.p, max_m, nullptr).ok());  // unaligned
  EXPECT_FALSE(Fp8DecodeTakes(128, 100, 4));
  EXPECT_FALSE(Fp8DecodeTakes(128, 128, 0));
}

// The 27B's matrix shapes the timing benchmarks multiply.
struct Matrix {
  const char* name;
  int M, K;
};
constexpr Matrix kMatrices27B[] = {{"ffn_gate", 17408, 5120}, {"ffn_down", 5120, 17408},
                                   {"gdn_qkv", 10240, 5120},  {"attn_q+gate", 12288, 5120},
                                   {"ssm_out", 5120, 6144},   {"gdn_z", 6144, 5120}};

// Random weights of a matrix in e4m3 with their block scales (QuantizeBlocksFp8), on the device.
struct Fp8Weights {
  explicit Fp8Weights(const Matrix& m)
      : q(static_cast<size_t>(m.M) * m.K), s(Fp8BlockScaleFloats(m.M, m.K)) {
    Dev<float> f(RandVec(Rng(), q.n, -0.05f, 0.05f));
    EXPECT_TRUE(QuantizeBlocksFp8(f.p, false, m.M, m.K, q.p, s.p, nullptr).ok());
  }
  Dev<uint8_t> q;
  Dev<float> s;
};

// Benchmark (prints only): the 27B's prefill matrices, FP8 (with the activations' quantization)
// against cuBLAS bf16 on the same shapes.
TEST(Fp8Timing, DISABLED_Prefill27B) {
  auto fp8 = MakeGemm(8192, 17408, 17408);
  if (!fp8) GTEST_SKIP() << Fp8Gemm::Create(8192, 17408, 17408).status().ToString();
  auto gemm = CublasGemm::Create();
  ASSERT_TRUE(gemm.ok());
  std::printf("%-12s %5s %9s %9s %9s %8s %8s %8s\n", "matrix", "T", "bf16 us", "fp8 us",
              "quant us", "bf16 TF", "fp8 TF", "speedup");
  for (const Matrix& m : kMatrices27B) {
    Fp8Weights w(m);
    Dev<uint16_t> wh(w.q.n);
    CK(cudaMemset(wh.p, 0x3c, wh.n * 2));
    for (int T : {512, 2048, 8192}) {
      const std::vector<float> x = RandVec(Rng(), static_cast<size_t>(T) * m.K, -1.f, 1.f);
      Dev<float> xf(x);
      Dev<uint16_t> xh(x.size());
      CK(cudaMemset(xh.p, 0x3c, xh.n * 2));
      Dev<float> y(static_cast<size_t>(T) * m.M);
      const double bf16 = MeanLaunchUs(2, 10, [&] {
        return (*gemm)->Run(wh.p, xh.p, y.p, m.M, m.K, T, m.M, /*bf16=*/true, 0.f, nullptr);
      });
      const double quant = MeanLaunchUs(2, 10, [&] { return fp8->SetActivations(xf.p, T, m.K, nullptr); });
      const double f8 = MeanLaunchUs(2, 10, [&] {
        return fp8->Multiply(w.q.p, w.s.p, y.p, m.M, m.M, false, nullptr);
      });
      const double ops = 2.0 * m.M * m.K * T;
      std::printf("%-12s %5d %9.1f %9.1f %9.1f %8.0f %8.0f %7.2fx\n", m.name, T, bf16, f8, quant,
                  ops / bf16 * 1e-6, ops / f8 * 1e-6, bf16 / (f8 + quant));
    }
  }
  delete *gemm;
}

// Benchmark (prints only): the 27B's matrices at decode-step widths (16..64 sequences), every
// algorithm cuBLASLt's heuristic offers (#0 is what Multiply takes), its time, the weights' read
// rate it reaches, and whether its output is candidate 0's bit for bit: whether picking per shape
// by measurement pays, and whether it would change numbers.
TEST(Fp8Timing, DISABLED_DecodeCandidates27B) {
  auto fp8 = MakeGemm(64, 17408, 17408);
  if (!fp8) GTEST_SKIP() << Fp8Gemm::Create(64, 17408, 17408).status().ToString();
  std::printf("%-12s %3s %4s %9s %7s %5s\n", "matrix", "T", "alg", "us", "GB/s", "bits");
  for (const Matrix& m : kMatrices27B) {
    Fp8Weights w(m);
    for (int T : {16, 32, 48, 64}) {
      const std::vector<float> x = RandVec(Rng(), static_cast<size_t>(T) * m.K, -1.f, 1.f);
      Dev<float> xf(x);
      Dev<float> y(static_cast<size_t>(T) * m.M);
      ASSERT_OK(fp8->SetActivations(xf.p, T, m.K, nullptr));
      auto n = fp8->AlgorithmCount(m.M, m.M, 16);
      ASSERT_TRUE(n.ok()) << n.status();
      std::vector<float> first;
      double best = 1e30, t0 = 0;
      for (int i = 0; i < *n; ++i) {
        ASSERT_OK(fp8->UseAlgorithm(m.M, m.M, i));
        const double us = MeanLaunchUs(2, 20, [&] {
          return fp8->Multiply(w.q.p, w.s.p, y.p, m.M, m.M, false, nullptr);
        });
        std::vector<float> out = y.Down(y.n);
        if (i == 0) {
          first = out;
          t0 = us;
        }
        best = std::min(best, us);
        std::printf("%-12s %3d %4d %9.1f %7.0f %5s\n", m.name, T, i, us,
                    static_cast<double>(w.q.n) / us * 1e-3,
                    std::memcmp(out.data(), first.data(), out.size() * 4) == 0 ? "same" : "DIFF");
      }
      std::printf("%-12s %3d best %.1f us vs #0 %.1f (%.2fx)\n", m.name, T, best, t0, t0 / best);
      ASSERT_OK(fp8->UseAlgorithm(m.M, m.M, 0));
    }
  }
}

// Benchmark (prints only): the 27B's matrices at decode widths, the decode kernel against
// cuBLASLt's first algorithm (what Multiply takes with set_decode_kernel(false)), with the rate
// each reads the weights at.
TEST(Fp8Timing, DISABLED_DecodeKernel27B) {
  auto fp8 = MakeGemm(64, 17408, 17408);
  if (!fp8) GTEST_SKIP() << Fp8Gemm::Create(64, 17408, 17408).status().ToString();
  if (!Fp8DecodeAvailable()) GTEST_SKIP() << "no wgmma on this device or build";
  std::printf("%-12s %3s %6s %11s %10s %8s %9s %7s\n", "matrix", "T", "blocks", "cublasLt us",
              "kernel us", "Lt GB/s", "kern GB/s", "speedup");
  constexpr int kWidths[] = {8, 16, 32, 48, 64};
  constexpr int kN = sizeof(kWidths) / sizeof(kWidths[0]);
  double sum_lt[kN] = {}, sum_k[kN] = {}, bytes = 0;
  for (const Matrix& m : kMatrices27B) {
    // Copies enough to exceed L2 (~50-60 MB), taken in turn: every product reads from memory,
    // as in a model's step.
    const double matrix_bytes = static_cast<double>(m.M) * m.K;
    std::vector<std::unique_ptr<Fp8Weights>> copies;
    for (int i = 0; i < std::max(2, static_cast<int>(200e6 / matrix_bytes) + 1); ++i)
      copies.push_back(std::make_unique<Fp8Weights>(m));
    const Fp8Weights& w = *copies[0];
    bytes += matrix_bytes;
    for (int ti = 0; ti < kN; ++ti) {
      const int T = kWidths[ti];
      const std::vector<float> x = RandVec(Rng(), static_cast<size_t>(T) * m.K, -1.f, 1.f);
      Dev<float> xf(x);
      Dev<float> y(static_cast<size_t>(T) * m.M);
      ASSERT_OK(fp8->SetActivations(xf.p, T, m.K, nullptr));
      auto run = [&](bool kernel) {
        fp8->set_decode_kernel(kernel);
        size_t turn = 0;
        return MeanLaunchUs(3, 30, [&] {
          const Fp8Weights& c = *copies[turn++ % copies.size()];
          return fp8->Multiply(c.q.p, c.s.p, y.p, m.M, m.M, false, nullptr);
        });
      };
      const double lt = run(false), k = run(true);
      sum_lt[ti] += lt;
      sum_k[ti] += k;
      std::printf("%-12s %3d %6d %11.1f %10.1f %8.0f %9.0f %6.2fx\n", m.name, T,
                  Fp8DecodeBlocks(m.M, m.K), lt, k, static_cast<double>(w.q.n) / lt * 1e-3,
                  static_cast<double>(w.q.n) / k * 1e-3, lt / k);
    }
  }
  for (int i = 0; i < kN; ++i)
    std::printf("all, T %d: cuBLASLt %.1f us (%.0f GB/s), kernel %.1f us (%.0f GB/s), %.2fx\n",
                kWidths[i], sum_lt[i], bytes / sum_lt[i] * 1e-3, sum_k[i], bytes / sum_k[i] * 1e-3,
                sum_lt[i] / sum_k[i]);
}

// Benchmark (prints only): the decode kernel alone on the 27B's matrices at 16 and 64 tokens with
// each number of K blocks asked for at once (Fp8DecodeArgs::group), to check the default by
// measurement.
TEST(Fp8Timing, DISABLED_DecodeKernelGroups27B) {
  if (!Fp8DecodeAvailable()) GTEST_SKIP() << "no wgmma on this device or build";
  const int max_m = 17408;
  Dev<uint8_t> scratch(Fp8DecodeScratchBytes(max_m));
  ASSERT_OK(Fp8DecodeScratchInit(scratch.p, max_m, nullptr));
  for (const Matrix& m : kMatrices27B) {
    const double matrix_bytes = static_cast<double>(m.M) * m.K;
    std::vector<std::unique_ptr<Fp8Weights>> copies;
    for (int i = 0; i < std::max(2, static_cast<int>(200e6 / matrix_bytes) + 1); ++i)
      copies.push_back(std::make_unique<Fp8Weights>(m));
    for (int T : {16, 64}) {
      Dev<float> xf(RandVec(Rng(), static_cast<size_t>(T) * m.K, -1.f, 1.f));
      Dev<uint8_t> xq(static_cast<size_t>(T) * m.K);
      Dev<float> xs(static_cast<size_t>(m.K / 128) * T), y(static_cast<size_t>(T) * m.M);
      ASSERT_OK(QuantizeTokensFp8(xf.p, T, m.K, xq.p, xs.p, T, nullptr));
      Fp8DecodeArgs a;
      a.x = xq.p;
      a.xs = xs.p;
      a.ld_xs = T;
      a.y = y.p;
      a.ldy = m.M;
      a.M = m.M;
      a.K = m.K;
      a.T = T;
      std::vector<std::unique_ptr<Dev<uint8_t>>> tiled;
      for (const auto& c : copies) {
        tiled.push_back(std::make_unique<Dev<uint8_t>>(c->q.n));
        ASSERT_OK(Fp8TileWeights(c->q.p, m.M, m.K, tiled.back()->p, nullptr));
      }
      Dev<uint8_t> xt(static_cast<size_t>(Fp8DecodeWidth(T)) * m.K);
      ASSERT_OK(Fp8TileActivations(xq.p, T, m.K, xt.p, nullptr));
      std::printf("%-12s T %2d:", m.name, T);
      for (int variant = 0; variant < 6; ++variant) {
        // 0-3: row-major, K blocks asked for 1 / 2 / 4 / 8 at once; 4: tiled weights; 5: both tiled.
        a.group = variant < 4 ? 1 << variant : 0;
        a.w_tiled = variant >= 4;
        a.x_tiled = variant == 5;
        a.x = a.x_tiled ? xt.p : xq.p;
        size_t turn = 0;
        const double us = MeanLaunchUs(3, 30, [&] {
          const size_t i = turn++ % copies.size();
          a.w = a.w_tiled ? tiled[i]->p : copies[i]->q.p;
          a.ws = copies[i]->s.p;
          return Fp8DecodeGemm(a, scratch.p, max_m, nullptr);
        });
        static const char* const kNames[] = {"group 1", "group 2", "group 4", "group 8", "w tiled", "w+x tiled"};
        std::printf("  %s: %.1f us (%.0f GB/s)", kNames[variant], us, matrix_bytes / us * 1e-3);
      }
      std::printf("\n");
    }
  }
}

}  // namespace
}  // namespace ds::cuda
