// The block-scaled FP8 prefill matmul (kernels/cuda/gemm_fp8.cuh) against its CPU reference
// (kernels/cpu/fp8_ref.h): both quantizers bit for bit, and the cuBLASLt product within a bound
// of the reference's exact sum at tile-edge shapes, with and without accumulation.
// Fp8Timing.* (disabled: --gtest_also_run_disabled_tests) is the benchmark against cuBLAS bf16.
#include "kernels/cuda/gemm_fp8.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/fp8_ref.h"
#include "kernels/cuda/gemm.cuh"
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

TEST(Fp8Gemm, WithinTheReference) {
  auto gemm = MakeGemm(512, 1024, 1024);
  if (!gemm) GTEST_SKIP() << Fp8Gemm::Create(512, 1024, 1024).status().ToString();
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
      const std::vector<float> wf = Weights(sh.M, sh.K);
      const std::vector<float> xf = Activations(sh.T, sh.K);
      std::vector<uint8_t> wq(wf.size()), xq(xf.size());
      std::vector<float> ws(Fp8BlockScaleFloats(sh.M, sh.K)), xs(static_cast<size_t>(sh.K / 128) * sh.T);
      cpu::QuantizeBlocksFp8(wf.data(), sh.M, sh.K, wq.data(), ws.data());
      cpu::QuantizeTokensFp8(xf.data(), sh.T, sh.K, xq.data(), xs.data(), sh.T);
      const std::vector<float> y0 = RandVec(Rng(), static_cast<size_t>(sh.T) * ldy, -1.f, 1.f);
      std::vector<float> ref = y0;
      std::vector<double> mag(ref.size(), 0.);
      cpu::GemmFp8Ref(wq.data(), ws.data(), xq.data(), xs.data(), sh.T, ref.data(), sh.M, sh.K,
                      sh.T, ldy, accumulate, mag.data());
      Dev<uint8_t> dw(wq);
      Dev<float> dws(ws), dx(xf), dy(y0);
      ASSERT_OK(gemm->SetActivations(dx.p, sh.T, sh.K, nullptr));
      ASSERT_OK(gemm->Multiply(dw.p, dws.p, dy.p, sh.M, ldy, accumulate, nullptr));
      const std::vector<float> got = dy.Down();
      int bad = 0;
      double worst = 0;
      for (int t = 0; t < sh.T; ++t) {
        for (int64_t r = 0; r < ldy; ++r) {
          const size_t i = static_cast<size_t>(t) * ldy + r;
          if (r >= sh.M) {  // past M: untouched
            if (std::memcmp(&got[i], &y0[i], 4) != 0 && bad++ < 5) ADD_FAILURE() << "wrote " << i;
            continue;
          }
          // The products of e4m3 values are exact; Hopper's FP8 tensor cores add them with a
          // narrower-than-f32 accumulator inside a 128-block (cuBLASLt promotes to f32 between
          // blocks): within 4e-3 of sum |terms| of the exact sum (measured: printed below).
          const double err = std::fabs(got[i] - ref[i]);
          const double bound = 4e-3 * mag[i] + 1e-6 * std::fabs(ref[i]) + 1e-30;
          worst = std::max(worst, err / (mag[i] + 1e-30));
          if (err > bound && bad++ < 5)
            ADD_FAILURE() << "t " << t << " r " << r << ": " << got[i] << " vs " << ref[i]
                          << " (sum |terms| " << mag[i] << ")";
        }
      }
      EXPECT_EQ(bad, 0) << "worst " << worst;
      std::printf("M %d K %d T %d%s: worst |gpu - ref| / sum |terms| = %.2e\n", sh.M, sh.K, sh.T,
                  accumulate ? " (accumulate)" : "", worst);
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

}  // namespace
}  // namespace ds::cuda
