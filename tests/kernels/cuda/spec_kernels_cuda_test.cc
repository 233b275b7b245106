// The kernels of speculative decoding (issue #15) vs the CPU reference (kernels/cpu). Needs a GPU.
//  * GdnDecode with separate input / output state indices (GdnDecodeArgs::in_slots): a chain of
//    speculative tokens, each reading the previous token's entry and writing its own, against
//    cpu::GdnSequence token by token (outputs, states and conv rows of every entry); the input
//    slot stays untouched, and the outputs and final state are bit-identical to running the
//    same tokens in place (run there on one thread group per head, one_group_runs); the run
//    form (GdnDecodeArgs::run_first: the chain in one launch; plain, with its tokens spread over
//    the thread groups, on one group) bit-identical to the chain of launches. All of it also with
//    the state stored in bf16 (GdnDecodeArgs::state_bf16) against the CPU's bf16 emulation: the run
//    form then rounds the state in registers after each token, so it stays bit-identical to the
//    chain.
//  * MaskedAttnDecode (the MTP layer's attention): one query over a paged f16 plane with rows
//    masked out, against cpu::GatedAttention with the same mask; its device-resident form
//    (slot / position read on the device, as a captured draft chain runs it) bit-identical.
//  * MtpMaskUpdate vs cpu::MtpMaskWrite.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/gdn.cuh"
#include "kernels/cuda/mtp_attention.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/gdn_layer_test_util.h"
#include "tests/kernels/cuda/gdn_state_test_util.h"

namespace ds::cuda {
namespace {

std::mt19937& Rng() {
  static std::mt19937 rng(4321);
  return rng;
}
std::vector<float> RandVec(size_t n, float lo, float hi) { return ds::cuda::RandVec(Rng(), n, lo, hi); }

double Rel(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    num += double(got[i] - ref[i]) * (got[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// ---------------------------------------------------------------------------------------------
// GDN decode, speculative chain.

struct SpecCase {
  int hk, hv, dk, dv, warm, k;  // warm: in-place decode tokens before the chain; k: chain tokens
};

// bf16: the state stored in bf16; the CPU state is set to the GPU's input state before each
// token (exactly representable), so each token's state is checked for its own rounding
// (ExpectBf16StateMatches) and its output as tightly as in f32.
void RunSpecChain(const SpecCase& sc, bool bf16 = false) {
  SCOPED_TRACE(::testing::Message()
               << "Hk=" << sc.hk << " Hv=" << sc.hv << " dk=" << sc.dk << " dv=" << sc.dv
               << " warm=" << sc.warm << " k=" << sc.k << (bf16 ? " state bf16" : ""));
  GdnShape s{sc.hk, sc.hv, sc.dk, sc.dv, 4};
  cpu::GdnDims cd{sc.hk, sc.hv, sc.dk, sc.dv, 4};
  const int C = s.channels(), Vw = sc.hv * sc.dv, K = 4;
  // State indices: 0 = the chain's slot, 1 = the in-place copy, 2.. = the chain's entries, then
  // the entries of the same chain as one run, then as one run in each other form of the run
  // kernel (spread, one group).
  const int n_idx = 2 + 4 * sc.k;
  const size_t ring1 = static_cast<size_t>(K) * C, st1 = static_cast<size_t>(sc.hv) * sc.dk * sc.dv;
  const RandomGdnLayer layer(Rng(), s);
  const std::vector<float>&conv_w = layer.conv_w, &ssm_a = layer.ssm_a, &dt = layer.dt,
        &norm_w = layer.norm_w;
  const GdnLayerParams p = layer.p;
  const size_t eb = GdnStateElemBytes(bf16), stb = st1 * eb;  // state bytes of an index
  // Entries stay poisoned until written.
  Dev<float> ring(n_idx * ring1);
  Dev<uint8_t> state(n_idx * stb);
  CK(cudaMemset(ring.p, 0, 2 * ring1 * sizeof(float)));
  CK(cudaMemset(state.p, 0, 2 * stb));
  std::vector<float> cpu_conv(static_cast<size_t>(K - 1) * C, 0.f), cpu_state(st1, 0.f);

  struct Tok {
    std::vector<float> mixed, z, b, al;
  };
  auto make = [&] {
    return Tok{RandVec(C, -2.f, 2.f), RandVec(Vw, -3.f, 3.f), RandVec(sc.hv, -4.f, 4.f),
               RandVec(sc.hv, -6.f, 3.f)};
  };
  // One token of one sequence on the GPU: reads index `in`, writes index `out`.
  // bf16: the CPU continues from the GPU's input state of the next token (see above).
  auto sync_cpu_state = [&](int in) {
    if (bf16) cpu_state = StateAsF32(state.Down(), in * st1, st1, true);
  };
  // one_group: GdnDecodeArgs::one_group_runs (dk = 64), which must not change a bit.
  auto gpu_token = [&](const Tok& t, int in, int out, int pos, bool one_group = false) {
    Dev<float> dm(t.mixed), dz(t.z), db(t.b), dal(t.al), o(Vw);
    Dev<int32_t> rows(std::vector<int32_t>{0}), outs(std::vector<int32_t>{out}),
        ins(std::vector<int32_t>{in}), poss(std::vector<int32_t>{pos});
    GdnDecodeArgs a =
        DecodeArgs(s, p, 1, rows.p, outs.p, poss.p, dm, dz, db, dal, ring.p, state.p, o.p);
    a.in_slots = in == out ? nullptr : ins.p;
    a.state_bf16 = bf16;
    a.one_group_runs = one_group;
    EXPECT_TRUE(GdnDecode(a, nullptr).ok());
    return o.Down();
  };
  auto cpu_token = [&](const Tok& t) {
    std::vector<float> ref(Vw);
    cpu::GdnSeqArgs c;
    c.dims = cd; c.T = 1; c.eps = 1e-6f; c.mixed = t.mixed.data(); c.z = t.z.data(); c.b = t.b.data();
    c.alpha = t.al.data(); c.conv_w = conv_w.data(); c.ssm_a = ssm_a.data(); c.dt_bias = dt.data();
    c.norm_w = norm_w.data(); c.conv_state = cpu_conv.data(); c.state = cpu_state.data(); c.out = ref.data();
    c.state_bf16 = bf16;
    cpu::GdnSequence(c);
    return ref;
  };
  // Warm-up tokens in place on slot 0 (and the CPU), then the same state copied to index 1.
  int pos = 0;
  for (; pos < sc.warm; ++pos) {
    const Tok t = make();
    sync_cpu_state(0);
    gpu_token(t, 0, 0, pos);
    cpu_token(t);
  }
  CK(cudaMemcpy(ring.p + ring1, ring.p, ring1 * sizeof(float), cudaMemcpyDeviceToDevice));
  CK(cudaMemcpy(state.p + stb, state.p, stb, cudaMemcpyDeviceToDevice));
  const auto ring0 = ring.Down(ring1);
  const auto state0 = state.Down(stb);
  const int pos0 = pos;
  std::vector<Tok> toks;
  std::vector<float> gots;

  for (int i = 0; i < sc.k; ++i, ++pos) {
    const Tok t = make();
    toks.push_back(t);
    sync_cpu_state(i == 0 ? 0 : 2 + i - 1);
    const auto got = gpu_token(t, i == 0 ? 0 : 2 + i - 1, 2 + i, pos);
    gots.insert(gots.end(), got.begin(), got.end());
    const auto inplace = gpu_token(t, 1, 1, pos, /*one_group=*/true);
    const auto ref = cpu_token(t);
    EXPECT_LT(Rel(got, ref), 2e-4) << "token " << i;
    EXPECT_EQ(std::memcmp(got.data(), inplace.data(), got.size() * 4), 0) << "token " << i;
    // The entry holds the CPU's state and its last K-1 pre-conv rows (ring row q % K).
    const auto all_st = state.Down();
    const auto all_ring = ring.Down();
    const std::vector<float> e_st = StateAsF32(all_st, (2 + i) * st1, st1, bf16);
    if (bf16)
      ExpectBf16StateMatches(e_st, cpu_state, "spec state");
    else
      EXPECT_LT(Rel(e_st, cpu_state), 2e-4) << "state after token " << i;
    EXPECT_EQ(std::memcmp(all_st.data() + (2 + i) * stb, all_st.data() + stb, stb), 0)
        << "token " << i;
    for (int r = 0; r < K - 1; ++r) {
      const int q = pos - (K - 2) + r;  // position of CPU conv row r
      const float* g = all_ring.data() + (2 + i) * ring1 + static_cast<size_t>(((q % K) + K) % K) * C;
      const std::vector<float> gr(g, g + C), cr(cpu_conv.begin() + r * C, cpu_conv.begin() + (r + 1) * C);
      EXPECT_EQ(gr, cr) << "conv row " << r << " after token " << i;
    }
  }
  // The chain's input slot is untouched.
  EXPECT_EQ(ring.Down(ring1), ring0);
  EXPECT_EQ(state.Down(stb), state0);

  // The same tokens as one run (GdnDecodeArgs::run_first: one launch, one block per head walks
  // the k tokens with the state in registers) into entries 2 + k .., then with the tokens'
  // prologues and epilogues spread over the block's thread groups (spread_run_tokens) into entries
  // 2 + 2k .., then on one thread group per head (one_group_runs, dk = 64; the plain form
  // elsewhere) into entries 2 + 3k ..: outputs, states and conv rows bit-identical to the chain of
  // one launch per token above.
  std::vector<float> mixed, z, b, al;
  for (int i = 0; i < sc.k; ++i) {
    const Tok& t = toks[i];
    mixed.insert(mixed.end(), t.mixed.begin(), t.mixed.end());
    z.insert(z.end(), t.z.begin(), t.z.end());
    b.insert(b.end(), t.b.begin(), t.b.end());
    al.insert(al.end(), t.al.begin(), t.al.end());
  }
  Dev<float> dm(mixed), dz(z), db(b), dal(al);
  for (const int form : {0, 1, 2}) {  // plain, spread, one group
    SCOPED_TRACE(form == 0   ? "run"
                 : form == 1 ? "run, tokens spread over the groups"
                             : "run, one group");
    const int base = 2 + (1 + form) * sc.k;  // the run's first entry
    std::vector<int32_t> rows, outs, ins, poss;
    for (int i = 0; i < sc.k; ++i) {
      rows.push_back(i);
      outs.push_back(base + i);
      ins.push_back(i == 0 ? 0 : base + i - 1);
      poss.push_back(pos0 + i);
    }
    Dev<float> o(static_cast<size_t>(sc.k) * Vw);
    Dev<int32_t> drows(rows), douts(outs), dins(ins), dposs(poss);
    Dev<int32_t> first(std::vector<int32_t>{0}), len(std::vector<int32_t>{sc.k});
    GdnDecodeArgs a =
        DecodeArgs(s, p, 1, drows.p, douts.p, dposs.p, dm, dz, db, dal, ring.p, state.p, o.p);
    a.run_first = first.p;
    a.run_len = len.p;
    a.in_slots = dins.p;
    a.state_bf16 = bf16;
    a.spread_run_tokens = form == 1;
    a.one_group_runs = form == 2;
    ASSERT_TRUE(GdnDecode(a, nullptr).ok());
    const auto run_out = o.Down();
    EXPECT_EQ(std::memcmp(run_out.data(), gots.data(), gots.size() * 4), 0) << "run outputs";
    const auto all_st = state.Down();
    const auto all_ring = ring.Down();
    for (int i = 0; i < sc.k; ++i) {
      EXPECT_EQ(std::memcmp(all_st.data() + (base + i) * stb, all_st.data() + (2 + i) * stb, stb),
                0)
          << "run state after token " << i;
      EXPECT_EQ(std::memcmp(all_ring.data() + (base + i) * ring1, all_ring.data() + (2 + i) * ring1,
                            ring1 * 4),
                0)
          << "run conv rows after token " << i;
    }
    EXPECT_EQ(ring.Down(ring1), ring0);
    EXPECT_EQ(state.Down(stb), state0);
  }
}

TEST(GdnSpec, ChainMatchesCpuAndInPlace) {
  RunSpecChain({2, 6, 16, 16, 5, 4});
  RunSpecChain({2, 4, 32, 64, 2, 3});  // fewer warm tokens than conv rows: zero rows carried
  RunSpecChain({2, 6, 64, 64, 0, 5});
  RunSpecChain({2, 4, 64, 64, 6, 8});      // the demo model's shape, runs of two chunks
  RunSpecChain({2, 4, 64, 128, 3, 5});     // one group with dv != dk (a runtime stride)
  RunSpecChain({16, 48, 128, 128, 3, 4});  // the 27B shape
  RunSpecChain({16, 48, 128, 128, 2, 5});  // a k = 4 verify's runs: a chunk of 4 and one of 1
}

// The state stored in bf16: the chain against the CPU's emulation, in place and as one run
// (bit-identical to the chain: the run rounds its registers after each token).
TEST(GdnSpec, Bf16StateChain) {
  RunSpecChain({2, 6, 16, 16, 5, 4}, true);
  RunSpecChain({2, 4, 32, 64, 2, 3}, true);
  RunSpecChain({16, 48, 128, 128, 3, 4}, true);
  RunSpecChain({16, 48, 128, 128, 2, 5}, true);
}

// ---------------------------------------------------------------------------------------------
// Masked one-row attention over a paged f16 plane.

void RunMaskedAttn(int n_head, int n_kv, int hd, int n_rot, int P, int page, int max_splits,
                   double gap_rate) {
  SCOPED_TRACE(::testing::Message() << "heads " << n_head << "/" << n_kv << " hd " << hd << " P "
                                    << P << " splits<=" << max_splits << " gaps " << gap_rate);
  AttnShape s{n_head, n_kv, hd, n_rot, 1e7f, 1e-6f};
  const int n_slots = 2, slot = 1, len = P + 1;
  const int max_pages = (len + page - 1) / page;
  std::vector<int32_t> table(static_cast<size_t>(n_slots) * max_pages);
  for (int i = 0; i < max_pages; ++i) {  // slot 1's pages in reverse order
    table[i] = max_pages + i;
    table[max_pages + i] = max_pages - 1 - i;
  }
  const size_t kv_elems = static_cast<size_t>(n_slots) * max_pages * page * n_kv * hd;
  Dev<uint16_t> kc(kv_elems), vc(kv_elems);  // poisoned: masked rows hold NaN on the GPU
  Dev<int32_t> dtable(table);
  KvCacheView kv{kc.p, vc.p, dtable.p, page, max_pages, n_kv, hd, GgmlType::F16};
  auto qn = RandVec(hd, 0.5f, 1.5f), kn = RandVec(hd, 0.5f, 1.5f);
  Dev<float> dqn(qn), dkn(kn);
  const int qgw = n_head * 2 * hd, kvw = n_kv * hd, ow = n_head * hd;
  // Rows written: all but a random share (row P, the query's own, always).
  std::vector<uint8_t> valid(len);
  std::bernoulli_distribution gap(gap_rate);
  for (int j = 0; j < len; ++j) valid[j] = j == P || !gap(Rng());
  std::vector<float> cpu_k(static_cast<size_t>(len) * kvw, 0.f), cpu_v(cpu_k.size(), 0.f);
  // Write the valid rows (one QkvPrep launch over all of them), then the query row.
  std::vector<int32_t> tslot, tpos;
  for (int j = 0; j < P; ++j)
    if (valid[j]) {
      tslot.push_back(slot);
      tpos.push_back(j);
    }
  const int T = static_cast<int>(tpos.size());
  auto qg_all = RandVec(static_cast<size_t>(T + 1) * qgw, -2.f, 2.f);
  auto k_all = RandVec(static_cast<size_t>(T + 1) * kvw, -2.f, 2.f);
  auto v_all = RandVec(static_cast<size_t>(T + 1) * kvw, -2.f, 2.f);
  tslot.push_back(slot);
  tpos.push_back(P);
  Dev<float> dqg(qg_all), dk(k_all), dv(v_all), q(static_cast<size_t>(T + 1) * ow);
  Dev<int32_t> ds(tslot), dp(tpos);
  QkvPrepArgs pa;
  pa.shape = s; pa.T = T + 1; pa.tok_slot = ds.p; pa.tok_pos = dp.p; pa.qg = dqg.p; pa.k = dk.p;
  pa.v = dv.p; pa.q_norm = dqn.p; pa.k_norm = dkn.p; pa.q_out = q.p; pa.kv = kv;
  ASSERT_OK(QkvPrep(pa, nullptr));
  Dev<uint8_t> dvalid(valid);
  const int n_splits = MaskedAttnSplits(P, max_splits);
  Dev<float> parts(MaskedAttnPartialFloats(s, max_splits)), out(ow);
  MaskedAttnArgs a;
  a.shape = s; a.slot = slot; a.pos = P; a.q = q.p + static_cast<size_t>(T) * ow;
  a.qg = dqg.p + static_cast<size_t>(T) * qgw; a.kv = kv; a.valid = dvalid.p;
  a.n_splits = n_splits; a.partials = parts.p; a.out = out.p;
  ASSERT_OK(MaskedAttnDecode(a, nullptr));
  // The device-resident form (graph replays): slot and position read on the device, the mask of
  // every slot behind one pointer, the most splits launched: bit-identical to the host form.
  {
    std::vector<uint8_t> masks(static_cast<size_t>(n_slots) * len, 0);
    std::copy(valid.begin(), valid.end(), masks.begin() + static_cast<size_t>(slot) * len);
    Dev<uint8_t> dmasks(masks);
    Dev<int32_t> dsp(std::vector<int32_t>{slot, P});
    Dev<float> parts2(MaskedAttnPartialFloats(s, max_splits)), out2(ow);
    MaskedAttnArgs b = a;
    b.slot = -1;  // must not be read
    b.pos = 0;
    b.dev_slot = dsp.p;
    b.dev_pos = dsp.p + 1;
    b.valid = dmasks.p;
    b.valid_ld = len;
    b.n_splits = max_splits;
    b.partials = parts2.p;
    b.out = out2.p;
    ASSERT_OK(MaskedAttnDecode(b, nullptr));
    const auto o1 = out.Down(), o2 = out2.Down();
    EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)), 0)
        << "device-resident form differs from the host form";
  }

  // CPU: the same rows through GatedAttention (one token at a time writes its row), then the
  // query with the mask.
  std::vector<float> scratch(ow);
  for (int t = 0; t <= T; ++t) {
    cpu::AttnArgs c;
    c.n_head = n_head; c.n_head_kv = n_kv; c.head_dim = hd; c.n_rot = n_rot; c.rope_base = 1e7f;
    c.eps = 1e-6f; c.T = 1; c.pos0 = tpos[t]; c.qg = qg_all.data() + static_cast<size_t>(t) * qgw;
    c.k = k_all.data() + static_cast<size_t>(t) * kvw; c.v = v_all.data() + static_cast<size_t>(t) * kvw;
    c.q_norm = qn.data(); c.k_norm = kn.data(); c.k_cache = cpu_k.data(); c.v_cache = cpu_v.data();
    c.valid = valid.data(); c.out = scratch.data();
    cpu::GatedAttention(c);
  }
  const double rel = Rel(out.Down(), scratch);
  std::printf("  masked attn heads %d/%d hd %d P %d splits %d: rel %.2e\n", n_head, n_kv, hd, P,
              n_splits, rel);
  EXPECT_LT(rel, 5e-3);  // f16 K/V
}

TEST(MaskedAttn, MatchesCpu) {
  RunMaskedAttn(4, 2, 32, 8, 0, 16, 4, 0.0);       // the query's own row only
  RunMaskedAttn(4, 2, 32, 8, 53, 16, 4, 0.2);
  RunMaskedAttn(6, 2, 64, 16, 300, 16, 8, 0.3);   // 3 splits
  RunMaskedAttn(4, 1, 128, 32, 700, 64, 3, 0.5);  // capped at 3 splits
  RunMaskedAttn(24, 4, 256, 64, 1000, 64, 22, 0.1);  // the 27B shape, 8 splits
}

// The MTP row mask update (the draft chain's, on the device) against cpu::MtpMaskWrite over a
// sequence of writes: rows written, rejected drafts dropped, another slot untouched.
TEST(MtpMask, UpdateMatchesCpu) {
  const int ld = 300, n_slots = 3;
  std::vector<uint8_t> ref(static_cast<size_t>(n_slots) * ld, 0);
  Dev<uint8_t> d(ref);
  std::vector<int32_t> len(n_slots, 0);
  struct W {
    int slot, pos0, n;
  };
  const W writes[] = {{1, 0, 40}, {1, 40, 4}, {1, 41, 1}, {2, 0, 7}, {1, 30, 2},
                      {1, 32, 1}, {0, 5, 3},  {1, 100, 1}, {1, 33, 5}, {2, 299, 1}};
  for (const W& w : writes) {
    Dev<int32_t> args(std::vector<int32_t>{w.slot, w.pos0, w.n, len[w.slot]});
    ASSERT_OK(MtpMaskUpdate(d.p, ld, args.p, nullptr));
    len[w.slot] = cpu::MtpMaskWrite(ref.data() + static_cast<size_t>(w.slot) * ld, w.pos0, w.n,
                                    len[w.slot]);
    ASSERT_EQ(d.Down(), ref) << "after writing slot " << w.slot << " rows [" << w.pos0 << ", "
                             << w.pos0 + w.n << ")";
  }
  // Rows past a rewrite are gone: slot 1 holds [0, 38) minus nothing, then nothing.
  for (int j = 0; j < ld; ++j) EXPECT_EQ(ref[ld + j], j < 38 ? 1 : 0) << j;
}

TEST(MaskedAttn, RejectsNonF16) {
  MaskedAttnArgs a;
  a.shape = AttnShape{4, 2, 32, 8, 1e7f, 1e-6f};
  a.kv.type = GgmlType::Q8_0;
  EXPECT_FALSE(MaskedAttnDecode(a, nullptr).ok());
}

}  // namespace
}  // namespace ds::cuda
