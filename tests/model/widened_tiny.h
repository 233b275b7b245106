// The widened tiny model shape the GPU model tests share (gpu_vs_cpu_test, batch_invariance_test).
#pragma once
#include "tools/synth/synth.h"

namespace ds {

// SynthOptions::Tiny() widened so that every matrix row is a multiple of 256: n_embd 256 (every
// projection from the residual stream, the LM head), n_ff 512 (ffn_down), n_head * head_dim =
// 4 * 64 (attn_output), Hv * dv = 4 * 64 (ssm_out), 2 * n_embd (MTP eh_proj). GDN dk 32 <= dv 64,
// Hv a multiple of Hk: supported by the CUDA kernels (GdnShapeSupported). A 256-block weight type
// (K-quants, IQ4_XS) then reaches every matrix, which the 128-wide tiny preset does not.
inline void WidenTiny(SynthOptions* o) {
  o->n_embd = 256;
  o->n_ff = 512;
  o->head_dim = 64;
  o->n_rot = 16;
  o->gdn_k_heads = 2;
  o->gdn_v_heads = 4;
  o->gdn_k_dim = 32;
  o->gdn_v_dim = 64;
}

}  // namespace ds
