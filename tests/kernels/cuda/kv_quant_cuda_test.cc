// Quantized KV cache on the GPU (kernels/cuda/attention.cu, --kv-type q8_0 / q4_0) vs the CPU
// reference (kernels/cpu/kv_quant.h). Needs a GPU.
//
//  * KvBlocks: the K/V blocks QkvPrep writes equal the CPU quantizer's blocks. V rows (stored as
//    given) must match bitwise, special values included (zero blocks, NaN, inf, ties, saturating
//    and underflowing scales). K rows are RMSNormed and roped on the GPU first, whose f32 result
//    differs from the CPU's in the last bits, so a K block may differ by one f16 ulp of d and one
//    quantum per element; the share of bitwise-equal K rows is printed (> 80 % asserted for
//    q8_0 / q4_0). f16 V rows are bitwise too, except that NaN may differ in its payload.
//  * Attention: prefill (gather + dequantize + cuBLAS) and split-K decode with q8_0 / q4_0 KV
//    against a CPU reference in double on the dequantized GPU K/V (the q/k prep on the CPU). Decode
//    is f32 throughout: bound rel L2 < 1e-4. Prefill runs cuBLAS on f16 K/V/q/probabilities:
//    bound 5e-3 (as the f16 test in kernels_cuda_test.cc). The quantization error itself (vs
//    attention on unquantized K/V) is printed and loosely bounded.
//  * Timing: decode attention at 32k context, 27B shape, one layer, per KV type (printed only).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_prefill_mma.cuh"
#include "kernels/cuda/attention_prefill_wgmma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace ds::cuda {
namespace {

std::mt19937& Rng() {
  static std::mt19937 rng(4321);
  return rng;
}
std::vector<float> RandVec(size_t n, float lo, float hi) { return ds::cuda::RandVec(Rng(), n, lo, hi); }

const char* Name(GgmlType t) {
  return t == GgmlType::F16 ? "f16" : t == GgmlType::Q8_0 ? "q8_0" : "q4_0";
}

// A paged cache for n_slots slots of max_len tokens; slot 1's pages are handed out in reverse
// order (exercises the block table).
struct Cache {
  GgmlType type;
  int n_kv, hd, page, max_pages, n_slots = 2;
  int64_t row_bytes;
  std::unique_ptr<Dev<uint8_t>> k, v;
  std::unique_ptr<Dev<int32_t>> table;
  std::vector<int32_t> h_table;
  Cache(GgmlType t, int n_kv_, int hd_, int page_, int max_len)
      : type(t), n_kv(n_kv_), hd(hd_), page(page_), max_pages((max_len + page_ - 1) / page_) {
    row_bytes = static_cast<int64_t>(GgmlRowBytes(t, hd));
    h_table.resize(static_cast<size_t>(n_slots) * max_pages);
    for (int i = 0; i < max_pages; ++i) {
      h_table[i] = max_pages + i;
      h_table[max_pages + i] = max_pages - 1 - i;
    }
    const size_t bytes = static_cast<size_t>(n_slots) * max_pages * page * n_kv * row_bytes;
    k = std::make_unique<Dev<uint8_t>>(bytes);
    v = std::make_unique<Dev<uint8_t>>(bytes);
    table = std::make_unique<Dev<int32_t>>(h_table);
  }
  KvCacheView View() const {
    return KvCacheView{k->p, v->p, table->p, page, max_pages, n_kv, hd, type};
  }
  // Byte offset of (slot, pos, head)'s row.
  int64_t Off(int slot, int pos, int head) const {
    const int64_t pg = h_table[static_cast<size_t>(slot) * max_pages + pos / page];
    return ((pg * page + pos % page) * n_kv + head) * row_bytes;
  }
  // Dequantized rows [0, L) of a slot: [L, n_kv*hd] f32 (exact: d*q has <= 19 significant bits).
  std::vector<float> Rows(const std::vector<uint8_t>& raw, int slot, int L) const {
    std::vector<float> out(static_cast<size_t>(L) * n_kv * hd);
    for (int p = 0; p < L; ++p)
      for (int h = 0; h < n_kv; ++h)
        cpu::DequantizeKvRow(type, raw.data() + Off(slot, p, h),
                             out.data() + (static_cast<size_t>(p) * n_kv + h) * hd, hd);
    return out;
  }
};

// QkvPrep of T rows of slot `slot` at positions pos0.. (host inputs); q_out / q16 returned.
struct Prepped {
  std::unique_ptr<Dev<float>> q;
  std::unique_ptr<Dev<uint16_t>> q16;
};
Prepped RunPrep(const AttnShape& s, const Cache& c, int slot, int pos0, int T,
                const std::vector<float>& qg, const std::vector<float>& k,
                const std::vector<float>& v, const Dev<float>& qn, const Dev<float>& kn) {
  std::vector<int32_t> tslot(T, slot), tpos(T);
  for (int t = 0; t < T; ++t) tpos[t] = pos0 + t;
  Dev<float> dqg(qg), dk(k), dv(v);
  Dev<int32_t> ds(tslot), dp(tpos);
  Prepped r;
  r.q = std::make_unique<Dev<float>>(static_cast<size_t>(T) * s.n_head * s.hd);
  r.q16 = std::make_unique<Dev<uint16_t>>(static_cast<size_t>(T) * s.n_head * s.hd);
  QkvPrepArgs pa;
  pa.shape = s; pa.T = T; pa.tok_slot = ds.p; pa.tok_pos = dp.p; pa.qg = dqg.p; pa.k = dk.p;
  pa.v = dv.p; pa.q_norm = qn.p; pa.k_norm = kn.p; pa.q_out = r.q->p; pa.q16 = r.q16->p;
  pa.kv = c.View();
  const absl::Status st = QkvPrep(pa, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  CK(cudaDeviceSynchronize());
  return r;
}

// CPU q/k prep of one head row (RMSNorm with weight, NeoX rope on n_rot dims).
void PrepRow(const float* x, const std::vector<float>& w, const AttnShape& s, int pos, float* y) {
  cpu::RmsNorm(x, w.data(), s.hd, s.eps, y);
  cpu::RopeNeox(y, s.n_rot, pos, s.rope_base);
}

// ---------------------------------------------------------------------------------------------
// Blocks written by QkvPrep vs the CPU quantizer.

// Rows of v with special blocks mixed in: zeros, NaN/inf, exact ties, huge (saturating d) and
// tiny (d underflows to an f16 subnormal or zero) values.
std::vector<float> SpecialRows(int T, int width) {
  auto v = RandVec(static_cast<size_t>(T) * width, -3.f, 3.f);
  const int nb = static_cast<int>(v.size() / 32);
  for (int b = 0; b < nb; ++b) {
    float* x = v.data() + static_cast<size_t>(b) * 32;
    switch (b % 11) {
      case 1: std::fill(x, x + 32, 0.f); break;
      case 2: x[5] = std::numeric_limits<float>::quiet_NaN(); x[7] = -INFINITY; break;
      case 3:  // amax 127 (q8_0 d = 1) / -8 first (q4_0 d = 1): halves are exact ties
        for (int j = 0; j < 32; ++j) x[j] = 0.5f * static_cast<float>((j * 7) % 15 - 7);
        x[0] = -8.f; x[1] = 127.f; break;
      case 4: for (int j = 0; j < 32; ++j) x[j] *= 1e6f; break;
      case 5: for (int j = 0; j < 32; ++j) x[j] *= 1e-7f; break;
      case 6: for (int j = 0; j < 32; ++j) x[j] = (j % 3 == 0 ? 2.f : -2.f); break;  // sign ties
      default: break;
    }
  }
  return v;
}

void RunBlocksCase(GgmlType type, int n_head, int n_kv, int hd, int n_rot, int T, int page) {
  SCOPED_TRACE(::testing::Message() << Name(type) << " heads " << n_head << "/" << n_kv << " hd "
                                    << hd << " T " << T);
  AttnShape s{n_head, n_kv, hd, n_rot, 1e7f, 1e-6f};
  const int slot = 1, pos0 = 5, kvw = n_kv * hd;
  Cache c(type, n_kv, hd, page, pos0 + T);
  auto qn = RandVec(hd, 0.5f, 1.5f), kn = RandVec(hd, 0.5f, 1.5f);
  Dev<float> dqn(qn), dkn(kn);
  auto qg = RandVec(static_cast<size_t>(T) * n_head * 2 * hd, -2.f, 2.f);
  auto k = RandVec(static_cast<size_t>(T) * kvw, -2.f, 2.f);
  auto v = SpecialRows(T, kvw);
  RunPrep(s, c, slot, pos0, T, qg, k, v, dqn, dkn);
  const auto gk = c.k->Down(), gv = c.v->Down();
  std::vector<uint8_t> ref(c.row_bytes);
  std::vector<float> krow(hd), gdq(hd), cdq(hd);
  int64_t v_bad = 0, k_exact = 0, k_rows = 0;
  double k_worst = 0;  // largest element difference in quanta
  for (int t = 0; t < T; ++t) {
    const int pos = pos0 + t;
    for (int h = 0; h < n_kv; ++h) {
      const uint8_t* g = gv.data() + c.Off(slot, pos, h);
      cpu::QuantizeKvRow(type, v.data() + static_cast<size_t>(t) * kvw + h * hd, ref.data(), hd);
      int at = -1;
      if (type == GgmlType::F16) {
        // Per half: the GPU's canonical NaN 0x7fff vs the CPU's 0x7e00 count as equal.
        for (int i = 0; i < hd && at < 0; ++i) {
          uint16_t a, b;
          std::memcpy(&a, g + 2 * i, 2);
          std::memcpy(&b, ref.data() + 2 * i, 2);
          if (a != b && !(std::isnan(F16ToF32(a)) && std::isnan(F16ToF32(b)))) at = 2 * i;
        }
      } else {
        for (int i = 0; i < c.row_bytes && at < 0; ++i)
          if (g[i] != ref[i]) at = i;
      }
      if (at >= 0 && ++v_bad <= 3)
        ADD_FAILURE() << "V row t " << t << " head " << h << " differs at byte " << at << ": gpu "
                      << int(g[at]) << " cpu " << int(ref[at]);
      // K: CPU prep then quantize; per block d within one f16 ulp, elements within one quantum.
      PrepRow(k.data() + static_cast<size_t>(t) * kvw + h * hd, kn, s, pos, krow.data());
      cpu::QuantizeKvRow(type, krow.data(), ref.data(), hd);
      const uint8_t* gk_row = gk.data() + c.Off(slot, pos, h);
      ++k_rows;
      if (std::memcmp(gk_row, ref.data(), c.row_bytes) == 0) {
        ++k_exact;
        continue;
      }
      cpu::DequantizeKvRow(type, gk_row, gdq.data(), hd);
      cpu::DequantizeKvRow(type, ref.data(), cdq.data(), hd);
      for (int b = 0; b < hd / 32; ++b) {
        float quantum;
        if (type == GgmlType::F16) {
          float amax = 0;
          for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(cdq[b * 32 + j]));
          quantum = amax * 9.8e-4f;  // one f16 ulp at the block's largest element
        } else {
          const int bb = GgmlBlockBytes(type);
          uint16_t dg, dc;
          std::memcpy(&dg, gk_row + b * bb, 2);
          std::memcpy(&dc, ref.data() + b * bb, 2);
          const float fg = std::fabs(F16ToF32(dg)), fc = std::fabs(F16ToF32(dc));
          EXPECT_LE(std::fabs(fg - fc), std::max(fg, fc) * 9.8e-4f) << "K d, t " << t << " b " << b;
          quantum = std::max(fg, fc);
        }
        for (int j = 0; j < 32; ++j) {
          const double diff = std::fabs(gdq[b * 32 + j] - cdq[b * 32 + j]);
          // One quantum, plus the f16 ulp of d times up to 127 (q8_0) / 8 (q4_0) levels.
          const double bound = quantum * 1.0 + quantum * 9.8e-4 * 128 + 1e-30;
          k_worst = std::max(k_worst, diff / std::max<double>(quantum, 1e-30));
          ASSERT_LE(diff, bound) << "K t " << t << " head " << h << " elem " << b * 32 + j;
        }
      }
    }
  }
  EXPECT_EQ(v_bad, 0) << "V rows differing from the CPU quantizer";
  const double share = static_cast<double>(k_exact) / std::max<int64_t>(1, k_rows);
  std::printf("  %-5s hd %3d: V rows bitwise equal %lld/%lld; K rows bitwise equal %.1f %%, "
              "worst K element diff %.2f quanta\n",
              Name(type), hd, static_cast<long long>(T * n_kv - v_bad),
              static_cast<long long>(T * n_kv), 100 * share, k_worst);
  // f16 rounds every element, so one differing f32 bit flips ~1 in 10^3-10^4 of them; the
  // quantized formats round ~127 or 8 levels and see far fewer flips (~1-3 % of q8_0 rows).
  if (type != GgmlType::F16) {
    EXPECT_GT(share, 0.8);
  }
}

TEST(KvBlocks, MatchCpuQuantizer27B) {
  for (GgmlType t : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0})
    RunBlocksCase(t, 24, 4, 256, 64, 97, 64);
}
TEST(KvBlocks, MatchCpuQuantizerSmallShapes) {
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    RunBlocksCase(t, 4, 2, 32, 8, 53, 16);
    RunBlocksCase(t, 6, 2, 64, 16, 41, 16);
    RunBlocksCase(t, 6, 1, 128, 32, 77, 8);
  }
}

TEST(KvBlocks, RejectsBadType) {
  AttnShape s{4, 2, 64, 16, 1e7f, 1e-6f};
  QkvPrepArgs pa;
  pa.shape = s;
  pa.T = 1;
  pa.kv.type = GgmlType::Q4_K;
  pa.kv.hd = 64;
  EXPECT_FALSE(QkvPrep(pa, nullptr).ok());
  AttnDecodeArgs a;
  a.shape = s;
  a.n_seqs = 1;
  a.kv = pa.kv;
  EXPECT_FALSE(AttnDecode(a, nullptr).ok());
}

// ---------------------------------------------------------------------------------------------
// Attention with quantized KV vs a CPU reference on the dequantized K/V.

double RelErr(const std::vector<float>& got, const std::vector<double>& ref, const char* what) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_FALSE(std::isnan(got[i])) << what << " NaN at " << i;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// out[h*hd..] for one query token at position pos (keys [0, pos]) in double: q from qg (CPU
// prep), K/V rows [L, n_kv*hd] f32.
std::vector<double> RefAttend(const AttnShape& s, const float* qg_row, const std::vector<float>& qn,
                              int pos, const std::vector<float>& K, const std::vector<float>& V) {
  const int hd = s.hd, G = s.n_head / s.n_kv, kvw = s.n_kv * hd;
  std::vector<double> out(static_cast<size_t>(s.n_head) * hd, 0.0);
  std::vector<float> q(hd);
  std::vector<double> p(pos + 1);
  for (int h = 0; h < s.n_head; ++h) {
    PrepRow(qg_row + static_cast<size_t>(h) * 2 * hd, qn, s, pos, q.data());
    const int kvh = h / G;
    double mx = -INFINITY;
    for (int j = 0; j <= pos; ++j) {
      const float* kj = K.data() + static_cast<size_t>(j) * kvw + kvh * hd;
      double d = 0;
      for (int e = 0; e < hd; ++e) d += static_cast<double>(q[e]) * kj[e];
      p[j] = d / std::sqrt(static_cast<double>(hd));
      mx = std::max(mx, p[j]);
    }
    double sum = 0;
    for (int j = 0; j <= pos; ++j) sum += (p[j] = std::exp(p[j] - mx));
    double* o = out.data() + static_cast<size_t>(h) * hd;
    for (int j = 0; j <= pos; ++j) {
      const float* vj = V.data() + static_cast<size_t>(j) * kvw + kvh * hd;
      for (int e = 0; e < hd; ++e) o[e] += p[j] / sum * vj[e];
    }
    const float* gate = qg_row + static_cast<size_t>(h) * 2 * hd + hd;
    for (int e = 0; e < hd; ++e) o[e] *= 1.0 / (1.0 + std::exp(-static_cast<double>(gate[e])));
  }
  return out;
}

constexpr double kTensorCoreBound = 2e-3;

struct AttnCase {
  GgmlType type;
  int n_head, n_kv, hd, n_rot;
  int T_prefill;  // tokens prefilled through AttnPrefill (compared); 0 = none
  int ctx_fill;   // further tokens written by QkvPrep only (long contexts), before decoding
  int n_decode;
  int page, n_splits;
  int T_prefill2 = 0;  // a second prefill after the ctx_fill rows (pos0 > 0); 0 = none
};

void RunAttnCase(const AttnCase& ac) {
  SCOPED_TRACE(::testing::Message() << Name(ac.type) << " heads " << ac.n_head << "/" << ac.n_kv
                                    << " hd " << ac.hd << " prefill " << ac.T_prefill << " fill "
                                    << ac.ctx_fill << " splits " << ac.n_splits);
  AttnShape s{ac.n_head, ac.n_kv, ac.hd, ac.n_rot, 1e7f, 1e-6f};
  const int hd = ac.hd, kvw = ac.n_kv * hd, qgw = ac.n_head * 2 * hd, ow = ac.n_head * hd;
  const int max_len = ac.T_prefill + ac.ctx_fill + ac.T_prefill2 + ac.n_decode, slot = 1;
  Cache c(ac.type, ac.n_kv, hd, ac.page, max_len);
  auto qn = RandVec(hd, 0.5f, 1.5f), kn = RandVec(hd, 0.5f, 1.5f);
  Dev<float> dqn(qn), dkn(kn);
  // Unquantized f32 K/V as the CPU computes them, for the printed quantization error.
  std::vector<float> cpu_k(static_cast<size_t>(max_len) * kvw), cpu_v(cpu_k.size());
  auto cpu_exact = [&](int T, int pos0, const std::vector<float>& qg, const std::vector<float>& k,
                       const std::vector<float>& v) {
    std::vector<float> out(static_cast<size_t>(T) * ow);
    cpu::AttnArgs a;
    a.n_head = ac.n_head; a.n_head_kv = ac.n_kv; a.head_dim = hd; a.n_rot = ac.n_rot;
    a.rope_base = 1e7f; a.eps = 1e-6f; a.T = T; a.pos0 = pos0; a.qg = qg.data(); a.k = k.data();
    a.v = v.data(); a.q_norm = qn.data(); a.k_norm = kn.data(); a.k_cache = cpu_k.data();
    a.v_cache = cpu_v.data(); a.out = out.data();
    cpu::GatedAttention(a);
    return out;
  };
  auto quant_err = [&](const std::vector<float>& got, const std::vector<float>& exact) {
    double num = 0, den = 0;
    for (size_t i = 0; i < exact.size(); ++i) {
      num += double(got[i] - exact[i]) * (got[i] - exact[i]);
      den += double(exact[i]) * exact[i];
    }
    return std::sqrt(num / den);
  };
  // Quantization error vs unquantized KV: random K/V in [-2, 2] (K normed), observed ~1e-2 for
  // q8_0 / ~1e-1 for q4_0 on these shapes; bounds leave 3-4x room.
  const double qerr_bound = ac.type == GgmlType::Q8_0 ? 3e-2 : ac.type == GgmlType::Q4_0 ? 3e-1 : 5e-3;
  auto gemm_or = CublasGemm::Create();
  ASSERT_TRUE(gemm_or.ok());
  std::unique_ptr<CublasGemm> gemm(*gemm_or);
  int pos = 0;
  // A prefill of T tokens at positions pos0.. (after pos0 cached ones): cuBLAS and the flash
  // kernel against the double reference.
  auto prefill = [&](int T, int pos0) {
    const int G = ac.n_head / ac.n_kv, tq = 48, L = pos0 + T;
    auto qg = RandVec(static_cast<size_t>(T) * qgw, -2.f, 2.f);
    auto k = RandVec(static_cast<size_t>(T) * kvw, -2.f, 2.f);
    auto v = RandVec(static_cast<size_t>(T) * kvw, -2.f, 2.f);
    Prepped pr = RunPrep(s, c, slot, pos0, T, qg, k, v, dqn, dkn);
    Dev<uint16_t> kt(static_cast<size_t>(L) * kvw), vt(AttnPrefillVtElems(s, L));
    Dev<uint16_t> probs(static_cast<size_t>(G) * tq * L);
    Dev<float> scores(static_cast<size_t>(G) * tq * L), out(static_cast<size_t>(T) * ow);
    Dev<float> dqg(qg);
    AttnPrefillArgs a;
    a.shape = s; a.T = T; a.pos0 = pos0; a.slot = slot; a.q16 = pr.q16->p; a.qg = dqg.p;
    a.kv = c.View(); a.k_tmp = kt.p; a.v_tmp = vt.p; a.scores = scores.p; a.probs = probs.p;
    a.tq = tq; a.out = out.p;
    ASSERT_OK(AttnPrefill(a, gemm.get(), nullptr));
    const auto got = out.Down();
    const auto K = c.Rows(c.k->Down(), slot, L), V = c.Rows(c.v->Down(), slot, L);
    std::vector<double> ref(static_cast<size_t>(T) * ow);
    for (int t = 0; t < T; ++t) {
      const auto r = RefAttend(s, qg.data() + static_cast<size_t>(t) * qgw, qn, pos0 + t, K, V);
      std::copy(r.begin(), r.end(), ref.begin() + static_cast<size_t>(t) * ow);
    }
    const double rel = RelErr(got, ref, "prefill");
    const double qe = quant_err(got, cpu_exact(T, pos0, qg, k, v));
    std::printf("  %-5s prefill T %4d @%4d: rel vs dequantized-KV reference %.2e (bound 5e-3); vs "
                "unquantized KV %.2e\n", Name(ac.type), T, pos0, rel, qe);
    EXPECT_LT(rel, 5e-3);
    EXPECT_LT(qe, qerr_bound);
    if (HaveTensorCores() && AttnPrefillMmaSupports(s)) {
      // The flash kernel on the same rows: the same f16 operands as cuBLAS, same bound.
      Dev<float> out_tc(static_cast<size_t>(T) * ow);
      a.out = out_tc.p;
      a.tensor_cores = true;
      ASSERT_OK(AttnPrefill(a, gemm.get(), nullptr));
      const double rel_tc = RelErr(out_tc.Down(), ref, "prefill (tensor cores)");
      std::printf("  %-5s prefill T %4d @%4d, tensor cores: rel %.2e (bound 5e-3)\n",
                  Name(ac.type), T, pos0, rel_tc);
      EXPECT_LT(rel_tc, 5e-3);
      a.tensor_cores = false;
    }
    if (AttnPrefillWgmmaSupports(s) && AttnPrefillWgmmaAvailable()) {
      // The wgmma kernel (V gathered transposed into the same scratch): the same operands, bound.
      Dev<float> out_wg(static_cast<size_t>(T) * ow);
      a.out = out_wg.p;
      a.wgmma = true;
      ASSERT_OK(AttnPrefill(a, gemm.get(), nullptr));
      const auto got_wg = out_wg.Down();
      const double rel_wg = RelErr(got_wg, ref, "prefill (wgmma)");
      std::printf("  %-5s prefill T %4d @%4d, wgmma: rel %.2e (bound 5e-3)\n", Name(ac.type), T,
                  pos0, rel_wg);
      EXPECT_LT(rel_wg, 5e-3);
      // Every output row written (a row the kernel skipped would keep the NaN of the fill).
      Dev<float> out_nan(std::vector<float>(static_cast<size_t>(T) * ow, NAN));
      a.out = out_nan.p;
      ASSERT_OK(AttnPrefill(a, gemm.get(), nullptr));
      const auto got_again = out_nan.Down();
      for (size_t i = 0; i < got_again.size(); ++i)
        ASSERT_EQ(std::memcmp(&got_again[i], &got_wg[i], sizeof(float)), 0) << "element " << i;
      a.wgmma = false;
    }
    pos = L;
  };
  if (ac.T_prefill > 0) prefill(ac.T_prefill, 0);
  // Long context: more rows through QkvPrep in chunks (not compared as prefill).
  for (int done = 0; done < ac.ctx_fill;) {
    const int T = std::min(1024, ac.ctx_fill - done);
    auto qg = RandVec(static_cast<size_t>(T) * qgw, -2.f, 2.f);
    auto k = RandVec(static_cast<size_t>(T) * kvw, -2.f, 2.f);
    auto v = RandVec(static_cast<size_t>(T) * kvw, -2.f, 2.f);
    RunPrep(s, c, slot, pos, T, qg, k, v, dqn, dkn);
    // The unquantized CPU cache rows (what GatedAttention would append), without its attention.
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < ac.n_kv; ++h) {
        const size_t src = static_cast<size_t>(t) * kvw + h * hd;
        const size_t dst = static_cast<size_t>(pos + t) * kvw + h * hd;
        PrepRow(k.data() + src, kn, s, pos + t, cpu_k.data() + dst);
        std::copy(v.begin() + src, v.begin() + src + hd, cpu_v.begin() + dst);
      }
    pos += T;
    done += T;
  }
  if (ac.T_prefill2 > 0) prefill(ac.T_prefill2, pos);  // a chunk after the cached context
  for (int step = 0; step < ac.n_decode; ++step, ++pos) {
    // Two rows: row 0 a dummy sequence in slot 0 at position 0, row 1 the tracked one.
    auto qg = RandVec(static_cast<size_t>(2) * qgw, -2.f, 2.f);
    auto k = RandVec(static_cast<size_t>(2) * kvw, -2.f, 2.f);
    auto v = RandVec(static_cast<size_t>(2) * kvw, -2.f, 2.f);
    Dev<float> dqg(qg), dk(k), dv(v), q(static_cast<size_t>(2) * ow), out(static_cast<size_t>(2) * ow);
    Dev<int32_t> ds(std::vector<int32_t>{0, slot}), dp(std::vector<int32_t>{0, pos});
    Dev<int32_t> rows(std::vector<int32_t>{0, 1});
    QkvPrepArgs pa;
    pa.shape = s; pa.T = 2; pa.tok_slot = ds.p; pa.tok_pos = dp.p; pa.qg = dqg.p; pa.k = dk.p;
    pa.v = dv.p; pa.q_norm = dqn.p; pa.k_norm = dkn.p; pa.q_out = q.p; pa.kv = c.View();
    ASSERT_OK(QkvPrep(pa, nullptr));
    Dev<float> parts(AttnDecodePartialFloats(s, 2, ac.n_splits));
    AttnDecodeArgs a;
    a.shape = s; a.n_seqs = 2; a.rows = rows.p; a.slots = ds.p; a.pos = dp.p; a.q = q.p;
    a.qg = dqg.p; a.kv = c.View(); a.n_splits = ac.n_splits; a.partials = parts.p; a.out = out.p;
    ASSERT_OK(AttnDecode(a, nullptr));
    const auto all = out.Down();
    const std::vector<float> got(all.begin() + ow, all.end());
    const auto K = c.Rows(c.k->Down(), slot, pos + 1), V = c.Rows(c.v->Down(), slot, pos + 1);
    const auto ref = RefAttend(s, qg.data() + qgw, qn, pos, K, V);
    const double rel = RelErr(got, ref, "decode");
    std::vector<float> qg1(qg.begin() + qgw, qg.end()), k1(k.begin() + kvw, k.end()),
        v1(v.begin() + kvw, v.end());
    const double qe = quant_err(got, cpu_exact(1, pos, qg1, k1, v1));
    std::printf("  %-5s decode @%5d (%2d splits): rel vs dequantized-KV reference %.2e (bound "
                "1e-4); vs unquantized KV %.2e\n", Name(ac.type), pos, ac.n_splits, rel, qe);
    EXPECT_LT(rel, 1e-4);
    EXPECT_LT(qe, qerr_bound);
    if (HaveTensorCores()) {
      // The tensor-core kernel on the same rows: f16 P, K (and V's scale times P) cost ~2^-11
      // relative per operand, observed a few 1e-4 on these shapes.
      Dev<float> out_tc(static_cast<size_t>(2) * ow);
      a.out = out_tc.p;
      a.tensor_cores = true;
      ASSERT_OK(AttnDecode(a, nullptr));
      const auto all_tc = out_tc.Down();
      const std::vector<float> got_tc(all_tc.begin() + ow, all_tc.end());
      const double rel_tc = RelErr(got_tc, ref, "decode (tensor cores)");
      std::printf("  %-5s decode @%5d (%2d splits), tensor cores: rel %.2e (bound %.0e)\n",
                  Name(ac.type), pos, ac.n_splits, rel_tc, kTensorCoreBound);
      EXPECT_LT(rel_tc, kTensorCoreBound);
    }
  }
}

constexpr GgmlType kQuantTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0};
// f16 runs the same harness as a control (the refactored f16 paths, same bounds).
constexpr GgmlType kAllTypes[] = {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0};

TEST(KvQuantAttention, Shape27B) {
  for (GgmlType t : kAllTypes) RunAttnCase({t, 24, 4, 256, 64, 300, 0, 2, 64, 5});
  // A second prefill chunk at position 1,333 (as a long prompt's later chunks run).
  for (GgmlType t : kAllTypes) RunAttnCase({t, 24, 4, 256, 64, 333, 1000, 1, 64, 5, 260});
}
// Long contexts on the 27B shape, at the split counts the backend uses (66 at one sequence, 16 at
// four) and a tail of 1 + prefetch remainder.
TEST(KvQuantAttention, Shape27BLongContext) {
  for (GgmlType t : kQuantTypes) {
    RunAttnCase({t, 24, 4, 256, 64, 0, 4099, 1, 64, 66});
    RunAttnCase({t, 24, 4, 256, 64, 0, 2600, 2, 64, 16});
  }
}
// Odd small shapes: every hd (32..256 -> 1..8 elements per lane), GQA groups 1..6 incl. 3 (run by
// the 4-wide kernel), pages of 16, decode-only and prefill+decode, split tails.
TEST(KvQuantAttention, OddSmallShapes) {
  for (GgmlType t : kAllTypes) {
    RunAttnCase({t, 4, 2, 64, 16, 53, 0, 3, 16, 3});
    RunAttnCase({t, 4, 2, 32, 8, 53, 0, 3, 16, 3});
    RunAttnCase({t, 6, 2, 64, 16, 130, 0, 2, 16, 4});
    RunAttnCase({t, 6, 1, 128, 32, 709, 0, 2, 64, 9});
    RunAttnCase({t, 6, 1, 128, 32, 0, 0, 4, 16, 9});  // decode-only from position 0
    RunAttnCase({t, 2, 2, 256, 64, 0, 1000, 2, 32, 7});
    RunAttnCase({t, 8, 1, 32, 32, 0, 333, 2, 16, 1});  // group 8, one split
    // A prefill chunk after cached context (the flash kernel's causal diagonal off tile edges).
    RunAttnCase({t, 8, 1, 64, 16, 37, 70, 1, 16, 3, 45});
    RunAttnCase({t, 6, 2, 128, 32, 0, 100, 1, 64, 4, 77});
  }
}

// ---------------------------------------------------------------------------------------------
// Decode attention at 32k and 192k contexts, 27B shape (one layer; x16 layers per token). A benchmark, not a
// test (DISABLED_: ctest skips it; docs/conventions.md "Benchmarks"); run it with
//   kv_quant_cuda_test --gtest_also_run_disabled_tests --gtest_filter='KvQuantTiming.*'

TEST(KvQuantTiming, DISABLED_Decode32k27B) {
  const int n_head = 24, n_kv = 4, hd = 256, page = 64;
  AttnShape s{n_head, n_kv, hd, 64, 1e7f, 1e-6f};
  const int qgw = n_head * 2 * hd, ow = n_head * hd;
  for (int ctx : {32768, 196608})
  for (int n_seqs : {1, 4}) {
    // Splits as CudaDevice::AttnSplits: 2 blocks per SM of 132 (~one wave of the tensor-core
    // kernel's 4-warp blocks, two of the SIMT kernel's), no split under 256 tokens; the
    // tensor-core kernel also at 3 per SM (its occupancy limit) for comparison.
    const int n_splits2 = std::min(std::max(1, 264 / (n_kv * n_seqs)), (ctx + 255) / 256);
    for (GgmlType t : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0})
    for (int variant : {0, 1, 2}) {  // SIMT; tensor cores at 2, at 3 blocks per SM
      const bool tc = variant > 0;
      if (tc && !HaveTensorCores()) continue;
      const int n_splits = variant == 2 ? std::min(std::max(1, 396 / (n_kv * n_seqs)), (ctx + 255) / 256)
                                        : n_splits2;
      const int max_pages = (ctx + page - 1) / page;
      const int64_t rb = static_cast<int64_t>(GgmlRowBytes(t, hd));
      const size_t bytes = static_cast<size_t>(n_seqs) * max_pages * page * n_kv * rb;
      Dev<uint8_t> k(bytes), v(bytes);
      // Benign contents: 0x11 bytes are small finite halves / scales (0x1111 = 5.3e-4).
      CK(cudaMemset(k.p, 0x11, bytes));
      CK(cudaMemset(v.p, 0x11, bytes));
      std::vector<int32_t> table(static_cast<size_t>(n_seqs) * max_pages);
      for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
      Dev<int32_t> dt(table);
      std::vector<int32_t> rows(n_seqs), slots(n_seqs), posv(n_seqs, ctx - 1);
      for (int i = 0; i < n_seqs; ++i) rows[i] = slots[i] = i;
      Dev<int32_t> drows(rows), dslots(slots), dpos(posv);
      Dev<float> q(RandVec(static_cast<size_t>(n_seqs) * ow, -0.1f, 0.1f));
      Dev<float> qg(RandVec(static_cast<size_t>(n_seqs) * qgw, -1.f, 1.f));
      Dev<float> out(static_cast<size_t>(n_seqs) * ow);
      Dev<float> parts(AttnDecodePartialFloats(s, n_seqs, n_splits));
      AttnDecodeArgs a;
      a.shape = s; a.n_seqs = n_seqs; a.rows = drows.p; a.slots = dslots.p; a.pos = dpos.p;
      a.q = q.p; a.qg = qg.p; a.kv = KvCacheView{k.p, v.p, dt.p, page, max_pages, n_kv, hd, t};
      a.n_splits = n_splits; a.partials = parts.p; a.out = out.p; a.tensor_cores = tc;
      const double us = MeanLaunchUs(5, 100, [&] { return AttnDecode(a, nullptr); });
      const double kv_bytes = 2.0 * n_seqs * ctx * n_kv * rb;
      std::printf("  decode attention @%d x%d, %-5s %s (%2d splits): %7.1f us/layer call, "
                  "x16 layers %.2f ms/step, KV read %.1f MB -> %.2f TB/s\n",
                  ctx, n_seqs, Name(t), tc ? "mma " : "simt", n_splits, us, 16 * us * 1e-3, kv_bytes * 1e-6,
                  kv_bytes / (us * 1e-6) * 1e-12);
      for (float x : out.Down()) ASSERT_TRUE(std::isfinite(x));
    }
  }
}

// Prefill attention kernels alone (the gathered f16 K/V already in place): a 4,096-token chunk
// of the 27B shape after 0, 28,672 and 126,976 cached tokens, the mma.sync flash kernel against
// the wgmma one (where the build and GPU have it). Printed: us per layer call and TFLOPS of the
// causal products (4 x hd x n_head per visible (query, key) pair).
TEST(KvQuantTiming, DISABLED_Prefill27B) {
  const int n_head = 24, n_kv = 4, hd = 256, T = 4096;
  AttnShape s{n_head, n_kv, hd, 64, 1e7f, 1e-6f};
  if (!HaveTensorCores()) GTEST_SKIP() << "needs sm_80+";
  for (int pos0 : {0, 28672, 126976}) {
    const int L = pos0 + T;
    const size_t kv_elems = static_cast<size_t>(L) * n_kv * hd;
    Dev<uint16_t> kt(kv_elems), vt(AttnPrefillVtElems(s, L)),
        q16(static_cast<size_t>(T) * n_head * hd);
    Dev<float> qg(static_cast<size_t>(T) * n_head * 2 * hd),
        out(static_cast<size_t>(T) * n_head * hd);
    // Benign contents: 0x11 bytes are small finite halves (0x1111 = 5.3e-4); gates 0.
    CK(cudaMemset(kt.p, 0x11, kt.n * 2));
    CK(cudaMemset(vt.p, 0x11, vt.n * 2));
    CK(cudaMemset(q16.p, 0x11, q16.n * 2));
    CK(cudaMemset(qg.p, 0, qg.n * 4));
    AttnPrefillArgs a;
    a.shape = s;
    a.T = T;
    a.pos0 = pos0;
    a.q16 = q16.p;
    a.qg = qg.p;
    a.k_tmp = kt.p;
    a.v_tmp = vt.p;
    a.out = out.p;
    a.tensor_cores = true;
    const double flops = 4.0 * hd * n_head * (static_cast<double>(T) * pos0 + T * (T + 1.0) / 2);
    for (int wg : {0, 1}) {
      if (wg == 1 && !AttnPrefillWgmmaAvailable()) continue;
      a.wgmma = wg == 1;
      auto launch = [&] {
        return wg == 1 ? LaunchAttnPrefillWgmma(a, nullptr) : LaunchAttnPrefillMma(a, nullptr);
      };
      const double us = MeanLaunchUs(2, pos0 > 100000 ? 3 : 10, launch);
      std::printf("  prefill attention T %d @%6d, %-6s: %9.1f us/layer call, %.0f TFLOPS\n", T,
                  pos0, wg == 1 ? "wgmma" : "mma", us, flops / (us * 1e-6) * 1e-12);
      for (float x : out.Down()) ASSERT_TRUE(std::isfinite(x));
    }
  }
}

}  // namespace
}  // namespace ds::cuda
