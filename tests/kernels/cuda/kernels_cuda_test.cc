// CUDA kernels vs the CPU reference (kernels/cpu). Random inputs in realistic ranges, odd shapes
// and the 27B shapes, outputs poisoned with NaN before every run. Needs a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <memory>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/sampling.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/weights_test_util.h"

namespace ds::cuda {
namespace {

std::mt19937& Rng() {
  static std::mt19937 rng(1234);
  return rng;
}
std::vector<float> RandVec(size_t n, float lo, float hi) { return ds::cuda::RandVec(Rng(), n, lo, hi); }
std::vector<uint8_t> RandomWeights(GgmlType t, int64_t rows, int64_t K) {
  return ds::cuda::RandomWeights(Rng(), t, rows, K);
}

// ---------------------------------------------------------------------------------------------
// GEMV

struct GemvCase {
  GgmlType type;
  int M, K, nc;
  GemvEpilogue ep;
  bool tiled = false;  // repack with TileRows (in two chunks) and run TiledGemvMulti
};

void RunGemvCase(const GemvCase& c) {
  SCOPED_TRACE(::testing::Message() << GgmlInfo(c.type).name << " M=" << c.M << " K=" << c.K
                                    << " nc=" << c.nc << " ep=" << static_cast<int>(c.ep)
                                    << (c.tiled ? " tiled" : ""));
  const bool pair = c.ep == GemvEpilogue::kSiluMul;
  auto w = RandomWeights(c.type, c.M, c.K);
  std::vector<uint8_t> w2 = pair ? RandomWeights(c.type, c.M, c.K) : std::vector<uint8_t>();
  auto x = RandVec(static_cast<size_t>(c.nc) * c.K, -2.f, 2.f);
  auto y0 = RandVec(static_cast<size_t>(c.nc) * c.M, -1.f, 1.f);  // for kAccumulate
  Dev<uint8_t> dw(w), dw2(pair ? w2 : std::vector<uint8_t>(1));
  Dev<float> dx(x), dy(static_cast<size_t>(c.nc) * c.M);
  Dev<int8_t> dxq(static_cast<size_t>(c.nc) * c.K);
  Dev<float> dxd(static_cast<size_t>(c.nc) * c.K / 32 + 1);
  if (c.ep == GemvEpilogue::kAccumulate) dy.Up(y0);
  const bool qx = GemvWantsQuantizedX(c.type, c.K);
  if (qx) ASSERT_OK(QuantizeActivations(dx.p, c.nc, c.K, dxq.p, dxd.p, nullptr));
  GemvArgs a;
  a.type = c.type;
  a.w = dw.p;
  a.w2 = pair ? dw2.p : nullptr;
  a.M = c.M;
  a.K = c.K;
  a.nc = c.nc;
  a.x = dx.p;
  a.xq = qx ? dxq.p : nullptr;
  a.xd = qx ? dxd.p : nullptr;
  a.y = dy.p;
  a.epilogue = c.ep;
  if (c.tiled) {
    Dev<uint8_t> tw = TileOnDevice(c.type, dw, c.M, c.K);
    Dev<uint8_t> tw2 = pair ? TileOnDevice(c.type, dw2, c.M, c.K) : Dev<uint8_t>(1);
    a.w = tw.p;
    a.w2 = pair ? tw2.p : nullptr;
    ASSERT_OK(TiledGemvMulti(&a, 1, nullptr));
    CK(cudaDeviceSynchronize());
  } else {
    ASSERT_OK(Gemv(a, nullptr));
  }
  CK(cudaDeviceSynchronize());
  const auto y = dy.Down();
  const auto W = DequantAll(c.type, w, c.M, c.K);
  const auto W2 = pair ? DequantAll(c.type, w2, c.M, c.K) : std::vector<float>();
  // With int8 activations the error of one dot is sum_i w_i e_i, e_i uniform in +-d/2 of its
  // 32-block: bound it by 6 standard deviations; f32 paths get a tight relative bound.
  std::vector<float> xd(qx ? dxd.Down() : std::vector<float>());
  std::vector<int8_t> xqh(qx ? dxq.Down() : std::vector<int8_t>());
  // Besides the loose check against the unquantized activations (the int8 noise bound), the
  // quantized formats get a sharp one against the int8 activations the kernel actually multiplies
  // (xq * xd): only float summation order may differ, so errors of 1e-3 of a dot product show.
  double max_ratio = 0, max_sharp = 0;
  int bad = 0;
  for (int col = 0; col < c.nc; ++col)
    for (int r = 0; r < c.M; ++r) {
      double ref = 0, ref2 = 0, abs_sum = 0, var = 0, var2 = 0;
      double refq = 0, refq2 = 0, abs_q = 0;
      for (int i = 0; i < c.K; ++i) {
        const double xv = x[static_cast<size_t>(col) * c.K + i];
        const double wv = W[static_cast<size_t>(r) * c.K + i];
        ref += wv * xv;
        abs_sum += std::fabs(wv * xv);
        const double d = qx ? xd[static_cast<size_t>(col) * c.K / 32 + i / 32] : 0.0;
        var += wv * wv * d * d / 12.0;
        const double xqv = qx ? d * xqh[static_cast<size_t>(col) * c.K + i] : 0.0;
        refq += wv * xqv;
        abs_q += std::fabs(wv * xqv);
        if (pair) {
          const double w2v = W2[static_cast<size_t>(r) * c.K + i];
          ref2 += w2v * xv;
          var2 += w2v * w2v * d * d / 12.0;
          refq2 += w2v * xqv;
          abs_q += std::fabs(w2v * xqv);
        }
      }
      if (qx) {
        double expect_q = refq, tol_q = 2e-5 * abs_q + 1e-6;
        if (pair) {
          const double sa = refq / (1 + std::exp(-refq));
          expect_q = sa * refq2;
          tol_q = 1.1 * std::fabs(refq2) * tol_q + std::fabs(sa) * tol_q + 1e-6;
        } else if (c.ep == GemvEpilogue::kAccumulate) {
          expect_q += y0[static_cast<size_t>(col) * c.M + r];
          tol_q += 1e-6 * std::fabs(y0[static_cast<size_t>(col) * c.M + r]);
        }
        const double eq = std::fabs(y[static_cast<size_t>(col) * c.M + r] - expect_q);
        max_sharp = std::max(max_sharp, eq / tol_q);
        if (!(eq <= tol_q) && bad++ < 5)
          ADD_FAILURE() << "row " << r << " col " << col << ": got " << y[static_cast<size_t>(col) * c.M + r]
                        << " want (int8 activations) " << expect_q << " tol " << tol_q;
      }
      double tol = 6 * std::sqrt(var) + 2e-5 * abs_sum + 1e-6;
      double expect = ref;
      if (pair) {
        // d(silu(a)*b) = silu'(a) b da + silu(a) db; silu' <= 1.1.
        const double sa = ref / (1 + std::exp(-ref));
        expect = sa * ref2;
        tol = 1.1 * std::fabs(ref2) * tol + std::fabs(sa) * (6 * std::sqrt(var2) + 2e-5 * abs_sum) + 1e-6;
      } else if (c.ep == GemvEpilogue::kAccumulate) {
        expect += y0[static_cast<size_t>(col) * c.M + r];
      }
      const double got = y[static_cast<size_t>(col) * c.M + r];
      const double err = std::fabs(got - expect);
      if (!(err <= tol)) {
        if (bad++ < 5)
          ADD_FAILURE() << "row " << r << " col " << col << ": got " << got << " want " << expect
                        << " tol " << tol;
      }
      max_ratio = std::max(max_ratio, err / tol);
    }
  EXPECT_EQ(bad, 0);
  std::printf("  gemv%s %-6s M=%6d K=%6d nc=%d ep=%d: max err/tol %.3f, vs int8 activations %.3f\n",
              c.tiled ? "(tiled)" : "", std::string(GgmlInfo(c.type).name).c_str(), c.M, c.K, c.nc,
              static_cast<int>(c.ep), max_ratio, max_sharp);
}

const GgmlType kTypes[] = {GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K,
                           GgmlType::IQ4_XS, GgmlType::IQ4_NL, GgmlType::F16, GgmlType::BF16,
                           GgmlType::F32};

TEST(Gemv, AllTypesOddShapes) {
  for (GgmlType t : kTypes)
    for (int nc : {1, 2, 3, 5, 8, 11, 16}) RunGemvCase({t, 37, 768, nc, GemvEpilogue::kStore});
}

// Float weights take up to 64 columns in one call (column groups on the grid's second
// dimension): every epilogue, and K not a multiple of 256 (the per-element kernel, 16 columns at
// a time).
TEST(Gemv, FloatWeightsUpTo64Columns) {
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
    for (int nc : {17, 33, 64}) RunGemvCase({t, 37, 768, nc, GemvEpilogue::kStore});
    RunGemvCase({t, 48, 1280, 40, GemvEpilogue::kAccumulate});
    RunGemvCase({t, 21, 512, 24, GemvEpilogue::kSiluMul});
    RunGemvCase({t, 19, 100, 35, GemvEpilogue::kStore});
  }
  GemvArgs a;
  a.type = GgmlType::Q8_0;
  a.M = 32;
  a.K = 256;
  a.nc = kGemvMaxCols + 1;
  EXPECT_EQ(Gemv(a, nullptr).code(), absl::StatusCode::kInvalidArgument);  // quantized: 16 at most
  a.type = GgmlType::F32;
  a.nc = kGemvFloatMaxCols + 1;
  EXPECT_EQ(Gemv(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// Float weights: a column's products do not depend on the kernel's column width (the 6-column
// kernel of GemvArgs::six_columns, the 8-column one, column groups past 8, or the column alone):
// an MTP verify's rows must equal the plain decode steps' bit for bit, and a decode row's numbers
// must not depend on how many rows share its step (batch invariance to small_float_max_rows).
TEST(Gemv, FloatColumnsIndependentOfTheKernelWidth) {
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::F32}) {
    for (int nc : {5, 6, 9, 16, 33, 64}) {
      SCOPED_TRACE(::testing::Message() << GgmlInfo(t).name << " nc=" << nc);
      const int M = 37, K = 768;
      const auto x = RandVec(static_cast<size_t>(nc) * K, -2.f, 2.f);
      Dev<uint8_t> dw(RandomWeights(t, M, K));
      Dev<float> dx(x);
      auto run = [&](int c0, int n, bool six) {
        Dev<float> dy(static_cast<size_t>(n) * M);
        GemvArgs a;
        a.type = t; a.w = dw.p; a.M = M; a.K = K; a.nc = n; a.x = dx.p + static_cast<size_t>(c0) * K;
        a.y = dy.p; a.six_columns = six;
        EXPECT_TRUE(Gemv(a, nullptr).ok());
        CK(cudaDeviceSynchronize());
        return dy.Down();
      };
      // Up to 8 columns one launch of the 6- or 8-column kernel; past 8 column groups of 8.
      const auto six = run(0, nc, true), eight = run(0, nc, false);
      ASSERT_EQ(six.size(), eight.size());
      EXPECT_EQ(std::memcmp(six.data(), eight.data(), six.size() * sizeof(float)), 0);
      for (int c = 0; c < nc; ++c) {
        const auto one = run(c, 1, true);
        EXPECT_EQ(std::memcmp(one.data(), six.data() + static_cast<size_t>(c) * M, M * sizeof(float)), 0)
            << "column " << c;
      }
    }
  }
}

// GemvMulti must give exactly the single-matrix results (same per-row arithmetic), for segment
// sizes that do not fill a block and a mix of store and accumulate epilogues.
TEST(Gemv, MultiSegmentsMatchSingle) {
  for (GgmlType t : {GgmlType::Q6_K, GgmlType::F32}) {
    for (int nc : {1, 5, 16}) {
      const int K = 1024;
      const int Ms[3] = {37, 5, 130};
      auto x = RandVec(static_cast<size_t>(nc) * K, -2.f, 2.f);
      Dev<float> dx(x);
      Dev<int8_t> dxq(static_cast<size_t>(nc) * K);
      Dev<float> dxd(static_cast<size_t>(nc) * K / 32);
      const bool qx = GemvWantsQuantizedX(t, K);
      if (qx) ASSERT_OK(QuantizeActivations(dx.p, nc, K, dxq.p, dxd.p, nullptr));
      std::vector<std::unique_ptr<Dev<uint8_t>>> dw;
      std::vector<std::unique_ptr<Dev<float>>> y1, y2;
      GemvArgs segs[3];
      for (int i = 0; i < 3; ++i) {
        dw.push_back(std::make_unique<Dev<uint8_t>>(RandomWeights(t, Ms[i], K)));
        auto y0 = RandVec(static_cast<size_t>(nc) * Ms[i], -1.f, 1.f);
        y1.push_back(std::make_unique<Dev<float>>(y0));
        y2.push_back(std::make_unique<Dev<float>>(y0));
        GemvArgs& a = segs[i];
        a.type = t; a.w = dw[i]->p; a.M = Ms[i]; a.K = K; a.nc = nc; a.x = dx.p;
        a.xq = qx ? dxq.p : nullptr; a.xd = qx ? dxd.p : nullptr;
        a.epilogue = i == 1 ? GemvEpilogue::kAccumulate : GemvEpilogue::kStore;
        a.y = y1[i]->p;
        ASSERT_OK(Gemv(a, nullptr));
        a.y = y2[i]->p;
      }
      ASSERT_OK(GemvMulti(segs, 3, nullptr));
      CK(cudaDeviceSynchronize());
      for (int i = 0; i < 3; ++i) {
        const auto a = y1[i]->Down(), b = y2[i]->Down();
        for (size_t j = 0; j < a.size(); ++j) ASSERT_EQ(a[j], b[j]) << "segment " << i << " elem " << j;
      }
    }
  }
}

TEST(Gemv, Epilogues) {
  for (GgmlType t : kTypes) {
    RunGemvCase({t, 129, 512, 1, GemvEpilogue::kAccumulate});
    RunGemvCase({t, 67, 1024, 3, GemvEpilogue::kSiluMul});
  }
}

TEST(Gemv, FallbackKNotMultipleOf256) {
  RunGemvCase({GgmlType::Q8_0, 45, 96, 2, GemvEpilogue::kStore});
  RunGemvCase({GgmlType::IQ4_NL, 33, 160, 1, GemvEpilogue::kAccumulate});
  RunGemvCase({GgmlType::F32, 19, 100, 3, GemvEpilogue::kStore});
  RunGemvCase({GgmlType::F16, 21, 50, 1, GemvEpilogue::kSiluMul});
}

TEST(Gemv, ModelShapes27B) {
  // ffn_up / ffn_down / attn_qkv / ssm_beta of the 27B model.
  RunGemvCase({GgmlType::Q6_K, 17408, 5120, 1, GemvEpilogue::kStore});
  RunGemvCase({GgmlType::Q6_K, 5120, 17408, 4, GemvEpilogue::kAccumulate});
  RunGemvCase({GgmlType::Q6_K, 10240, 5120, 8, GemvEpilogue::kStore});
  RunGemvCase({GgmlType::Q4_K, 48, 5120, 1, GemvEpilogue::kStore});
  RunGemvCase({GgmlType::Q8_0, 17408, 5120, 2, GemvEpilogue::kSiluMul});
}

// Benchmark (prints only): the 27B's ssm_beta + ssm_alpha (F32, 48 x 5120 each, one launch
// sharing the input) at decode widths: the GEMV in one launch of column groups (the backend's
// form to small_float_max_rows), the same in launches of up to 16 columns (how the backend
// called it to 32 rows before) and cuBLAS's f32 product per matrix (above 32 rows before).
TEST(GemvTiming, DISABLED_SmallF32Pair27B) {
  const int M = 48, K = 5120;
  Dev<uint8_t> wa(RandomWeights(GgmlType::F32, M, K)), wb(RandomWeights(GgmlType::F32, M, K));
  Dev<float> x(RandVec(static_cast<size_t>(64) * K, -1.f, 1.f));
  Dev<float> ya(static_cast<size_t>(64) * M), yb(static_cast<size_t>(64) * M);
  Dev<float> x_copy(static_cast<size_t>(64) * K);
  auto gemm = CublasGemm::Create();
  ASSERT_TRUE(gemm.ok());
  // Columns [c0, c0 + n) of both matrices in one GemvMulti.
  auto pair = [&](int c0, int n) {
    GemvArgs s[2];
    for (int i = 0; i < 2; ++i) {
      s[i].type = GgmlType::F32;
      s[i].w = i == 0 ? wb.p : wa.p;
      s[i].M = M;
      s[i].K = K;
      s[i].nc = n;
      s[i].x = x.p + static_cast<int64_t>(c0) * K;
      s[i].y = (i == 0 ? yb.p : ya.p) + static_cast<int64_t>(c0) * M;
    }
    return GemvMulti(s, 2, nullptr);
  };
  for (int nc : {1, 4, 8, 16, 24, 32, 33, 48, 64}) {
    const double grouped = MeanLaunchUs(3, 50, [&] { return pair(0, nc); });
    double by16 = -1;  // -1: not run (the backend took cuBLAS there)
    if (nc <= 32) {
      by16 = MeanLaunchUs(3, 50, [&]() -> absl::Status {
        for (int c0 = 0; c0 < nc; c0 += kGemvMaxCols) DS_RETURN_IF_ERROR(pair(c0, std::min(kGemvMaxCols, nc - c0)));
        return absl::OkStatus();
      });
    }
    const double lt = MeanLaunchUs(3, 50, [&]() -> absl::Status {
      DS_RETURN_IF_ERROR((*gemm)->RunF32(reinterpret_cast<const float*>(wb.p), x.p, yb.p, M, K, nc, M, 0.f, nullptr));
      return (*gemm)->RunF32(reinterpret_cast<const float*>(wa.p), x.p, ya.p, M, K, nc, M, 0.f, nullptr);
    });
    // The same launch with its weights cold (from HBM) and its activations in L2, as in a
    // decode step (the activations re-read by a copy after the flush).
    const double cold = MeanColdLaunchUs(
        20, [&] { return pair(0, nc); },
        [&] {
          CK(cudaMemcpy(x_copy.p, x.p, static_cast<size_t>(nc) * K * sizeof(float),
                        cudaMemcpyDeviceToDevice));
        });
    std::printf(
        "ssm_beta+ssm_alpha F32 %d x %d, %2d columns: one GEMV launch %6.1f us (L2 cold %6.1f us), "
        "launches of 16 %6.1f us, cuBLAS f32 x2 %6.1f us\n",
        M, K, nc, grouped, cold, by16, lt);
  }
  delete *gemm;
}

// ---------------------------------------------------------------------------------------------
// Tiled Q6_K (int8 tensor-core path, sm_80+) vs the CPU reference; the kernel against itself and
// the v2 GEMV: tiled_cuda_test.

TEST(Tiled, GemvOddShapesAllColumnCounts) {
  if (!HaveTiled()) GTEST_SKIP() << "tiled Q6_K needs sm_80+";
  for (int nc : {1, 2, 3, 7, 8, 9, 16, 17, 31, 33, 48, 64})
    RunGemvCase({GgmlType::Q6_K, 37, 768, nc, GemvEpilogue::kStore, true});
  for (int nc : {1, 5, 16, 40})
    RunGemvCase({GgmlType::Q6_K, 50, 1024, nc, GemvEpilogue::kAccumulate, true});
  for (int nc : {1, 4, 12, 32, 33, 64})
    RunGemvCase({GgmlType::Q6_K, 21, 512, nc, GemvEpilogue::kSiluMul, true});
}

TEST(Tiled, GemvModelShapes27B) {
  if (!HaveTiled()) GTEST_SKIP() << "tiled Q6_K needs sm_80+";
  RunGemvCase({GgmlType::Q6_K, 17408, 5120, 1, GemvEpilogue::kSiluMul, true});
  RunGemvCase({GgmlType::Q6_K, 5120, 17408, 16, GemvEpilogue::kAccumulate, true});
  RunGemvCase({GgmlType::Q6_K, 10240, 5120, 64, GemvEpilogue::kStore, true});
}

// ---------------------------------------------------------------------------------------------
// Dequant + cuBLAS GEMM

TEST(Dequant, MatchesCpuAllTypes) {
  for (GgmlType t : kTypes)
    for (int K : {256, 1280}) {
      const int rows = 23;
      auto w = RandomWeights(t, rows, K);
      Dev<uint8_t> dw(w);
      Dev<uint16_t> out(static_cast<size_t>(rows) * K);
      ASSERT_OK(DequantizeRows(t, dw.p, rows, K, out.p, /*bf16=*/true, nullptr));
      const auto got = out.Down();
      const auto ref = DequantAll(t, w, rows, K);
      int bad = 0;
      // Exact bf16 of the reference, or one bf16 step away when the f32 products round
      // differently (d*sc*q evaluated in another order) right at a bf16 rounding boundary.
      for (size_t i = 0; i < ref.size(); ++i)
        if (got[i] != F32ToBf16(ref[i]) &&
            !(std::fabs(Bf16ToF32(got[i]) - ref[i]) <= std::fabs(ref[i]) * (1.f / 128)) && bad++ < 5)
          ADD_FAILURE() << GgmlInfo(t).name << " elem " << i << ": " << Bf16ToF32(got[i]) << " vs " << ref[i];
      EXPECT_EQ(bad, 0) << GgmlInfo(t).name;
    }
}

TEST(Gemm, CublasBf16MatchesCpu) {
  const int M = 300, K = 512, T = 70;
  auto w = RandomWeights(GgmlType::Q6_K, M, K);
  auto x = RandVec(static_cast<size_t>(T) * K, -2.f, 2.f);
  auto y0 = RandVec(static_cast<size_t>(T) * M, -1.f, 1.f);
  Dev<uint8_t> dw(w);
  Dev<uint16_t> wh(static_cast<size_t>(M) * K), xh(static_cast<size_t>(T) * K);
  Dev<float> dx(x), dy(y0);
  auto gemm_or = CublasGemm::Create();
  ASSERT_TRUE(gemm_or.ok());
  std::unique_ptr<CublasGemm> gemm(*gemm_or);
  ASSERT_OK(DequantizeRows(GgmlType::Q6_K, dw.p, M, K, wh.p, true, nullptr));
  ASSERT_OK(ConvertF32ToHalf(dx.p, static_cast<int64_t>(T) * K, xh.p, true, nullptr));
  ASSERT_OK(gemm->Run(wh.p, xh.p, dy.p, M, K, T, M, true, /*beta=*/1.f, nullptr));
  const auto y = dy.Down();
  const auto W = DequantAll(GgmlType::Q6_K, w, M, K);
  double num = 0, den = 0;
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < M; ++r) {
      double ref = y0[static_cast<size_t>(t) * M + r];
      for (int i = 0; i < K; ++i) ref += double(W[static_cast<size_t>(r) * K + i]) * x[static_cast<size_t>(t) * K + i];
      const double d = y[static_cast<size_t>(t) * M + r] - ref;
      ASSERT_FALSE(std::isnan(y[static_cast<size_t>(t) * M + r]));
      num += d * d;
      den += ref * ref;
    }
  const double rel = std::sqrt(num / den);
  std::printf("  gemm bf16 rel err %.2e\n", rel);
  EXPECT_LT(rel, 1e-2);
}

// ---------------------------------------------------------------------------------------------
// Norm, embedding, element-wise, argmax

// Widths: one pass of the wide kernel (5120), several (17408 + 32: 2177 groups over 1024
// threads), a partial warp (40), an odd width and a row stride that is not a multiple of 4
// (both take the scalar kernel).
TEST(Ops, RmsNormRowsWithRowPick) {
  for (auto [n, ldx] : std::vector<std::pair<int, int>>{{5120, 5120}, {17440, 17440}, {40, 40}, {100, 100}, {96, 98}}) {
    const int T = 5;
    auto x = RandVec(static_cast<size_t>(T) * ldx, -3.f, 3.f);
    auto w = RandVec(n, 0.5f, 1.5f);
    std::vector<int32_t> rows = {4, 0, 2};
    Dev<float> dx(x), dw(w), out(rows.size() * n);
    Dev<int32_t> dr(rows);
    ASSERT_OK(RmsNormRows(dx.p, ldx, dr.p, dw.p, out.p, 3, n, 1e-6f, nullptr));
    const auto got = out.Down();
    std::vector<float> ref(n);
    for (int i = 0; i < 3; ++i) {
      cpu::RmsNorm(x.data() + static_cast<size_t>(rows[i]) * ldx, w.data(), n, 1e-6f, ref.data());
      for (int j = 0; j < n; ++j)
        ASSERT_NEAR(got[static_cast<size_t>(i) * n + j], ref[j], 1e-4f * (1 + std::fabs(ref[j]))) << "n " << n << " row " << i << " elem " << j;
    }
  }
}

TEST(Ops, RmsNormQuantizeMatchesCpu) {
  for (int n : {5120 + 32, 17408 + 32, 64}) {
    const int T = 3;
    auto x = RandVec(static_cast<size_t>(T) * n, -3.f, 3.f);
    x[7] = 40.f;  // one outlier block: its scale is set by the outlier
    auto w = RandVec(n, 0.5f, 1.5f);
    Dev<float> dx(x), dw(w), out(static_cast<size_t>(T) * n), xd(static_cast<size_t>(T) * n / 32);
    Dev<int8_t> xq(static_cast<size_t>(T) * n);
    ASSERT_OK(RmsNormQuantize(dx.p, dw.p, out.p, xq.p, xd.p, T, n, 1e-6f, nullptr));
    const auto got = out.Down();
    const auto gq = xq.Down();
    const auto gd = xd.Down();
    std::vector<float> ref(n);
    for (int t = 0; t < T; ++t) {
      cpu::RmsNorm(x.data() + static_cast<size_t>(t) * n, w.data(), n, 1e-6f, ref.data());
      for (int b = 0; b < n / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(ref[b * 32 + j]));
        const float d = gd[static_cast<size_t>(t) * n / 32 + b];
        ASSERT_NEAR(d, amax / 127.f, 1e-5f * (1 + amax)) << "n " << n << " row " << t << " block " << b;
        for (int j = 0; j < 32; ++j) {
          const size_t i = static_cast<size_t>(t) * n + b * 32 + j;
          ASSERT_NEAR(got[i], ref[b * 32 + j], 1e-4f * (1 + std::fabs(ref[b * 32 + j])));
          ASSERT_LE(std::fabs(gq[i] * d - ref[b * 32 + j]), 0.51f * d + 1e-6f) << "n " << n << " elem " << i;
        }
      }
    }
  }
  // Misaligned buffers are refused, not read with a faulting float4 load.
  Dev<float> a(64 * 2), wv(64), o(64);
  Dev<int8_t> q(64);
  Dev<float> d(2);
  EXPECT_FALSE(RmsNormQuantize(a.p + 1, wv.p, o.p, q.p, d.p, 1, 64, 1e-6f, nullptr).ok());
}

TEST(Ops, EmbedRows) {
  for (GgmlType t : {GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16, GgmlType::F32}) {
    const int vocab = 77, n = 512;
    auto w = RandomWeights(t, vocab, n);
    std::vector<int32_t> ids = {76, 0, 13, 13, 41};
    Dev<uint8_t> dw(w);
    Dev<int32_t> did(ids);
    Dev<float> out(ids.size() * n);
    ASSERT_OK(EmbedRows(t, dw.p, n, did.p, static_cast<int>(ids.size()), out.p, nullptr));
    const auto got = out.Down();
    const auto W = DequantAll(t, w, vocab, n);
    for (size_t i = 0; i < ids.size(); ++i)
      for (int j = 0; j < n; ++j)
        ASSERT_NEAR(got[i * n + j], W[static_cast<size_t>(ids[i]) * n + j], 1e-6f * (1 + std::fabs(W[static_cast<size_t>(ids[i]) * n + j])));
  }
}

// Ids below zero name their token in chain_ids (an MTP verify's drafts where the draft chain
// left them): the same rows as the resolved ids, both kernels (n % 256), and a shard.
TEST(Ops, EmbedRowsChainIds) {
  for (GgmlType t : {GgmlType::Q6_K, GgmlType::F16, GgmlType::F32}) {
    for (int n : {512, 96}) {
      if (n % 256 != 0 && t == GgmlType::Q6_K) continue;
      const int vocab = 77;
      auto w = RandomWeights(t, vocab, n);
      const std::vector<int32_t> chain = {5, 60, 33, 76, 0, 18};
      const std::vector<int32_t> ids = {12, -3, -1, 40, -6, -4};
      std::vector<int32_t> resolved;
      for (int32_t id : ids) resolved.push_back(id < 0 ? chain[-id - 1] : id);
      Dev<uint8_t> dw(w);
      Dev<int32_t> did(ids), dchain(chain);
      const auto W = DequantAll(t, w, vocab, n);
      for (auto [v0, v1] : {std::pair<int, int>{0, -1}, {30, 70}}) {
        const uint64_t rb = GgmlRowBytes(t, n);
        std::vector<uint8_t> shard =
            v1 < 0 ? w : std::vector<uint8_t>(w.begin() + v0 * rb, w.begin() + v1 * rb);
        Dev<uint8_t> ds(shard);
        Dev<float> out(ids.size() * n);
        ASSERT_OK(EmbedRows(t, ds.p, n, did.p, static_cast<int>(ids.size()), out.p, nullptr, v0, v1,
                            dchain.p));
        const auto got = out.Down();
        for (size_t i = 0; i < ids.size(); ++i) {
          const bool mine = v1 < 0 || (resolved[i] >= v0 && resolved[i] < v1);
          for (int j = 0; j < n; ++j) {
            const float want = mine ? W[static_cast<size_t>(resolved[i]) * n + j] : 0.f;
            ASSERT_NEAR(got[i * n + j], want, 1e-6f * (1 + std::fabs(want)))
                << GgmlInfo(t).name << " n " << n << " id " << ids[i] << " shard " << v0;
          }
        }
      }
    }
  }
}

// Vocab-parallel shard: the table holds rows [v0, v1) only; other ids give zero rows (the TP
// all-reduce adds the owner's row to them), both the unit and the element kernels (n % 256).
TEST(Ops, EmbedRowsVocabShard) {
  for (GgmlType t : {GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F32}) {
    for (int n : {512, 96}) {
      if (n % 256 != 0 && t == GgmlType::Q6_K) continue;  // K-quant rows are whole 256-blocks
      const int vocab = 77, v0 = 30, v1 = 50;
      auto w = RandomWeights(t, vocab, n);
      const uint64_t rb = GgmlRowBytes(t, n);
      std::vector<uint8_t> shard(w.begin() + v0 * rb, w.begin() + v1 * rb);
      std::vector<int32_t> ids = {76, 30, 49, 50, 0, 41, 29};
      Dev<uint8_t> dw(shard);
      Dev<int32_t> did(ids);
      Dev<float> out(ids.size() * n);
      ASSERT_OK(EmbedRows(t, dw.p, n, did.p, static_cast<int>(ids.size()), out.p, nullptr, v0, v1));
      const auto got = out.Down();
      const auto W = DequantAll(t, w, vocab, n);
      for (size_t i = 0; i < ids.size(); ++i) {
        const bool mine = ids[i] >= v0 && ids[i] < v1;
        for (int j = 0; j < n; ++j) {
          const float want = mine ? W[static_cast<size_t>(ids[i]) * n + j] : 0.f;
          ASSERT_NEAR(got[i * n + j], want, 1e-6f * (1 + std::fabs(want)))
              << GgmlInfo(t).name << " n " << n << " id " << ids[i];
        }
      }
    }
  }
}

TEST(Ops, SiluMulAndGate) {
  const int T = 3, nh = 4, hd = 64;
  auto g = RandVec(1000, -6.f, 6.f), u = RandVec(1000, -2.f, 2.f);
  Dev<float> dg(g), du(u), o(1000);
  ASSERT_OK(SiluMul(dg.p, du.p, o.p, 1000, nullptr));
  auto got = o.Down();
  for (int i = 0; i < 1000; ++i) ASSERT_NEAR(got[i], cpu::Silu(g[i]) * u[i], 1e-5f);
  auto qg = RandVec(static_cast<size_t>(T) * nh * 2 * hd, -4.f, 4.f);
  auto ov = RandVec(static_cast<size_t>(T) * nh * hd, -1.f, 1.f);
  Dev<float> dqg(qg), dov(ov);
  ASSERT_OK(SigmoidGateMul(dov.p, dqg.p, T, nh, hd, nullptr));
  got = dov.Down();
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nh; ++h)
      for (int d = 0; d < hd; ++d) {
        const size_t i = (static_cast<size_t>(t) * nh + h) * hd + d;
        ASSERT_NEAR(got[i], ov[i] * cpu::Sigmoid(qg[(static_cast<size_t>(t) * nh + h) * 2 * hd + hd + d]), 1e-5f);
      }
}

TEST(Ops, ArgmaxKnownAnswer) {
  const int n = 248320, rows = 3;
  auto l = RandVec(static_cast<size_t>(rows) * n, -10.f, 10.f);
  l[0 * n + 248319] = 50.f;                 // last element
  l[1 * n + 7] = 40.f;                      // tie: lowest index wins
  l[1 * n + 9000] = 40.f;
  l[2 * n + 123456] = 30.f;
  l[2 * n + 5] = std::nanf("");             // NaN ignored
  Dev<float> dl(l);
  Dev<int32_t> out(rows);
  Dev<float> value(rows * kArgmaxParts);
  Dev<int32_t> index(rows * kArgmaxParts);
  Dev<uint32_t> tickets(rows);
  CK(cudaMemset(tickets.p, 0, rows * sizeof(uint32_t)));
  ASSERT_OK(ArgmaxSplitRows(dl.p, n, rows, n, ArgmaxScratch{value.p, index.p, tickets.p, rows},
                            out.p, nullptr));
  const auto got = out.Down();
  EXPECT_EQ(got[0], 248319);
  EXPECT_EQ(got[1], 7);
  EXPECT_EQ(got[2], 123456);
}

// ---------------------------------------------------------------------------------------------
// Attention: QkvPrep + prefill (cuBLAS) + decode (split-K) vs cpu::GatedAttention.

void RunAttnCase(int n_head, int n_kv, int hd, int n_rot, int T_prefill, int n_decode, int page,
                 int n_splits) {
  SCOPED_TRACE(::testing::Message() << "heads " << n_head << "/" << n_kv << " hd " << hd << " T " << T_prefill);
  AttnShape s{n_head, n_kv, hd, n_rot, 1e7f, 1e-6f};
  const int max_len = T_prefill + n_decode, n_slots = 2, slot = 1;
  const int max_pages = (max_len + page - 1) / page;
  // Pages of slot 1 are handed out in reverse order to exercise the block table.
  std::vector<int32_t> table(static_cast<size_t>(n_slots) * max_pages);
  for (int i = 0; i < max_pages; ++i) {
    table[i] = max_pages + i;
    table[max_pages + i] = max_pages - 1 - i;
  }
  const int n_pages = n_slots * max_pages;
  const size_t kv_elems = static_cast<size_t>(n_pages) * page * n_kv * hd;
  Dev<uint16_t> kc(kv_elems), vc(kv_elems);
  Dev<int32_t> dtable(table);
  KvCacheView kv{kc.p, vc.p, dtable.p, page, max_pages, n_kv, hd};
  auto qn = RandVec(hd, 0.5f, 1.5f), kn = RandVec(hd, 0.5f, 1.5f);
  Dev<float> dqn(qn), dkn(kn);
  std::vector<float> cpu_k(static_cast<size_t>(max_len) * n_kv * hd), cpu_v(cpu_k.size());
  const int qgw = n_head * 2 * hd, kvw = n_kv * hd, ow = n_head * hd;
  auto compare = [&](const std::vector<float>& got, const std::vector<float>& ref, const char* what) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << what << " NaN at " << i;
      num += double(got[i] - ref[i]) * (got[i] - ref[i]);
      den += double(ref[i]) * ref[i];
    }
    const double rel = std::sqrt(num / den);
    std::printf("  attn %-8s rel %.2e\n", what, rel);
    EXPECT_LT(rel, 5e-3) << what;  // f16 K/V/Q and probabilities
  };
  auto cpu_run = [&](int T, int pos0, const std::vector<float>& qg, const std::vector<float>& k,
                     const std::vector<float>& v) {
    std::vector<float> out(static_cast<size_t>(T) * ow);
    cpu::AttnArgs c;
    c.n_head = n_head; c.n_head_kv = n_kv; c.head_dim = hd; c.n_rot = n_rot; c.rope_base = 1e7f;
    c.eps = 1e-6f; c.T = T; c.pos0 = pos0; c.qg = qg.data(); c.k = k.data(); c.v = v.data();
    c.q_norm = qn.data(); c.k_norm = kn.data(); c.k_cache = cpu_k.data(); c.v_cache = cpu_v.data();
    c.out = out.data();
    cpu::GatedAttention(c);
    return out;
  };
  auto gemm_or = CublasGemm::Create();
  ASSERT_TRUE(gemm_or.ok());
  std::unique_ptr<CublasGemm> gemm(*gemm_or);
  int pos = 0;
  if (T_prefill > 0) {
    const int T = T_prefill;
    auto qg = RandVec(static_cast<size_t>(T) * qgw, -2.f, 2.f), k = RandVec(static_cast<size_t>(T) * kvw, -2.f, 2.f),
         v = RandVec(static_cast<size_t>(T) * kvw, -2.f, 2.f);
    std::vector<int32_t> tslot(T, slot), tpos(T);
    for (int t = 0; t < T; ++t) tpos[t] = t;
    Dev<float> dqg(qg), dk(k), dv(v), q(static_cast<size_t>(T) * ow), out(static_cast<size_t>(T) * ow);
    Dev<uint16_t> q16(static_cast<size_t>(T) * ow);
    Dev<int32_t> ds(tslot), dp(tpos);
    QkvPrepArgs pa;
    pa.shape = s; pa.T = T; pa.tok_slot = ds.p; pa.tok_pos = dp.p; pa.qg = dqg.p; pa.k = dk.p; pa.v = dv.p;
    pa.q_norm = dqn.p; pa.k_norm = dkn.p; pa.q_out = q.p; pa.q16 = q16.p; pa.kv = kv;
    ASSERT_OK(QkvPrep(pa, nullptr));
    const int G = n_head / n_kv, tq = 48;
    Dev<uint16_t> kt(static_cast<size_t>(T) * kvw), vt(static_cast<size_t>(T) * kvw), probs(static_cast<size_t>(G) * tq * T);
    Dev<float> scores(static_cast<size_t>(G) * tq * T);
    AttnPrefillArgs a;
    a.shape = s; a.T = T; a.pos0 = 0; a.slot = slot; a.q16 = q16.p; a.qg = dqg.p; a.kv = kv;
    a.k_tmp = kt.p; a.v_tmp = vt.p; a.scores = scores.p; a.probs = probs.p; a.tq = tq; a.out = out.p;
    ASSERT_OK(AttnPrefill(a, gemm.get(), nullptr));
    compare(out.Down(), cpu_run(T, 0, qg, k, v), "prefill");
    pos = T;
  }
  for (int step = 0; step < n_decode; ++step, ++pos) {
    // Two rows: row 0 is a dummy sequence in slot 0 at position 0, row 1 the tracked one.
    auto qg = RandVec(static_cast<size_t>(2) * qgw, -2.f, 2.f), k = RandVec(static_cast<size_t>(2) * kvw, -2.f, 2.f),
         v = RandVec(static_cast<size_t>(2) * kvw, -2.f, 2.f);
    Dev<float> dqg(qg), dk(k), dv(v), q(static_cast<size_t>(2) * ow), out(static_cast<size_t>(2) * ow);
    Dev<int32_t> ds(std::vector<int32_t>{0, slot}), dp(std::vector<int32_t>{0, pos}), rows(std::vector<int32_t>{0, 1});
    QkvPrepArgs pa;
    pa.shape = s; pa.T = 2; pa.tok_slot = ds.p; pa.tok_pos = dp.p; pa.qg = dqg.p; pa.k = dk.p; pa.v = dv.p;
    pa.q_norm = dqn.p; pa.k_norm = dkn.p; pa.q_out = q.p; pa.kv = kv;
    ASSERT_OK(QkvPrep(pa, nullptr));
    Dev<float> parts(AttnDecodePartialFloats(s, 2, n_splits));
    AttnDecodeArgs a;
    a.shape = s; a.n_seqs = 2; a.rows = rows.p; a.slots = ds.p; a.pos = dp.p; a.q = q.p; a.qg = dqg.p;
    a.kv = kv; a.n_splits = n_splits; a.partials = parts.p; a.out = out.p;
    ASSERT_OK(AttnDecode(a, nullptr));
    const auto all = out.Down();
    std::vector<float> qg1(qg.begin() + qgw, qg.end()), k1(k.begin() + kvw, k.end()), v1(v.begin() + kvw, v.end());
    compare(std::vector<float>(all.begin() + ow, all.end()), cpu_run(1, pos, qg1, k1, v1), "decode");
  }
}

TEST(Attention, Small) { RunAttnCase(4, 2, 64, 16, 53, 3, 16, 3); }
TEST(Attention, Shape27B) { RunAttnCase(24, 4, 256, 64, 300, 2, 64, 5); }
TEST(Attention, DecodeOnlyManySplits) { RunAttnCase(6, 1, 128, 32, 0, 4, 16, 9); }
// hd = 32 (tiny models), a group of 3 run by the 4-wide kernel, and a context long enough that
// all 9 splits are used with a prefetch tail (709 = 9 x 78 + 7).
TEST(Attention, TinyHeadOddGroupLongSplits) {
  RunAttnCase(4, 2, 32, 8, 53, 3, 16, 3);
  RunAttnCase(6, 2, 64, 16, 130, 2, 16, 4);
  RunAttnCase(6, 1, 128, 32, 709, 2, 64, 9);
}

}  // namespace
}  // namespace ds::cuda
