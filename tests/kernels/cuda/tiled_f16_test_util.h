// Shared helpers of the tests of the f16 tensor-core kernel (tiled_f16_cuda_test: Q6_K,
// tiled_formats_cuda_test: Q4_K / Q5_K): activations that stress the per-column f16 scaling, the
// K-split scratch as the backend allocates it, and the check of a launch's outputs against the
// kernel's exact CPU reference and the f32 product of the dequantized rows.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/tiled_f16.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace ds::cuda {

// nc columns of K activations with outliers, one all-zero 256-block per column, and columns of
// very different magnitude (2^-20 .. 2^20: the per-column scale must follow them); `offset`
// (times the column's magnitude) shifts every third column off zero mean, which a minimum term
// (Q4_K / Q5_K) turns into large sub-block sums.
inline std::vector<float> RandomHalfActs(std::mt19937& rng, int nc, int K, float offset = 0.f) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> pick(0, K - 1);
  std::vector<float> x(static_cast<size_t>(nc) * K);
  for (auto& v : x) v = u(rng);
  for (int c = 0; c < nc; ++c) {
    float* col = x.data() + static_cast<size_t>(c) * K;
    const float mag = std::ldexp(1.f, (c * 7) % 41 - 20);
    const float shift = c % 3 == 0 ? offset * mag : 0.f;
    for (int k = 0; k < K; ++k) col[k] = col[k] * mag + shift;
    for (int i = 0; i < K / 64; ++i) col[pick(rng)] *= 40.f;
    std::fill_n(col + 256 * (c % (K / 256)), 256, 0.f);
  }
  return x;
}

// The device scratch of the K-split launches, as the backend allocates it (cluster_split: the
// sm_90 reduction through clusters, or the scratch's ticket path).
struct F16Scratch {
  Dev<float> partial{static_cast<size_t>(TiledF16PartialFloats(kTiledF16MaxCols))};
  Dev<int> tickets{static_cast<size_t>(TiledF16Tickets())};
  F16Scratch() { CK(cudaMemset(tickets.p, 0, tickets.n * 4)); }
  // warpgroup: the wgmma form, which reads activations in its own order (ToWarpgroupOrder).
  // tail_split: TiledF16Scratch::tail_split, on here as in the worker (CudaBackendOptions::
  // f16_tail_split), so that the tests cover that path.
  TiledF16Scratch get(bool cluster_split = true, bool warpgroup = false, bool tail_split = true) const {
    return {partial.p, static_cast<int64_t>(partial.n), tickets.p, static_cast<int>(tickets.n),
            cluster_split, warpgroup, tail_split, split_override, split_cost};
  }
  int split_override = 0;          // TiledF16Scratch::split_override
  double split_cost = kSplitCost;  // TiledF16Scratch::split_cost
};

// Whether the wgmma form runs here (sm_90a code on an sm_90 GPU).
inline bool HaveWgmma() { return TiledF16WgmmaAvailable(); }

// Plain f16 rows of K values in the wgmma form's order (half_rows.cuh, StoreHalf4): within each
// 16-element group the pairs at 0, 4, 8, 12, then those at 2, 6, 10, 14. Written here from the
// definition, so that the device's own permutation (HalfActivations) is checked against it.
inline std::vector<uint16_t> WarpgroupOrder(const std::vector<uint16_t>& xh) {
  std::vector<uint16_t> out(xh.size());
  for (size_t g = 0; g + 16 <= xh.size(); g += 16)
    for (int p = 0; p < 8; ++p) {  // pair p of the group: elements 2p, 2p + 1
      const int to = p % 2 == 0 ? p / 2 : 4 + p / 2;
      out[g + 2 * to] = xh[g + 2 * p];
      out[g + 2 * to + 1] = xh[g + 2 * p + 1];
    }
  return out;
}
inline Dev<uint16_t> ToWarpgroupOrder(const Dev<uint16_t>& xh) {
  return Dev<uint16_t>(WarpgroupOrder(xh.Down()));
}

// A TiledF16Multi launch's arguments (w2 only for the pair; xhs: Q4_K / Q5_K's sub-block sums).
inline GemvArgs F16LaunchArgs(GgmlType type, const void* w, const void* w2, int M, int K, int nc,
                              const uint16_t* xh, const float* xs, const uint16_t* xhs, float* y,
                              GemvEpilogue ep) {
  GemvArgs a;
  a.type = type;
  a.w = w;
  a.w2 = ep == GemvEpilogue::kSiluMul ? w2 : nullptr;
  a.M = M;
  a.K = K;
  a.nc = nc;
  a.xh = xh;
  a.xs = xs;
  a.xhs = xhs;
  a.y = y;
  a.epilogue = ep;
  return a;
}

// One (row, column) of one matrix: the kernel's exact CPU reference times the column's scale and
// its sum of |terms|; the f32 product of the dequantized row with the f32 activations and its
// sum of |terms|; and the sum of |terms| that f16 rounding (2^-11 each) applies to.
struct RefDots {
  double exact = 0, abs = 0, f32 = 0, f32_abs = 0, rounded_abs = 0;
};

// Checks the outputs of one launch (got[col * M + r]; y0: the outputs before it, for
// kAccumulate) at rows 0, row_step, 2 row_step, ... of every column: within 3e-5 of sum |terms| of
// the exact reference (f32 tensor-core sums, the per-unit fmas, the K split's adds) and within
// 1.05 * 2^-10 of rounded_abs (plus that) of the f32 product; the pair as silu(gate) * up with
// both bounds carried through. dots(m, r, col): RefDots of matrix m (1: the pair's up matrix).
template <class Dots>
void ExpectWithinReferences(const char* label, int M, int nc, GemvEpilogue ep, int row_step,
                            const std::vector<float>& y0, const std::vector<float>& got,
                            Dots&& dots) {
  const bool pair = ep == GemvEpilogue::kSiluMul;
  const double r16 = 1.05 * std::ldexp(1.0, -10);
  int bad = 0, bad_f32 = 0, checked = 0;
  double worst = 0, worst_f32 = 0;
  for (int col = 0; col < nc; ++col)
    for (int r = 0; r < M; r += row_step) {
      const RefDots d1 = dots(0, r, col);
      const size_t o = static_cast<size_t>(col) * M + r;
      double expect = d1.exact, tol = 3e-5 * d1.abs + 1e-30;
      double expect32 = d1.f32, tol32 = r16 * d1.rounded_abs + tol + 1e-30;
      if (pair) {
        const RefDots d2 = dots(1, r, col);
        auto silu = [](double v) { return v / (1 + std::exp(-v)); };
        expect = silu(d1.exact) * d2.exact;
        tol = (std::fabs(d2.exact) * 1.1 * tol + std::fabs(silu(d1.exact)) * 3e-5 * d2.abs) * 1.5 +
              1e-6 * std::fabs(expect) + 1e-30;
        expect32 = silu(d1.f32) * d2.f32;
        const double t1 = r16 * d1.rounded_abs + 3e-5 * d1.abs,
                     t2 = r16 * d2.rounded_abs + 3e-5 * d2.abs;
        tol32 = (std::fabs(d2.f32) * 1.1 * t1 + (std::fabs(silu(d1.f32)) + t1) * t2) * 1.5 +
                1e-6 * std::fabs(expect32) + 1e-30;
      } else if (ep == GemvEpilogue::kAccumulate) {
        expect += y0[o];
        expect32 += y0[o];
        tol += 1e-7 * std::fabs(y0[o]);
        tol32 += 1e-7 * std::fabs(y0[o]);
      }
      const double err = std::fabs(got[o] - expect), err32 = std::fabs(got[o] - expect32);
      worst = std::max(worst, err / tol);
      worst_f32 = std::max(worst_f32, err32 / tol32);
      ++checked;
      if (!(err <= tol) && bad++ < 5)
        ADD_FAILURE() << "vs the f16 reference: row " << r << " col " << col << " got " << got[o]
                      << " want " << expect << " tol " << tol;
      if (!(err32 <= tol32) && bad_f32++ < 5)
        ADD_FAILURE() << "vs the f32 product: row " << r << " col " << col << " got " << got[o]
                      << " want " << expect32 << " tol " << tol32;
    }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(bad_f32, 0);
  std::printf("  %s M=%6d nc=%2d ep=%d: %d outputs, max err/tol %.3f (f16 ref) %.3f (f32)\n", label,
              M, nc, static_cast<int>(ep), checked, worst, worst_f32);
}

}  // namespace ds::cuda
