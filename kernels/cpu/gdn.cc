// Gated DeltaNet CPU reference (see gdn.h; math in spec/model.md §5.2–§5.4).
#include "kernels/cpu/gdn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/util/half.h"
#include "common/util/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace ds::cpu {
namespace {

// x = bf16(x) (round to nearest even): the state a bf16 store would give back.
void RoundToBf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = Bf16ToF32(F32ToBf16(x[i]));
}

}  // namespace

void CausalConvSilu(const float* x, int64_t T, int C, const float* w, int K, float* state,
                    float* y) {
  const int S = K - 1;
  // Row r of the virtual sequence (state ++ x), r in [0, S + T).
  auto row = [&](int64_t r) -> const float* { return r < S ? state + r * C : x + (r - S) * C; };
  for (int64_t t = 0; t < T; ++t) {
    float* yt = y + t * C;
    for (int c = 0; c < C; ++c) {
      float acc = 0.f;
      // Output t covers virtual rows t .. t+K-1; tap j multiplies row t+j (tap K-1 = current).
      for (int j = 0; j < K; ++j) acc += w[c * K + j] * row(t + j)[c];
      yt[c] = Silu(acc);
    }
  }
  if (S == 0) return;
  // New state = last S rows of (state ++ x).
  std::vector<float> ns(static_cast<size_t>(S) * C);
  for (int r = 0; r < S; ++r) std::memcpy(&ns[static_cast<size_t>(r) * C], row(T + r), C * 4);
  std::memcpy(state, ns.data(), ns.size() * 4);
}

void GdnGates(const float* alpha, const float* b, int64_t T, int Hv, const float* ssm_a,
              const float* dt_bias, float* g, float* beta) {
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < Hv; ++h) {
      const int64_t i = t * Hv + h;
      const float gi = ssm_a[h] * Softplus(alpha[i] + dt_bias[h]);
      const float bi = Sigmoid(b[i]);
      g[i] = gi;
      beta[i] = bi;
    }
}

void DeltaRuleRecurrent(const DeltaRuleArgs& a) {
  const int Hk = a.dims.k_heads, Hv = a.dims.v_heads, dk = a.dims.k_dim, dv = a.dims.v_dim;
  auto heads = [&](int64_t h0, int64_t h1) {
  std::vector<float> u(dv);
  for (int h = static_cast<int>(h0); h < h1; ++h) {
    const int kh = h % Hk;                         // tiled mapping (§5.3)
    float* S = a.state + static_cast<int64_t>(h) * dk * dv;  // [dk, dv]
    for (int64_t t = 0; t < a.T; ++t) {
      const float* q = a.q + t * a.ldq + kh * dk;  // [dk]
      const float* k = a.k + t * a.ldk + kh * dk;  // [dk]
      const float* v = a.v + t * a.ldv + h * dv;   // [dv]
      const float decay = std::exp(a.g[t * Hv + h]);
      const float beta = a.beta[t * Hv + h];
      for (int i = 0; i < dk * dv; ++i) S[i] *= decay;
      std::fill(u.begin(), u.end(), 0.f);
      for (int i = 0; i < dk; ++i)
        for (int j = 0; j < dv; ++j) u[j] += S[i * dv + j] * k[i];
      for (int j = 0; j < dv; ++j) u[j] = beta * (v[j] - u[j]);  // δ
      for (int i = 0; i < dk; ++i)
        for (int j = 0; j < dv; ++j) S[i * dv + j] += k[i] * u[j];
      float* o = a.out + t * a.ldo + h * dv;  // [dv]
      for (int j = 0; j < dv; ++j) o[j] = 0.f;
      for (int i = 0; i < dk; ++i)
        for (int j = 0; j < dv; ++j) o[j] += S[i * dv + j] * q[i];
      if (a.state_bf16 && !a.round_at_end) RoundToBf16(S, static_cast<int64_t>(dk) * dv);
    }
    if (a.state_bf16 && a.round_at_end) RoundToBf16(S, static_cast<int64_t>(dk) * dv);
  }
  };
  if (a.pool)
    // Split heads only when a part carries enough work to pay for waking a thread (see MatMul).
    a.pool->ParallelFor(Hv, heads,
                        std::max<int64_t>(1, (int64_t{1} << 18) /
                                                 std::max<int64_t>(1, int64_t{4} * a.T * dk * dv)));
  else
    heads(0, Hv);
}

void DeltaRuleChunked(const DeltaRuleArgs& a, int chunk) {
  const int Hk = a.dims.k_heads, Hv = a.dims.v_heads, dk = a.dims.k_dim, dv = a.dims.v_dim;
  const int Cn = std::max(1, chunk);
  auto heads = [&](int64_t h0, int64_t h1) {
  // Per-chunk scratch, sized for a full chunk.
  std::vector<float> gam(Cn), eg(Cn), A(static_cast<size_t>(Cn) * Cn), U(static_cast<size_t>(Cn) * dv),
      W(static_cast<size_t>(Cn) * dk), QK(static_cast<size_t>(Cn) * Cn);
  for (int h = static_cast<int>(h0); h < h1; ++h) {
    const int kh = h % Hk;
    float* S = a.state + static_cast<int64_t>(h) * dk * dv;  // [dk, dv]
    for (int64_t c0 = 0; c0 < a.T; c0 += Cn) {
      // A short last chunk is simply a chunk with n < Cn: identical to zero-padding (g = β = 0).
      const int n = static_cast<int>(std::min<int64_t>(Cn, a.T - c0));
      auto Kr = [&](int r) { return a.k + (c0 + r) * a.ldk + kh * dk; };  // [dk]
      auto Qr = [&](int r) { return a.q + (c0 + r) * a.ldq + kh * dk; };  // [dk]
      auto Vr = [&](int r) { return a.v + (c0 + r) * a.ldv + h * dv; };   // [dv]
      auto Br = [&](int r) { return a.beta[(c0 + r) * Hv + h]; };
      float acc = 0.f;
      for (int r = 0; r < n; ++r) {
        acc += a.g[(c0 + r) * Hv + h];
        gam[r] = acc;                // γ_r, inclusive cumsum
        eg[r] = std::exp(acc);       // e^{γ_r} ≤ 1
      }
      // A_rs = β_r (k_r·k_s) e^{γ_r−γ_s} for s < r. Only s ≤ r is ever exponentiated, so the
      // exponent is ≤ 0 (the masked upper triangle is never formed; no inf·0).
      for (int r = 0; r < n; ++r)
        for (int s = 0; s < r; ++s) {
          const float* kr = Kr(r);
          const float* ks = Kr(s);
          float d = 0.f;
          for (int i = 0; i < dk; ++i) d += kr[i] * ks[i];
          A[r * Cn + s] = Br(r) * d * std::exp(gam[r] - gam[s]);
        }
      // Forward substitution with the unit lower-triangular (I + A):
      //   U = (I+A)^{-1} diag(β) V,   W = (I+A)^{-1} diag(β e^γ) K.
      for (int r = 0; r < n; ++r) {
        float* ur = &U[static_cast<size_t>(r) * dv];
        float* wr = &W[static_cast<size_t>(r) * dk];
        const float br = Br(r);
        const float* vr = Vr(r);
        const float* kr = Kr(r);
        for (int j = 0; j < dv; ++j) ur[j] = br * vr[j];
        for (int i = 0; i < dk; ++i) wr[i] = br * eg[r] * kr[i];
        for (int s = 0; s < r; ++s) {
          const float ars = A[r * Cn + s];
          const float* us = &U[static_cast<size_t>(s) * dv];
          const float* ws = &W[static_cast<size_t>(s) * dk];
          for (int j = 0; j < dv; ++j) ur[j] -= ars * us[j];
          for (int i = 0; i < dk; ++i) wr[i] -= ars * ws[i];
        }
      }
      // V' = U − W S  (stored in U).
      for (int r = 0; r < n; ++r) {
        float* ur = &U[static_cast<size_t>(r) * dv];
        const float* wr = &W[static_cast<size_t>(r) * dk];
        for (int i = 0; i < dk; ++i) {
          const float wi = wr[i];
          const float* Si = S + static_cast<int64_t>(i) * dv;
          for (int j = 0; j < dv; ++j) ur[j] -= wi * Si[j];
        }
      }
      // (Q Kᵀ ⊙ D)_rs for s ≤ r (D_rr = 1).
      for (int r = 0; r < n; ++r)
        for (int s = 0; s <= r; ++s) {
          const float* qr = Qr(r);
          const float* ks = Kr(s);
          float d = 0.f;
          for (int i = 0; i < dk; ++i) d += qr[i] * ks[i];
          QK[r * Cn + s] = d * std::exp(gam[r] - gam[s]);
        }
      // O = diag(e^γ) Q S + (Q Kᵀ ⊙ D) V'.
      for (int r = 0; r < n; ++r) {
        float* o = a.out + (c0 + r) * a.ldo + h * dv;  // [dv]
        const float* qr = Qr(r);
        for (int j = 0; j < dv; ++j) o[j] = 0.f;
        for (int i = 0; i < dk; ++i) {
          const float qi = qr[i] * eg[r];
          const float* Si = S + static_cast<int64_t>(i) * dv;
          for (int j = 0; j < dv; ++j) o[j] += qi * Si[j];
        }
        for (int s = 0; s <= r; ++s) {
          const float c = QK[r * Cn + s];
          const float* us = &U[static_cast<size_t>(s) * dv];
          for (int j = 0; j < dv; ++j) o[j] += c * us[j];
        }
      }
      // S ← e^{γ_{n−1}} S + (diag(e^{γ_{n−1}−γ}) K)ᵀ V'.
      const float glast = gam[n - 1];
      const float elast = eg[n - 1];
      for (int i = 0; i < dk * dv; ++i) S[i] *= elast;
      for (int s = 0; s < n; ++s) {
        const float f = std::exp(glast - gam[s]);
        const float* ks = Kr(s);
        const float* us = &U[static_cast<size_t>(s) * dv];
        for (int i = 0; i < dk; ++i) {
          const float ki = f * ks[i];
          float* Si = S + static_cast<int64_t>(i) * dv;
          for (int j = 0; j < dv; ++j) Si[j] += ki * us[j];
        }
      }
    }
  }
  };
  if (a.pool)
    // Split heads only when a part carries enough work to pay for waking a thread (see MatMul).
    a.pool->ParallelFor(Hv, heads,
                        std::max<int64_t>(1, (int64_t{1} << 18) /
                                                 std::max<int64_t>(1, int64_t{4} * a.T * dk * dv)));
  else
    heads(0, Hv);
  if (a.state_bf16) RoundToBf16(a.state, static_cast<int64_t>(Hv) * dk * dv);
}

void GdnSequence(const GdnSeqArgs& a) {
  const GdnDims& d = a.dims;
  const int C = d.channels();
  const int Kw = d.k_heads * d.k_dim;
  const int Vw = d.v_heads * d.v_dim;
  const int64_t T = a.T;
  std::vector<float> y(static_cast<size_t>(T) * C);  // [T, C] post-conv q|k|v
  CausalConvSilu(a.mixed, T, C, a.conv_w, d.conv_kernel, a.conv_state, y.data());
  const float qscale = 1.0f / std::sqrt(static_cast<float>(d.k_dim));
  for (int64_t t = 0; t < T; ++t) {
    float* row = &y[static_cast<size_t>(t) * C];
    for (int hk = 0; hk < d.k_heads; ++hk) {
      float* q = row + hk * d.k_dim;
      float* k = row + Kw + hk * d.k_dim;
      L2Norm(q, d.k_dim, a.eps);
      for (int i = 0; i < d.k_dim; ++i) q[i] *= qscale;
      L2Norm(k, d.k_dim, a.eps);
    }
  }
  std::vector<float> g(static_cast<size_t>(T) * d.v_heads), beta(g.size());  // [T, Hv]
  GdnGates(a.alpha, a.b, T, d.v_heads, a.ssm_a, a.dt_bias, g.data(), beta.data());
  DeltaRuleArgs r;
  r.dims = d;
  r.T = T;
  r.q = y.data();
  r.ldq = C;
  r.k = y.data() + Kw;
  r.ldk = C;
  r.v = y.data() + 2 * Kw;
  r.ldv = C;
  r.g = g.data();
  r.beta = beta.data();
  r.state = a.state;
  r.out = a.out;
  r.ldo = Vw;
  r.pool = a.pool;
  r.state_bf16 = a.state_bf16;
  r.round_at_end = a.round_at_end;
  if (a.chunk > 0)
    DeltaRuleChunked(r, a.chunk);
  else
    DeltaRuleRecurrent(r);
  // Gated RMSNorm per value head (§3.2): RMSNorm(o; w) · silu(z).
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < d.v_heads; ++h) {
      float* o = a.out + t * Vw + h * d.v_dim;
      const float* z = a.z + t * Vw + h * d.v_dim;
      RmsNorm(o, a.norm_w, d.v_dim, a.eps, o);
      for (int j = 0; j < d.v_dim; ++j) o[j] *= Silu(z[j]);
    }
}

}  // namespace ds::cpu
