// The whole greedy MTP draft chain of one slot in one launch (issue #15): for models whose MTP
// block is small enough that a draft pass is counted in launches, not bytes (the trained demo
// model: hidden 256, a pass of ~20 kernels cost ~47 us in a CUDA graph on the H200 for ~1 us of
// weight reads). One thread-block cluster runs every pass of CudaDevice::MtpDraftGreedy's
// chain — the mask update, [enorm(embed) | hnorm(h)] -> eh_proj, attn_norm -> q / k / v,
// q / k norms and RoPE with the K/V rows stored into the MTP plane, the masked attention, o_proj,
// the SwiGLU MLP, shared_head_norm, the LM head and its argmax — with the cluster's barrier between
// the stages that need the whole of the one before (8 per pass), and feeds each pass's argmax and
// h' to the next inside the kernel.
//
// The same arithmetic as the kernels it replaces (spec §8.2; worker/cuda/mtp.cc MtpPass), summed
// in another order: every dot product is one warp's (lanes over K, then a butterfly), the norms
// one warp's or one block's. So outputs agree with the unfused chain to f32 rounding (tests:
// mtp_gpu_test `FusedChain*`), not bit for bit; greedy outputs are unaffected either way (drafts
// only propose tokens; verification runs the trunk).
//
// What it takes (MtpChainSupported): one rank (no TP), every MTP matrix and the embedding in one
// of F32 / F16 / BF16 rows (not the tiled Q6_K layout), widths multiple of 8, head_dim a multiple
// of 32 up to 256, up to kMtpChainMaxRows catch-up rows. Bigger or quantized models keep the
// per-kernel chain, where the weight reads dominate anyway.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"
#include "kernels/cuda/attention.cuh"

namespace ds::cuda {

constexpr int kMtpChainMaxRows = 8;     // catch-up rows of the first pass
constexpr int kMtpChainThreads = 512;   // 16 warps per block
constexpr int kMtpChainMaxCluster = 16;  // blocks: one thread-block cluster

struct MtpChainMatrix {
  const void* d = nullptr;  // [rows, cols] row-major, every row 16-byte aligned
  int rows = 0, cols = 0;
  // The resident form (MtpChainArgs::resident): block b multiplies rows b, b + B, b + 2B, ...;
  // the first `res` of them are copied into its shared memory at the launch's start, at byte
  // `res_off` of the weights region (MtpChainConfigure plans them).
  int res = 0;
  uint32_t res_off = 0;
};

// A chain's per-call values, passed in the launch itself: nothing to upload before the chain, so
// it starts as soon as it is launched. Pass 0 has MtpChainArgs::n rows at positions pos0.. with
// `tokens` and hidden rows hid_row0..; pass j >= 1 one row at pos0 + n - 1 + j; every row is
// `slot`'s; the slot's MTP rows before pass 0 end at len0 (the mask update's old length; each
// later pass's is the pass before's end). The per-kernel chain's index blocks hold the same
// values (CudaDevice::MtpDraftGreedy).
//
// Judged on the device (`sampled` set; CudaDevice::QueueChainAfterVerify): the chain runs right
// behind a speculative verify's sampling, before the host has seen its tokens. Every block reads
// the verify's sampled tokens y_0..y_k and the drafts d_1..d_k it ran with, keeps the drafts
// while d_i == y_(i-1) (kept of them), and takes kept + 1 rows [d_1..d_kept, y_kept] as pass 0's
// tokens (`tokens` and MtpChainArgs::n are then ignored): the catch-up the host would have asked
// for after judging them itself (worker/spec/README.md).
struct MtpChainCall {
  int slot = 0, pos0 = 0, len0 = 0, hid_row0 = 0;
  int32_t tokens[kMtpChainMaxRows] = {};
  const int32_t* sampled = nullptr;  // [n_offered + 1], device-visible (pinned host memory)
  const int32_t* offered = nullptr;  // [n_offered] on the device
  int n_offered = 0;  // < kMtpChainMaxRows; MtpChainArgs::n = n_offered + 1 (the most rows)
};

struct MtpChainArgs {
  GgmlType type = GgmlType::F16;  // of every matrix below and of the embedding
  int H = 0, n_ff = 0, n_vocab = 0;
  float eps = 1e-6f;              // the block's RMSNorm eps
  AttnShape shape;                // the MTP layer's attention (q/k norms use shape.eps)
  MtpChainMatrix embed, eh, wq, wk, wv, wo, gate, up, down, head;
  const float *enorm = nullptr, *hnorm = nullptr, *attn_norm = nullptr, *q_norm = nullptr,
              *k_norm = nullptr, *post_norm = nullptr, *head_norm = nullptr;
  KvCacheView kv;                 // the MTP plane, F16
  uint8_t* valid = nullptr;       // [n_slots, valid_ld] row mask (mtp_attention.cuh)
  int64_t valid_ld = 0;
  MtpChainCall call;
  int n = 0;                      // rows of pass 0 (1..kMtpChainMaxRows)
  int passes = 0;                 // drafts: one per pass
  const float* hid0 = nullptr;    // pass 0's hidden rows: hid0 + (call.hid_row0 + i) * H
  int32_t* drafts = nullptr;      // [passes] out
  // Optional: each draft also into the chain's slot's row (call.slot) of these [n_slots,
  // slot_drafts_ld] buffers, one on the device and one in pinned host memory (device-visible),
  // where the next verify and the host take the drafts of a deferred chain without two more small
  // copies after it (CudaDevice::MtpDraftGreedy).
  int32_t* slot_drafts = nullptr;
  int32_t* slot_drafts_host = nullptr;
  int slot_drafts_ld = 0;
  float* hid_out = nullptr;       // [H] out: the last pass's h'
  float* logits = nullptr;        // [n_vocab] out: the last pass's logits
  // Scratch (device): u [n, H], qg [n_head * 2 * hd], k / v [n, n_kv * hd], q [n_head * hd],
  // ff [2 n_ff], parts [n_head, max_parts, hd + 2], and MtpChainBestInts() ints.
  float *u = nullptr, *qg = nullptr, *k = nullptr, *v = nullptr, *q = nullptr, *ff = nullptr,
        *parts = nullptr;
  int max_parts = 1;
  int32_t* best = nullptr;
  int blocks = 0;                 // the grid, one cluster (MtpChainConfigure)
  // The resident form (MtpChainConfigure's `resident`): the vectors a stage hands to the next go
  // from block to block through distributed shared memory (every block keeps a copy of u, q, k,
  // v, the MLP's rows and the blocks' bests), and each block keeps its rows of the matrices in
  // its shared memory for the whole chain, as many as fit (the LM head last), so a stage is a
  // barrier and local reads instead of two or three L2 round trips. The same arithmetic in the
  // same order as the global form: the same drafts bit for bit.
  bool resident = false;
  // The global form: the q / k norms, RoPE and the new K/V rows (stage S2) done by the attention
  // warps in S3, each for its own head and split, instead of a stage of their own: one cluster
  // barrier fewer per pass, the same arithmetic (CudaBackendOptions::draft_chain_fold_prep).
  bool fold_prep = false;
  // The global form: before each stage barrier every warp prefetches into L1 the first rows of
  // the next stage's matrices it will multiply (PrefetchRows), so that after the barrier their
  // loads hit L1 instead of following the input vector's L2 round trip. The same arithmetic
  // (CudaBackendOptions::draft_chain_prefetch).
  bool prefetch_weights = false;
  int smem_bytes = 0;  // dynamic shared memory of the launch (MtpChainConfigure)
};

// Ints of MtpChainArgs::best: the blocks' argmax partials (values as float bits, then indices).
constexpr int MtpChainBestInts() { return 2 * kMtpChainMaxCluster; }

// OK when the launch can take these shapes; otherwise why not.
absl::Status MtpChainSupported(const MtpChainArgs& a);
// Sets a->blocks: one thread-block cluster of up to kMtpChainMaxCluster blocks (`want` if set,
// rounded down to a power of two the device places), whose hardware barrier separates the stages;
// with `resident`, the resident form and its weight plan (a->resident, the matrices' res rows).
// Unimplemented below sm_90. (A cooperative grid of one block per SM with a barrier of atomics in
// global memory was measured first: ~2-3 us a stage on the H200, no faster than the per-kernel
// chain's launches in a graph; kernels/cuda/README.md.)
absl::Status MtpChainConfigure(MtpChainArgs* a, int device, int want, bool resident = false);
// The chain (a cluster launch, capturable in a CUDA graph).
absl::Status MtpChain(const MtpChainArgs& a, cudaStream_t stream);

}  // namespace ds::cuda
