// GdnDecode's two launch forms (kernels/cuda/gdn.cu): launches of many blocks (heads x
// sequences >= 256) run the kernel compiled for two blocks per SM (registers capped, a few
// spilled), small ones the unspilled form that kernels_cuda_test checks against the CPU. The
// arithmetic is the same: a batch of 8 sequences of the 27B's GDN shape (48 heads: 384 blocks) in
// one launch gives outputs, states and conv rows bit-identical to the 8 sequences launched one
// by one (48 blocks each), over several steps. Needs a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/gdn.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace ds::cuda {
namespace {

// Elements whose bits differ (a count, not a printout of a million floats).
size_t Differing(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

TEST(GdnLaunch, ManySequencesInOneLaunchEqualOneByOne) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(77);
  auto rand = [&](size_t n, float lo, float hi) { return RandVec(rng, n, lo, hi); };
  const GdnShape s{16, 48, 128, 128, 4};
  constexpr int kSeqs = 8, kSteps = 3, K = 4;
  const int C = s.channels(), Vw = s.v_heads * s.v_dim;
  auto conv_w = rand(static_cast<size_t>(C) * K, -0.5f, 0.5f);
  std::vector<float> ssm_a(s.v_heads), dt(s.v_heads);
  for (int h = 0; h < s.v_heads; ++h) {
    ssm_a[h] = -std::exp(rand(1, -3.f, 2.5f)[0]);
    dt[h] = rand(1, -2.f, 2.f)[0];
  }
  auto norm_w = rand(s.v_dim, 0.5f, 1.5f);
  Dev<float> d_conv(conv_w), d_a(ssm_a), d_dt(dt), d_norm(norm_w);
  const GdnLayerParams p{d_conv.p, d_a.p, d_dt.p, d_norm.p, 1e-6f};
  const size_t ring1 = static_cast<size_t>(K) * C, st1 = static_cast<size_t>(Vw) * s.k_dim;
  // Two copies of every sequence's state: `one` launch for all, and one launch per sequence.
  auto start_state = rand(kSeqs * st1, -0.5f, 0.5f), start_ring = rand(kSeqs * ring1, -1.f, 1.f);
  Dev<float> ring_all(start_ring), state_all(start_state), ring_one(start_ring),
      state_one(start_state);
  for (int step = 0; step < kSteps; ++step) {
    auto mixed = rand(static_cast<size_t>(kSeqs) * C, -2.f, 2.f);
    auto z = rand(static_cast<size_t>(kSeqs) * Vw, -3.f, 3.f);
    auto b = rand(static_cast<size_t>(kSeqs) * s.v_heads, -4.f, 4.f);
    auto al = rand(static_cast<size_t>(kSeqs) * s.v_heads, -6.f, 3.f);
    Dev<float> dm(mixed), dz(z), db(b), dal(al), out_all(static_cast<size_t>(kSeqs) * Vw),
        out_one(static_cast<size_t>(kSeqs) * Vw);
    std::vector<int32_t> rows(kSeqs), slots(kSeqs), pos(kSeqs);
    for (int i = 0; i < kSeqs; ++i) {
      rows[i] = i;
      slots[i] = i;
      pos[i] = 5 + step + i;  // different ring rows per sequence
    }
    Dev<int32_t> d_rows(rows), d_slots(slots), d_pos(pos);
    GdnDecodeArgs a;
    a.shape = s;
    a.p = p;
    a.n_seqs = kSeqs;
    a.rows = d_rows.p;
    a.slots = d_slots.p;
    a.pos = d_pos.p;
    a.mixed = dm.p;
    a.z = dz.p;
    a.b = db.p;
    a.alpha = dal.p;
    a.conv_ring = ring_all.p;
    a.state = state_all.p;
    a.out = out_all.p;
    ASSERT_TRUE(GdnDecode(a, nullptr).ok());  // 48 x 8 = 384 blocks: the two-per-SM form
    for (int i = 0; i < kSeqs; ++i) {
      GdnDecodeArgs one = a;
      one.n_seqs = 1;
      one.rows = d_rows.p + i;
      one.slots = d_slots.p + i;
      one.pos = d_pos.p + i;
      one.conv_ring = ring_one.p;
      one.state = state_one.p;
      one.out = out_one.p;
      ASSERT_TRUE(GdnDecode(one, nullptr).ok());  // 48 blocks: the unspilled form
    }
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(Differing(out_all.Down(), out_one.Down()), 0u) << "outputs, step " << step;
    EXPECT_EQ(Differing(state_all.Down(), state_one.Down()), 0u) << "states, step " << step;
    EXPECT_EQ(Differing(ring_all.Down(), ring_one.Down()), 0u) << "conv rows, step " << step;
  }
}

}  // namespace
}  // namespace ds::cuda
