// The coarse draft head (kernels/cuda/draft_head.cuh) against its CPU reference
// (kernels/cpu/draft_head_ref.h): the copy made from the tiled Q6_K layout and its one-column
// matmul, bit for bit with the kernel-order reference, within f32 rounding of the exact product,
// launched plainly and early. Needs a GPU of sm_80+.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/draft_head_ref.h"
#include "kernels/cuda/draft_head.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/weights_test_util.h"

namespace ds::cuda {
namespace {

TEST(CoarseDraftHead, MatchesTheCpuReference) {
  if (!HaveTiled()) GTEST_SKIP() << "tiled Q6_K needs sm_80+";
  std::mt19937 rng(99);
  const GgmlType t = GgmlType::Q6_K;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const int K : {256, 1024, 5120}) {
    const int M = 1000;  // a partial last tile
    const auto raw = RandomWeights(rng, t, M, K);
    Dev<uint8_t> draw(raw);
    Dev<uint8_t> tiled = TileOnDevice(t, draw, M, K);
    ASSERT_EQ(CoarseBytes(M, K), static_cast<uint64_t>(63) * (K / 256) * kCoarseUnitBytes);
    Dev<uint8_t> coarse(CoarseBytes(M, K));
    ASSERT_OK(CoarsenTiled(tiled.p, M, K, coarse.p, stream));
    auto x = RandVec(rng, K, -1.f, 1.f);
    for (int i = 0; i < K; i += 61) x[i] *= 30.f;  // outliers: blocks with a large scale
    Dev<float> dx(x);
    Dev<int8_t> dxq(K);
    Dev<float> dxd(K / 32);
    ASSERT_OK(QuantizeActivations(dx.p, 1, K, dxq.p, dxd.p, stream));
    for (const bool early : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "K=" << K << " early=" << early);
      Dev<float> y(M);
      ASSERT_OK(CoarseGemv(coarse.p, M, K, dxq.p, dxd.p, y.p, stream, early));
      CK(cudaStreamSynchronize(stream));
      const auto got = y.Down();
      const auto xq = dxq.Down();
      const auto xd = dxd.Down();
      const uint64_t rb = GgmlRowBytes(t, K);
      int differ = 0;
      for (int r = 0; r < M; ++r) {
        const uint8_t* row = raw.data() + r * rb;
        const float want = cpu::CoarseDotQ6KKernelOrder(row, xq.data(), xd.data(), K);
        if (std::memcmp(&want, &got[r], sizeof(float)) != 0 && differ++ < 5)
          ADD_FAILURE() << "row " << r << ": " << got[r] << " vs the kernel-order reference "
                        << want;
        double abs = 0;
        const double exact = cpu::CoarseDotQ6K(row, xq.data(), xd.data(), K, &abs);
        EXPECT_NEAR(got[r], exact, 1e-5 * abs + 1e-30) << "row " << r;
      }
      EXPECT_EQ(differ, 0);
    }
  }
  CK(cudaStreamDestroy(stream));
}

TEST(CoarseDraftHead, RejectsBadArguments) {
  alignas(16) static float xd[8];
  static int8_t xq[256];
  EXPECT_EQ(CoarseBytes(16, 300), 0u);
  EXPECT_FALSE(CoarsenTiled(xq, 16, 300, xq, nullptr).ok());
  EXPECT_FALSE(CoarseGemv(xq, 16, 256, xq, xd + 1, xd, nullptr).ok());  // xd not 16-byte aligned
  EXPECT_FALSE(CoarseGemv(nullptr, 16, 256, xq, xd, xd, nullptr).ok());
}

}  // namespace
}  // namespace ds::cuda
