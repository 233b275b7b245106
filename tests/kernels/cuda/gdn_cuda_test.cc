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
#include <utility>
#include <vector>

#include "kernels/cpu/gdn.h"
#include "kernels/cuda/gdn.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/gdn_layer_test_util.h"
#include "tests/kernels/cuda/gdn_state_test_util.h"

namespace ds::cuda {
namespace {

std::mt19937& Rng() {
  static std::mt19937 rng(1234);
  return rng;
}
std::vector<float> RandVec(size_t n, float lo, float hi) {
  return ds::cuda::RandVec(Rng(), n, lo, hi);
}

// ---------------------------------------------------------------------------------------------
// Gated DeltaNet: prefill then decode steps vs cpu::GdnSequence (recurrent form).

struct GdnCase {
  int hk, hv, dk, dv, T_prefill, n_decode;
  int chunk = 0;     // prefill form: 0 recurrence, kGdnChunk chunked
  int T_second = 0;  // a second prefill piece right after the first (pos0 = T_prefill)
  bool scan_mma = false;  // the chunked form's scan on TF32 tensor cores (GdnPrefillArgs::scan_mma)
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
               << (gc.scan_mma ? " scan_mma" : "") << (bf16 ? " state bf16" : ""));
  GdnShape s{gc.hk, gc.hv, gc.dk, gc.dv, 4};
  cpu::GdnDims cd{gc.hk, gc.hv, gc.dk, gc.dv, 4};
  const int C = s.channels(), Vw = gc.hv * gc.dv, K = 4;
  const int n_slots = 2, slot = 1;  // use slot 1 so slot indexing is exercised
  const RandomGdnLayer layer(Rng(), s);
  const std::vector<float>&conv_w = layer.conv_w, &ssm_a = layer.ssm_a, &dt = layer.dt,
        &norm_w = layer.norm_w;
  const GdnLayerParams p = layer.p;
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
    a.wy = wy.p; a.state_bf16 = bf16; a.scan_mma = gc.scan_mma;
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

// The same with the scan on TF32 tensor cores (3xTF32): the f32 form's bound, every head width,
// dv under / over / not a multiple of the block's 64 columns, partial last chunks.
TEST(Gdn, ChunkedPrefillScanMma) {
  if (!HaveTensorCores()) GTEST_SKIP() << "tensor-core scan: sm_80+";
  for (GdnCase gc : std::vector<GdnCase>{{16, 48, 128, 128, 70, 3, kGdnChunk},
                                         {16, 48, 128, 128, 300, 1, kGdnChunk},
                                         {2, 4, 16, 16, 33, 2, kGdnChunk},
                                         {1, 2, 32, 96, 31, 1, kGdnChunk},
                                         {4, 8, 64, 64, 5, 2, kGdnChunk},
                                         {16, 48, 128, 128, 1024, 2, kGdnChunk},
                                         {2, 6, 32, 64, 64, 1, kGdnChunk},
                                         {2, 4, 16, 48, 97, 1, kGdnChunk},
                                         {16, 48, 128, 128, 40, 2, kGdnChunk, 70},
                                         {2, 4, 16, 48, 33, 2, kGdnChunk, 65}}) {
    gc.scan_mma = true;
    RunGdnCase(gc);
    RunGdnCase(gc, /*bf16=*/true);
  }
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

// Benchmark, not a test (DISABLED_: ctest skips it; docs/conventions.md "Benchmarks"): one GDN
// layer's prefill (conv, gates, chunked delta rule, gated norm) of the 27B shape for T tokens,
// with the chunk scan in f32 on CUDA cores and on TF32 tensor cores, and how far apart their
// outputs are. Run it with
//   gdn_cuda_test --gtest_also_run_disabled_tests --gtest_filter='GdnTiming.*'
TEST(GdnTiming, DISABLED_Prefill27B) {
  if (!HaveTensorCores()) GTEST_SKIP() << "tensor-core scan: sm_80+";
  const GdnShape s{16, 48, 128, 128, 4};
  const int C = s.channels(), Vw = s.v_heads * s.v_dim, K = s.conv_kernel;
  const RandomGdnLayer layer(Rng(), s);
  const size_t per = static_cast<size_t>(s.v_heads) * s.k_dim * s.v_dim;
  for (const int T : {2048, 8192}) {
    Dev<float> dm(RandVec(static_cast<size_t>(T) * C, -2.f, 2.f)),
        dz(RandVec(static_cast<size_t>(T) * Vw, -3.f, 3.f)),
        db(RandVec(static_cast<size_t>(T) * s.v_heads, -4.f, 4.f)),
        dal(RandVec(static_cast<size_t>(T) * s.v_heads, -6.f, 3.f)), y(static_cast<size_t>(T) * C),
        g(static_cast<size_t>(T) * s.v_heads), beta(static_cast<size_t>(T) * s.v_heads),
        out(static_cast<size_t>(T) * Vw), wy(static_cast<size_t>(GdnChunkScratchFloats(s, T))),
        ring(static_cast<size_t>(K) * C), state(per);
    std::vector<float> outs[2];
    for (const bool mma : {false, true}) {
      GdnPrefillArgs a;
      a.shape = s;
      a.p = layer.p;
      a.T = T;
      a.chunk = kGdnChunk;
      a.mixed = dm.p;
      a.z = dz.p;
      a.b = db.p;
      a.alpha = dal.p;
      a.conv_ring = ring.p;
      a.state = state.p;
      a.y = y.p;
      a.g = g.p;
      a.beta = beta.p;
      a.out = out.p;
      a.wy = wy.p;
      a.scan_mma = mma;
      auto run = [&] {  // from a zero state each time
        CK(cudaMemset(ring.p, 0, ring.n * sizeof(float)));
        CK(cudaMemset(state.p, 0, state.n * sizeof(float)));
        return GdnPrefill(a, nullptr);
      };
      ASSERT_OK(run());  // warm-up, and the output compared below
      outs[mma] = out.Down();
      const double ms = 1e-3 * MeanLaunchUs(0, 10, run);
      std::printf("GDN prefill 27B shape, T=%d, scan %s: %.3f ms per layer (x48 layers: %.1f ms)\n",
                  T, mma ? "3xTF32 mma" : "f32 CUDA cores", ms, 48 * ms);
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < outs[0].size(); ++i) {
      const double d = outs[1][i] - outs[0][i];
      num += d * d;
      den += double(outs[0][i]) * outs[0][i];
    }
    std::printf("  outputs mma vs f32: rel L2 %.2e\n", std::sqrt(num / std::max(den, 1e-30)));
  }
}

}  // namespace
}  // namespace ds::cuda
