// A random Gated DeltaNet layer for the GDN GPU tests (gdn_cuda_test, gdn_launch_cuda_test,
// spec_kernels_cuda_test), and the decode launch's arguments over its buffers (DecodeArgs): the
// conv taps, the gates' A (= -exp(.)) and dt bias and the norm weights, kept on the host for the
// CPU reference and uploaded for the kernels.
#pragma once
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/gdn.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace ds::cuda {

struct RandomGdnLayer {
  std::vector<float> conv_w, ssm_a, dt, norm_w;
  Dev<float> d_conv, d_a, d_dt, d_norm;
  GdnLayerParams p;

  // Drawn from `rng` in this order: conv taps, then per value head A and dt bias, then the norm.
  RandomGdnLayer(std::mt19937& rng, const GdnShape& s)
      : conv_w(RandVec(rng, static_cast<size_t>(s.channels()) * s.conv_kernel, -0.5f, 0.5f)),
        ssm_a(s.v_heads),
        dt(s.v_heads),
        d_conv(conv_w),
        d_a(s.v_heads),
        d_dt(s.v_heads),
        d_norm(s.v_dim) {
    for (int h = 0; h < s.v_heads; ++h) {
      ssm_a[h] = -std::exp(RandVec(rng, 1, -3.f, 2.5f)[0]);
      dt[h] = RandVec(rng, 1, -2.f, 2.f)[0];
    }
    norm_w = RandVec(rng, s.v_dim, 0.5f, 1.5f);
    d_a.Up(ssm_a);
    d_dt.Up(dt);
    d_norm.Up(norm_w);
    p = GdnLayerParams{d_conv.p, d_a.p, d_dt.p, d_norm.p, 1e-6f};
  }
};

// The args of a launch over n sequences: device arrays rows / slots / pos [n], the layer's
// inputs, its conv ring, state (f32 unless set after) and output.
inline GdnDecodeArgs DecodeArgs(const GdnShape& s, const GdnLayerParams& p, int n,
                                const int32_t* rows, const int32_t* slots, const int32_t* pos,
                                const Dev<float>& mixed, const Dev<float>& z, const Dev<float>& b,
                                const Dev<float>& alpha, float* ring, void* state, float* out) {
  GdnDecodeArgs a;
  a.shape = s;
  a.p = p;
  a.n_seqs = n;
  a.rows = rows;
  a.slots = slots;
  a.pos = pos;
  a.mixed = mixed.p;
  a.z = z.p;
  a.b = b.p;
  a.alpha = alpha.p;
  a.conv_ring = ring;
  a.state = state;
  a.out = out;
  return a;
}

}  // namespace ds::cuda
