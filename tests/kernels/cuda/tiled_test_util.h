// Shared helpers of the tests of the kernels on tiled Q6_K (mmq_cuda_test, tiled_f16_cuda_test):
// random raw Q6_K rows, their tiled copy, the 27B matrices and the timing loop of the kernel
// tables (weight copies rotated so that L2 does not hold them).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "common/util/half.h"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace ds::cuda {

inline bool HaveTiled() {
  int dev = 0;
  cudaGetDevice(&dev);
  return TiledAvailable(dev);
}

// Random raw Q6_K rows: every quant and scale bit pattern, f16 d uniform in [d_lo, d_hi).
inline std::vector<uint8_t> RandomQ6KRows(std::mt19937& rng, int64_t rows, int K, float d_lo,
                                          float d_hi) {
  std::vector<uint8_t> w(rows * GgmlRowBytes(GgmlType::Q6_K, K));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(d_lo, d_hi);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  for (size_t off = 0; off < w.size(); off += 210) {
    const uint16_t d = F32ToF16(sc(rng));
    std::memcpy(&w[off + 208], &d, 2);
  }
  return w;
}

inline Dev<uint8_t> TileQ6K(const Dev<uint8_t>& raw, int M, int K) {
  Dev<uint8_t> t(TiledBytes(GgmlType::Q6_K, M, K));
  EXPECT_TRUE(TileRows(GgmlType::Q6_K, raw.p, 0, M, K, t.p, nullptr).ok());
  return t;
}

// The 27B matrices the kernel tables time, with their epilogues.
struct Matrix27B {
  const char* name;
  int M, K;
  GemvEpilogue ep;
};
inline constexpr Matrix27B k27BMatrices[] = {{"ffn_gate+up", 17408, 5120, GemvEpilogue::kSiluMul},
                                             {"ffn_down", 5120, 17408, GemvEpilogue::kAccumulate},
                                             {"gdn_qkv", 10240, 5120, GemvEpilogue::kStore},
                                             {"attn_q+gate", 12288, 5120, GemvEpilogue::kStore},
                                             {"ssm_out", 5120, 6144, GemvEpilogue::kAccumulate}};

// Copies of one random tiled matrix (two per copy for the pair), >= 256 MiB in all.
struct RotatingTiled {
  static int CopiesFor(uint64_t tb, bool pair) {
    return std::max<int>(2, static_cast<int>((256ull << 20) / (tb * (pair ? 2 : 1))) + 1);
  }
  uint64_t tb;
  bool pair;
  int copies;
  Dev<uint8_t> all;
  RotatingTiled(std::mt19937& rng, const Matrix27B& m)
      : tb(TiledBytes(GgmlType::Q6_K, m.M, m.K)),
        pair(m.ep == GemvEpilogue::kSiluMul),
        copies(CopiesFor(tb, pair)),
        all(tb * copies * (pair ? 2 : 1)) {
    Dev<uint8_t> raw(RandomQ6KRows(rng, m.M, m.K, 2e-4f, 4e-3f));
    Dev<uint8_t> t0 = TileQ6K(raw, m.M, m.K);
    for (int i = 0; i < copies * (pair ? 2 : 1); ++i)
      CK(cudaMemcpy(all.p + i * tb, t0.p, tb, cudaMemcpyDeviceToDevice));
  }
  // GemvArgs of copy `rep % copies` (w, w2, shape, epilogue); the caller adds the activations.
  GemvArgs Args(const Matrix27B& m, int rep, int nc, float* y) const {
    const int i = rep % copies;
    GemvArgs a;
    a.type = GgmlType::Q6_K;
    a.w = all.p + tb * i * (pair ? 2 : 1);
    a.w2 = pair ? all.p + tb * (i * 2 + 1) : nullptr;
    a.M = m.M;
    a.K = m.K;
    a.nc = nc;
    a.y = y;
    a.epilogue = m.ep;
    return a;
  }
};

// Median microseconds of launch(rep) over 15 timed runs after 3 warm-up runs.
template <typename Launch>
double MedianLaunchUs(Launch&& launch) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int rep = 0; rep < 3 + 15; ++rep) {
    CK(cudaEventRecord(e0));
    EXPECT_TRUE(launch(rep).ok());
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (rep >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return 1000.0 * ms[ms.size() / 2];
}

}  // namespace ds::cuda
