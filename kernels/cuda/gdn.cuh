// Gated DeltaNet mixer core on the GPU (spec §5.2 steps 2-8): causal conv + SiLU, q/k l2norm,
// gates, delta-rule update, gated RMSNorm with silu(z). Projections are done by the caller.
//
// State layout (ours, not the CPU backend's):
//   conv ring  [n_slots, K, C]      pre-conv row of position p lives in ring row p % K, so a
//                                   decode step reads rows p-K+1..p-1 and writes row p: no two
//                                   blocks of one launch ever read a row another one writes.
//                                   A fresh slot is all zeros (rows of negative positions).
//   delta rule [n_slots, Hv, dk, dv] f32, or bf16 with `state_bf16` (dv contiguous: a block's
//                                   threads j read S[k][j] coalesced and keep column j in
//                                   registers).
//
// A bf16 state (CudaBackendOptions::gdn_state_bf16, issue #22: half the bytes a batched decode
// moves per step) is only its storage: every kernel loads it into f32, computes in f32 exactly as
// with the f32 state, and stores it rounded to nearest even. A decode step rounds after every
// token (a run's later tokens continue from the rounded value, as a launch per token would); a
// prefill piece keeps the state in f32 across its tokens and rounds once when it stores it
// (kernels/cpu/gdn.h DeltaRuleArgs::state_bf16 / round_at_end is the reference). The conversions
// need no bf16 arithmetic: the bf16 form runs on sm_70 too.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

// Bytes of one element of the delta-rule state (the worker sizes, copies and saves it by this).
constexpr size_t GdnStateElemBytes(bool state_bf16) { return state_bf16 ? 2 : 4; }

struct GdnShape {
  int k_heads = 0;      // Hk
  int v_heads = 0;      // Hv; value head h reads key head h % Hk (tiled order, §5.3)
  int k_dim = 0;        // dk: 16, 32, 64 or 128
  int v_dim = 0;        // dv: multiple of 16, >= dk, <= 128
  int conv_kernel = 0;  // K: 4
  constexpr int channels() const { return 2 * k_heads * k_dim + v_heads * v_dim; }
};

struct GdnLayerParams {
  const float* conv_w = nullptr;   // [C, K] taps, tap K-1 multiplies the current row
  const float* ssm_a = nullptr;    // [Hv] = -exp(A_log)
  const float* dt_bias = nullptr;  // [Hv]
  const float* norm_w = nullptr;   // [dv]
  float eps = 1e-6f;               // rms eps, also used inside the l2norm rsqrt(Σx² + eps)
};

// Decode: one token for each of n_seqs sequences, fully fused (one launch per layer).
struct GdnDecodeArgs {
  GdnShape shape;
  GdnLayerParams p;
  int n_seqs = 0;
  const int32_t* rows = nullptr;   // [n_seqs] device: row of the sequence's token in the buffers
  const int32_t* slots = nullptr;  // [n_seqs] device: state index written (and read)
  // Speculative verify (RowRun::spec_entry): [n_seqs] device state index read, or null = slots.
  // Where in_slots[i] != slots[i] the step reads the ring + state at in_slots[i] and writes the
  // updated ones at slots[i] (the K-1 earlier ring rows copied along), leaving the input alone;
  // the arithmetic is the same as in place.
  const int32_t* in_slots = nullptr;
  const int32_t* pos = nullptr;    // [n_seqs] device: position of the token
  // Runs of several tokens of one sequence (a decode-path replay, a speculative verify): when
  // run_first is set, n_seqs counts runs and run r's tokens are entries [run_first[r],
  // run_first[r] + run_len[r]) of rows / slots / pos (in_slots: its first entry's), taken one
  // after another by one block per head with the state and the conv history in registers: one
  // read of the state per run instead of one per token. Token e writes its state at slots[e]
  // (a speculative entry each, or the slot itself) and reads the previous token's: bit-identical
  // to one launch per token (a wave) in order.
  const int32_t* run_first = nullptr;
  const int32_t* run_len = nullptr;
  bool early = false;  // launched early (common.cuh, LaunchMaybeEarly; decode steps on sm_90+)
  // Launched early, the blocks ask for their state (and read the index arrays it takes: rows,
  // slots, in_slots, pos, run_first / run_len) before waiting for the kernel ahead, so the
  // first blocks' state reads overlap its tail. Only for callers where no kernel of the step
  // between the last completed one and this launch writes those states or index arrays (the
  // worker: the layer's projections run between; the states are written by this layer's GDN
  // launches alone, so only its first GDN launch of a step qualifies: a decode_path run's next
  // wave reads the states the wave just before it writes). Everything else is read after the
  // wait, as without it. Same bits.
  bool state_early = false;
  // Launches of many blocks (heads x sequences >= 256) bring each head's state into shared
  // memory by one bulk copy instead of into registers, three blocks per SM instead of two
  // (sm_90: GdnBulkStateAvailable(); kernels/cuda/README.md "Gated DeltaNet"). The same bits.
  bool bulk_state = false;
  // Runs (run_first set) of a launch of few blocks: token c of each chunk gets its prologue and
  // epilogue in thread group c % groups instead of all in group 0 (gdn.cu, GdnDecodeRunKernel's
  // kSpreadTokens). The same bits.
  bool spread_run_tokens = false;
  // Launches of few blocks (the run kernel, runs or single tokens) at dk = 64: one thread group
  // per head, each thread holding its whole state column, so no barrier per token
  // (GdnDecodeRunKernel's kOneGroup). The same bits. Before spread_run_tokens where both apply.
  bool one_group_runs = false;
  bool state_bf16 = false;         // the state's storage type (see the top of this file)
  const float* mixed = nullptr;    // [T, C]     W_qkv·a
  const float* z = nullptr;        // [T, Hv*dv] W_gate·a
  const float* b = nullptr;        // [T, Hv]    W_beta·a
  const float* alpha = nullptr;    // [T, Hv]    W_alpha·a
  float* conv_ring = nullptr;      // [n_states, K, C]   (n_states >= every index in slots / in_slots)
  void* state = nullptr;           // [n_states, Hv, dk, dv] f32, or bf16 with state_bf16
  float* out = nullptr;            // [T, Hv*dv]  rows as above
  // Optional (issue #22: it was a launch of its own per GDN layer and decode step): the int8
  // copy of the output for the next matmul (QuantizeActivations' layout and bits,
  // kernels/cuda/quantize_block.cuh): xq [T, Hv*dv], xd [T, Hv*dv/32], and with xsum (one-row
  // steps) the 16-element sums [Hv*dv/16] of row 0. Needs dv % 32 == 0.
  int8_t* xq = nullptr;
  float* xd = nullptr;
  int32_t* xsum = nullptr;
};
absl::Status GdnDecode(const GdnDecodeArgs& a, cudaStream_t stream);
// Whether GdnDecodeArgs::bulk_state can run here: an sm_90+ device and this build's sm_90 code.
bool GdnBulkStateAvailable();

// Prefill of T tokens of one sequence (rows 0..T-1 of the given buffers). Two forms of the delta
// rule (spec §5.2 step 7 / §5.4), the same math:
//   chunk = 0: per-token recurrence with the state in registers (one block per value head), as
//              llama.cpp's fused op does: T dependent steps;
//   chunk = kGdnChunk: the chunked (WY) form (gdn_chunk.cuh): the parts that do not depend on
//              the state for all chunks in parallel, then T / 32 dependent steps of three small
//              matrix products per (value head, 32 state columns); needs `wy` scratch of
//              GdnChunkScratchFloats(shape, T) floats (falls back to the recurrence where the
//              device lacks the 76 KB of shared memory, sm_75).
constexpr int kGdnChunk = 32;
struct GdnPrefillArgs {
  GdnShape shape;
  GdnLayerParams p;
  int T = 0;
  int chunk = 0;  // 0 or kGdnChunk
  int slot = 0;
  int pos0 = 0;
  const float* mixed = nullptr;  // [T, C]
  const float* z = nullptr;      // [T, Hv*dv]
  const float* b = nullptr;      // [T, Hv]
  const float* alpha = nullptr;  // [T, Hv]
  float* conv_ring = nullptr;    // [n_slots, K, C]
  void* state = nullptr;         // [n_slots, Hv, dk, dv] f32, or bf16 with state_bf16 (rounded
                                 // once, when the piece stores it)
  float* y = nullptr;            // [T, C] scratch (conv output, q/k normalised in place; the
                                 // chunked form writes its U over v)
  float* g = nullptr;            // [T, Hv] scratch (the chunked form: γ within each chunk)
  float* beta = nullptr;         // [T, Hv] scratch
  float* out = nullptr;          // [T, Hv*dv]
  float* wy = nullptr;           // chunked form: scratch of GdnChunkScratchFloats(shape, T)
  bool state_bf16 = false;       // the state's storage type (see the top of this file)
  // The chunked form's scan on TF32 tensor cores (gdn_chunk_scan_mma.cuh; sm_80+ only: the
  // caller checks the device), else in f32 on CUDA cores. Same math, f32-level accuracy either way.
  bool scan_mma = false;
};
// Floats of the chunked form's scratch for T tokens (W and Q Kᵀ of every chunk and value head).
int64_t GdnChunkScratchFloats(const GdnShape& s, int T);
absl::Status GdnPrefill(const GdnPrefillArgs& a, cudaStream_t stream);

// Host-side check of the supported shapes.
absl::Status GdnShapeSupported(const GdnShape& s);

}  // namespace ds::cuda
