// Gated attention kernel vs a naive f64 implementation written from spec §6.2; ops sanity.
#include "kernels/cpu/attention.h"

#include <cmath>
#include <random>
#include <vector>

#include "common/util/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"

namespace ds::cpu {
namespace {

struct Shape {
  int nh = 4, nkv = 2, hd = 16, nrot = 8;
  float base = 1e4f, eps = 1e-6f;
};

// Naive f64: per-head RMSNorm, NeoX rope on the first nrot dims, GQA h -> h / (nh/nkv),
// softmax over keys [0, pos], output ⊙ sigmoid(gate).
std::vector<double> Naive(const Shape& s, int64_t T, const std::vector<float>& qg,
                          const std::vector<float>& k, const std::vector<float>& v,
                          const std::vector<float>& qn, const std::vector<float>& kn) {
  const int hd = s.hd;
  auto norm_rope = [&](const float* x, const std::vector<float>& w, int pos) {
    std::vector<double> y(hd);
    double ss = 0;
    for (int i = 0; i < hd; ++i) ss += double(x[i]) * x[i];
    const double r = 1 / std::sqrt(ss / hd + s.eps);
    for (int i = 0; i < hd; ++i) y[i] = x[i] * r * w[i];
    const int half = s.nrot / 2;
    for (int i = 0; i < half; ++i) {
      const double th = pos * std::pow(double(s.base), -2.0 * i / s.nrot);
      const double a = y[i], b = y[i + half];
      y[i] = a * std::cos(th) - b * std::sin(th);
      y[i + half] = a * std::sin(th) + b * std::cos(th);
    }
    return y;
  };
  const int kvw = s.nkv * hd;
  std::vector<std::vector<double>> K(T * s.nkv);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < s.nkv; ++j) K[t * s.nkv + j] = norm_rope(&k[t * kvw + j * hd], kn, t);
  std::vector<double> out(T * s.nh * hd);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < s.nh; ++h) {
      const float* qs = &qg[t * s.nh * 2 * hd + h * 2 * hd];
      auto q = norm_rope(qs, qn, t);
      const int j = h / (s.nh / s.nkv);
      std::vector<double> p(t + 1);
      double mx = -1e300, sum = 0;
      for (int64_t u = 0; u <= t; ++u) {
        double d = 0;
        for (int e = 0; e < hd; ++e) d += q[e] * K[u * s.nkv + j][e];
        p[u] = d / std::sqrt(double(hd));
        mx = std::max(mx, p[u]);
      }
      for (auto& x : p) sum += (x = std::exp(x - mx));
      for (int e = 0; e < hd; ++e) {
        double o = 0;
        for (int64_t u = 0; u <= t; ++u) o += p[u] / sum * v[u * kvw + j * hd + e];
        out[t * s.nh * hd + h * hd + e] = o / (1 + std::exp(-double(qs[hd + e])));
      }
    }
  return out;
}

TEST(GatedAttention, MatchesNaiveAcrossSplitsAndThreads) {
  Shape s;
  const int64_t T = 13;
  std::mt19937 rng(7);
  std::normal_distribution<float> n01;
  const int kvw = s.nkv * s.hd;
  std::vector<float> qg(T * s.nh * 2 * s.hd), k(T * kvw), v(T * kvw), qn(s.hd), kn(s.hd);
  for (auto* x : {&qg, &k, &v}) for (auto& e : *x) e = n01(rng);
  for (auto* x : {&qn, &kn}) for (auto& e : *x) e = 1 + 0.2f * n01(rng);
  const auto ref = Naive(s, T, qg, k, v, qn, kn);
  ThreadPool pool(2);
  for (int split : {13, 1, 5}) {
    std::vector<float> kc(T * kvw), vc(T * kvw), out(T * s.nh * s.hd);
    for (int64_t t0 = 0; t0 < T; t0 += split) {
      const int64_t n = std::min<int64_t>(split, T - t0);
      AttnArgs a;
      a.n_head = s.nh;
      a.n_head_kv = s.nkv;
      a.head_dim = s.hd;
      a.n_rot = s.nrot;
      a.rope_base = s.base;
      a.eps = s.eps;
      a.T = n;
      a.pos0 = static_cast<int32_t>(t0);
      a.qg = &qg[t0 * s.nh * 2 * s.hd];
      a.k = &k[t0 * kvw];
      a.v = &v[t0 * kvw];
      a.q_norm = qn.data();
      a.k_norm = kn.data();
      a.k_cache = kc.data();
      a.v_cache = vc.data();
      a.out = &out[t0 * s.nh * s.hd];
      a.pool = split == 5 ? &pool : nullptr;
      GatedAttention(a);
    }
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-5) << "split " << split << " i " << i;
  }
}

TEST(Ops, RopeRotatesOnlyFirstNRotDims) {
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i + 1);
  auto y = x;
  RopeNeox(y.data(), 8, 3, 1e4f);
  for (int i = 8; i < 16; ++i) EXPECT_EQ(y[i], x[i]);
  // pair (0, 4) rotated by θ_0 = 3 rad.
  EXPECT_NEAR(y[0], x[0] * std::cos(3.0) - x[4] * std::sin(3.0), 1e-5);
  EXPECT_NEAR(y[4], x[0] * std::sin(3.0) + x[4] * std::cos(3.0), 1e-5);
  // norm of each pair preserved
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(y[i] * y[i] + y[i + 4] * y[i + 4], x[i] * x[i] + x[i + 4] * x[i + 4], 1e-3);
}

TEST(Ops, SoftplusSigmoidSilu) {
  EXPECT_FLOAT_EQ(Softplus(25.f), 25.f);  // PyTorch threshold 20: identity
  EXPECT_NEAR(Softplus(0.f), std::log(2.0), 1e-7);
  EXPECT_NEAR(Softplus(-30.f), std::exp(-30.0), 1e-18);
  EXPECT_NEAR(Sigmoid(0.f), 0.5f, 1e-7);
  EXPECT_NEAR(Silu(2.f), 2.0 / (1 + std::exp(-2.0)), 1e-6);
  std::vector<float> p{1.f, 2.f, 3.f, 1000.f};
  Softmax(p.data(), 4);
  EXPECT_NEAR(p[3], 1.0f, 1e-6);
  std::vector<float> q{0.f, std::log(3.f)};
  Softmax(q.data(), 2);
  EXPECT_NEAR(q[0], 0.25f, 1e-6);
}

TEST(Ops, MatMulMatchesDequantizedReferenceAndIsBatchInvariant) {
  const int64_t in = 64, out = 37, T = 5;
  std::mt19937 rng(1);
  std::normal_distribution<float> n01;
  std::vector<float> wf(out * in), x(T * in);
  for (auto& e : wf) e = n01(rng);
  for (auto& e : x) e = n01(rng);
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0}) {
    const uint64_t rb = GgmlRowBytes(type, in);
    std::vector<uint8_t> wq(rb * out);
    for (int64_t r = 0; r < out; ++r) QuantizeRow(type, &wf[r * in], &wq[r * rb], in);
    WeightView w{type, wq.data(), in, out};
    std::vector<float> y(T * out), deq(in);
    ThreadPool pool(2);
    MatMul(w, x.data(), T, y.data(), &pool);
    for (int64_t r = 0; r < out; ++r) {
      GetRow(w, r, deq.data());
      for (int64_t t = 0; t < T; ++t) {
        double ref = 0;
        for (int64_t i = 0; i < in; ++i) ref += double(deq[i]) * x[t * in + i];
        EXPECT_NEAR(y[t * out + r], ref, 1e-3 * (1 + std::abs(ref))) << GgmlInfo(type).name;
      }
    }
    // One token alone gives bit-identical rows.
    std::vector<float> y1(out);
    MatMul(w, x.data() + 3 * in, 1, y1.data(), nullptr);
    for (int64_t r = 0; r < out; ++r) EXPECT_EQ(y1[r], y[3 * out + r]);
  }
}

TEST(Ops, RmsNormAndL2Norm) {
  std::vector<float> x{3.f, 4.f}, w{1.f, 2.f}, y(2);
  RmsNorm(x.data(), w.data(), 2, 0.f, y.data());
  const double r = std::sqrt(12.5);
  EXPECT_NEAR(y[0], 3 / r, 1e-6);
  EXPECT_NEAR(y[1], 8 / r, 1e-6);
  L2Norm(x.data(), 2, 0.f);
  EXPECT_NEAR(x[0], 0.6f, 1e-7);
  EXPECT_NEAR(x[1], 0.8f, 1e-7);
}

}  // namespace
}  // namespace ds::cpu
