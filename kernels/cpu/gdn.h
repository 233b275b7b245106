// Gated DeltaNet (spec/model.md §5) per-sequence CPU reference: causal conv, gates, and the delta
// rule in two mathematically identical forms (per-token recurrence for decode, chunked WY form
// §5.4 for prefill). State is f32 throughout.
#pragma once
#include <cstdint>

namespace ds {
class ThreadPool;
}

namespace ds::cpu {

struct GdnDims {
  int k_heads = 0;      // Hk
  int v_heads = 0;      // Hv (multiple of Hk); value head h reads key head h % Hk (tiled, §5.3)
  int k_dim = 0;        // dk
  int v_dim = 0;        // dv
  int conv_kernel = 0;  // K
  int channels() const { return 2 * k_heads * k_dim + v_heads * v_dim; }
};

// Depthwise causal conv + SiLU over time for T rows of C channels (§5.2 step 2).
//   x     [T, C]      pre-conv rows m
//   w     [C, K]      taps; tap K-1 multiplies the current row
//   state [K-1, C]    the last K-1 pre-conv rows before x (oldest first); updated to the last K-1
//                     rows of (state ++ x)
//   y     [T, C]      silu(conv), must not alias x
void CausalConvSilu(const float* x, int64_t T, int C, const float* w, int K, float* state,
                    float* y);

// g[t,h] = ssm_a[h] · softplus(alpha[t,h] + dt_bias[h]);  beta[t,h] = sigmoid(b[t,h]).
// alpha, b, g, beta: [T, Hv].  g and beta may alias alpha and b.
void GdnGates(const float* alpha, const float* b, int64_t T, int Hv, const float* ssm_a,
              const float* dt_bias, float* g, float* beta);

// Inputs of the delta rule for one sequence. q/k are already l2-normalised (q also scaled by
// 1/sqrt(dk)). Rows may be strided so q/k/v can point into the conv output.
struct DeltaRuleArgs {
  GdnDims dims;
  int64_t T = 0;
  const float* q = nullptr;  int64_t ldq = 0;  // [T, Hk*dk] (row stride ldq)
  const float* k = nullptr;  int64_t ldk = 0;  // [T, Hk*dk]
  const float* v = nullptr;  int64_t ldv = 0;  // [T, Hv*dv]
  const float* g = nullptr;                    // [T, Hv] log-decay (≤ 0)
  const float* beta = nullptr;                 // [T, Hv]
  float* state = nullptr;                      // [Hv, dk, dv] in/out
  float* out = nullptr;  int64_t ldo = 0;      // [T, Hv*dv]
  ThreadPool* pool = nullptr;                  // heads run in parallel on it; nullptr = serial
  // Emulates a state stored in bf16 between steps (issue #22: its precision measured before a
  // device changes the default; docs/quality.md): the recurrence rounds the state to bf16 after
  // each token (a decode step reads and writes it once), the chunked form once at the end of the
  // call (a prefill kernel keeps it in f32 across its chunks). The output uses the f32 state.
  bool state_bf16 = false;
  // With state_bf16: the recurrence too rounds only once, at the end of the call, as the CUDA
  // prefill kernels do with a piece (kernels/cuda/gdn.cuh: both keep the state in f32 across the
  // piece and round when they store it); the reference their tests compare with.
  bool round_at_end = false;
};

// Per-token recurrence (§5.2 step 7).
void DeltaRuleRecurrent(const DeltaRuleArgs& a);
// Chunked parallel form (§5.4) with chunk size `chunk` ≥ 1 (64 in HF/FLA).
void DeltaRuleChunked(const DeltaRuleArgs& a, int chunk);

// Whole GDN mixer core for one sequence (§5.2 steps 2–8) given the projections.
struct GdnSeqArgs {
  GdnDims dims;
  int64_t T = 0;
  float eps = 1e-6f;
  const float* mixed = nullptr;    // [T, C]     W_qkv·a
  const float* z = nullptr;        // [T, Hv*dv] W_gate·a
  const float* b = nullptr;        // [T, Hv]    W_beta·a
  const float* alpha = nullptr;    // [T, Hv]    W_alpha·a
  const float* conv_w = nullptr;   // [C, K]
  const float* ssm_a = nullptr;    // [Hv]
  const float* dt_bias = nullptr;  // [Hv]
  const float* norm_w = nullptr;   // [dv] gated-norm weight (plain, no +1)
  float* conv_state = nullptr;     // [K-1, C]
  float* state = nullptr;          // [Hv, dk, dv]
  float* out = nullptr;            // [T, Hv*dv] gated, normed head outputs (input of ssm_out)
  int chunk = 0;                   // 0: recurrence; > 0: chunked form with this chunk size
  ThreadPool* pool = nullptr;      // for the per-head delta rule; nullptr = serial
  bool state_bf16 = false;         // DeltaRuleArgs::state_bf16
  bool round_at_end = false;       // DeltaRuleArgs::round_at_end
};
void GdnSequence(const GdnSeqArgs& a);

}  // namespace ds::cpu
