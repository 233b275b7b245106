// Gated DeltaNet kernels (kernels/cuda/gdn.cu, gdn_chunk.cu) against the CPU recurrence
// (kernels/cpu/gdn.h): prefill in both forms (per-token scan, chunked), prefill pieces after
// earlier ones, then decode steps of two sequences in one launch, and the final state; the same
// with the state stored in bf16 (state_bf16) against the CPU's bf16 emulation. Needs a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/gdn.h"
#include "kernels/cuda/gdn.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/gdn_state_test_util.h"

namespace ds::cuda {
namespace {

std::vector<float> RandVec(size_t n, float lo, float hi) {
  static std::mt19937 rng(1234);
  return ds::cuda::RandVec(rng, n, lo, hi);
}

// ---------------------------------------------------------------------------------------------
// Gated DeltaNet: prefill then decode steps vs cpu::GdnSequence (recurrent form).

struct GdnCase {
  int hk, hv, dk, dv, T_prefill, n_decode;
  int chunk = 0;     // prefill form: 0 recurrence, kGdnChunk chunked
  int T_second = 0;  // a second prefill piece right after the first (pos0 = T_prefill)
};

// bf16: the state stored in bf16 (GdnDecodeArgs / GdnPrefillArgs::state_bf16) against the CPU
// emulation (cpu::GdnSeqArgs::state_bf16; round_at_end for a prefill piece, as the kernels
// round). Before each GPU call the CPU state is set to the GPU's (exactly representable), so
// each comparison covers one call's rounding: outputs as tight as in f32 (they come from the f32
// state of their token, computed from the same input), states by ExpectBf16StateMatches.
void RunGdnCase(const GdnCase& gc, bool bf16 = false) {
  SCOPED_TRACE(::testing::Message()
               << "Hk=" << gc.hk << " Hv=" << gc.hv << " dk=" << gc.dk << " T=" << gc.T_prefill
               << "+" << gc.T_second << " decode=" << gc.n_decode << " chunk=" << gc.chunk
               << (bf16 ? " state bf16" : ""));
  GdnShape s{gc.hk, gc.hv, gc.dk, gc.dv, 4};
  cpu::GdnDims cd{gc.hk, gc.hv, gc.dk, gc.dv, 4};
  const int C = s.channels(), Vw = gc.hv * gc.dv, K = 4;
  const int n_slots = 2, slot = 1;  // use slot 1 so slot indexing is exercised
  auto conv_w = RandVec(static_cast<size_t>(C) * K, -0.5f, 0.5f);
  std::vector<float> ssm_a(gc.hv), dt(gc.hv);
  for (int h = 0; h < gc.hv; ++h) {
    ssm_a[h] = -std::exp(RandVec(1, -3.f, 2.5f)[0]);
    dt[h] = RandVec(1, -2.f, 2.f)[0];
  }
  auto norm_w = RandVec(gc.dv, 0.5f, 1.5f);
  Dev<float> d_conv(conv_w), d_a(ssm_a), d_dt(dt), d_norm(norm_w);
  GdnLayerParams p{d_conv.p, d_a.p, d_dt.p, d_norm.p, 1e-6f};
  const size_t per = static_cast<size_t>(gc.hv) * gc.dk * gc.dv;  // state elements of a slot
  Dev<float> ring(static_cast<size_t>(n_slots) * K * C);
  Dev<uint8_t> state(n_slots * per * GdnStateElemBytes(bf16));
  CK(cudaMemset(ring.p, 0, ring.n * sizeof(float)));
  CK(cudaMemset(state.p, 0, state.n));
  std::vector<float> cpu_conv(static_cast<size_t>(K - 1) * C, 0.f), cpu_state(static_cast<size_t>(gc.hv) * gc.dk * gc.dv, 0.f);

  // Inputs: alpha chosen so g = ssm_a*softplus(alpha+dt) spans [-20, 0) ; beta logits in [-4, 4].
  auto make_inputs = [&](int T, std::vector<float>& mixed, std::vector<float>& z, std::vector<float>& b,
                         std::vector<float>& al) {
    mixed = RandVec(static_cast<size_t>(T) * C, -2.f, 2.f);
    z = RandVec(static_cast<size_t>(T) * Vw, -3.f, 3.f);
    b = RandVec(static_cast<size_t>(T) * gc.hv, -4.f, 4.f);
    al = RandVec(static_cast<size_t>(T) * gc.hv, -6.f, 3.f);
  };
  auto compare = [&](const std::vector<float>& got, const std::vector<float>& ref, const char* what) {
    double num = 0, den = 0, mx = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << what << " NaN at " << i;
      const double d = got[i] - ref[i];
      num += d * d;
      den += double(ref[i]) * ref[i];
      mx = std::max(mx, std::fabs(d));
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    std::printf("  gdn %-8s rel %.2e max abs %.2e\n", what, rel, mx);
    EXPECT_LT(rel, 2e-4) << what;
  };
  // bf16: the tracked slot's state -> the CPU's before a call, and checked after it.
  auto gpu_state = [&] { return StateAsF32(state.Down(), slot * per, per, bf16); };
  auto sync_cpu_state = [&] {
    if (bf16) cpu_state = gpu_state();
  };
  auto check_state = [&](const char* what) {
    if (bf16) ExpectBf16StateMatches(gpu_state(), cpu_state, what);
  };

  int pos = 0;
  for (const int T : {gc.T_prefill, gc.T_second}) {
    if (T == 0) continue;
    std::vector<float> mixed, z, b, al;
    make_inputs(T, mixed, z, b, al);
    Dev<float> dm(mixed), dz(z), db(b), dal(al), y(static_cast<size_t>(T) * C), g(static_cast<size_t>(T) * gc.hv),
        beta(static_cast<size_t>(T) * gc.hv), out(static_cast<size_t>(T) * Vw),
        wy(static_cast<size_t>(GdnChunkScratchFloats(s, T)));
    GdnPrefillArgs a;
    a.shape = s; a.p = p; a.T = T; a.slot = slot; a.pos0 = pos; a.chunk = gc.chunk;
    a.mixed = dm.p; a.z = dz.p; a.b = db.p; a.alpha = dal.p;
    a.conv_ring = ring.p; a.state = state.p; a.y = y.p; a.g = g.p; a.beta = beta.p; a.out = out.p;
    a.wy = wy.p; a.state_bf16 = bf16;
    sync_cpu_state();
    ASSERT_OK(GdnPrefill(a, nullptr));
    std::vector<float> ref(static_cast<size_t>(T) * Vw);
    cpu::GdnSeqArgs c;
    c.dims = cd; c.T = T; c.eps = 1e-6f; c.mixed = mixed.data(); c.z = z.data(); c.b = b.data();
    c.alpha = al.data(); c.conv_w = conv_w.data(); c.ssm_a = ssm_a.data(); c.dt_bias = dt.data();
    c.norm_w = norm_w.data(); c.conv_state = cpu_conv.data(); c.state = cpu_state.data(); c.out = ref.data();
    c.state_bf16 = bf16; c.round_at_end = true;
    cpu::GdnSequence(c);
    compare(out.Down(), ref, "prefill");
    check_state("prefill state");
    pos += T;
  }
  // Decode: batch of 2 sequences in one launch, sequence 0 is the tracked one (slot 1), sequence 1
  // uses slot 0 with its own rows to check that slots/rows are respected.
  for (int step = 0; step < gc.n_decode; ++step, ++pos) {
    std::vector<float> mixed, z, b, al;
    make_inputs(2, mixed, z, b, al);
    Dev<float> dm(mixed), dz(z), db(b), dal(al), out(static_cast<size_t>(2) * Vw);
    // Row 1 belongs to the tracked sequence, row 0 to the other one.
    Dev<int32_t> rows(std::vector<int32_t>{1, 0}), slots(std::vector<int32_t>{slot, 0}), poss(std::vector<int32_t>{pos, step});
    GdnDecodeArgs a;
    a.shape = s; a.p = p; a.n_seqs = 2; a.rows = rows.p; a.slots = slots.p; a.pos = poss.p;
    a.mixed = dm.p; a.z = dz.p; a.b = db.p; a.alpha = dal.p; a.conv_ring = ring.p; a.state = state.p; a.out = out.p;
    a.state_bf16 = bf16;
    sync_cpu_state();
    ASSERT_OK(GdnDecode(a, nullptr));
    std::vector<float> ref(Vw);
    cpu::GdnSeqArgs c;
    c.dims = cd; c.T = 1; c.eps = 1e-6f; c.mixed = mixed.data() + C; c.z = z.data() + Vw; c.b = b.data() + gc.hv;
    c.alpha = al.data() + gc.hv; c.conv_w = conv_w.data(); c.ssm_a = ssm_a.data(); c.dt_bias = dt.data();
    c.norm_w = norm_w.data(); c.conv_state = cpu_conv.data(); c.state = cpu_state.data(); c.out = ref.data();
    c.state_bf16 = bf16;  // a decode step rounds after its token
    cpu::GdnSequence(c);
    const auto all = out.Down();
    compare(std::vector<float>(all.begin() + Vw, all.end()), ref, "decode");
    check_state("decode state");
  }
  // Final recurrent state of the tracked slot (bf16: checked after every call above).
  if (!bf16) compare(gpu_state(), cpu_state, "state");
}

TEST(Gdn, SmallShapes) {
  RunGdnCase({2, 6, 32, 32, 37, 3});
  RunGdnCase({2, 6, 64, 64, 1, 2});
  RunGdnCase({2, 4, 32, 64, 2, 5});
  RunGdnCase({1, 3, 32, 32, 0, 6});
  // dk = dv = 16 (the tiny synthetic models): blocks narrower than a warp.
  RunGdnCase({2, 6, 16, 16, 37, 3});
  RunGdnCase({2, 4, 16, 48, 5, 4});
}

TEST(Gdn, Shape27B) { RunGdnCase({16, 48, 128, 128, 70, 3}); }

// The chunked prefill form (several chunks, a partial last one, dv under / over 64 columns).
TEST(Gdn, ChunkedPrefill) {
  RunGdnCase({16, 48, 128, 128, 70, 3, kGdnChunk});
  RunGdnCase({16, 48, 128, 128, 300, 1, kGdnChunk});
  RunGdnCase({2, 4, 16, 16, 33, 2, kGdnChunk});
  RunGdnCase({1, 2, 32, 96, 31, 1, kGdnChunk});
  RunGdnCase({4, 8, 64, 64, 5, 2, kGdnChunk});
  // Many chunks (the state carried through 32 of them), an exact multiple of the chunk.
  RunGdnCase({16, 48, 128, 128, 1024, 2, kGdnChunk});
  RunGdnCase({2, 6, 32, 64, 64, 1, kGdnChunk});
}

// A prefill piece after another one (the conv rows of the earlier piece from the ring, the
// state carried over), in both forms, including pieces shorter than the conv window.
TEST(Gdn, PrefillAfterPrefill) {
  for (const int chunk : {0, kGdnChunk}) {
    RunGdnCase({16, 48, 128, 128, 40, 2, chunk, 70});
    RunGdnCase({2, 6, 32, 32, 2, 1, chunk, 1});
    RunGdnCase({2, 6, 32, 32, 1, 1, chunk, 2});
    RunGdnCase({2, 4, 16, 48, 33, 2, chunk, 65});
  }
}

// The state stored in bf16: both prefill forms, pieces after pieces, decode steps, narrow and
// 27B-shaped heads.
TEST(Gdn, Bf16State) {
  for (const int chunk : {0, kGdnChunk}) {
    RunGdnCase({2, 6, 32, 32, 37, 3, chunk}, true);
    RunGdnCase({2, 4, 16, 48, 5, 4, chunk, 33}, true);
    RunGdnCase({1, 2, 32, 96, 31, 2, chunk}, true);
    RunGdnCase({16, 48, 128, 128, 70, 3, chunk, 40}, true);
  }
  RunGdnCase({16, 48, 128, 128, 1024, 2, kGdnChunk}, true);
  RunGdnCase({1, 3, 32, 32, 0, 6}, true);  // decode only, from a zero state
}

}  // namespace
}  // namespace ds::cuda
