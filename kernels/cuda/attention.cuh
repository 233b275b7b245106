// Gated full attention on the GPU (spec §6.2): per-head q/k RMSNorm + partial NeoX RoPE + KV
// write into a paged f16 / q8_0 / q4_0 cache, split-K decode attention (flash-decoding) with GQA
// and the fused sigmoid output gate, and a cuBLAS-based causal prefill attention.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"
#include "kernels/cuda/gemm.cuh"

namespace ds::cuda {

// Paged KV cache of one layer. Token `pos` of slot `s` lives in page
// block_table[s * max_pages + pos / page_size], row pos % page_size. Element type `type`:
// F16 (hd halves per head row), or GGML blocks of 32 along head_dim (hd/32 blocks per head row):
// Q8_0 (34 B: f16 d, int8 q[32]; x = d*q) or Q4_0 (18 B: f16 d, 16 B of nibbles; x = d*(q-8)).
// Quantization rules: kernels/cpu/kv_quant.h (the GPU blocks equal the CPU reference bitwise).
struct KvCacheView {
  void* k = nullptr;                  // [n_pages, page_size, n_kv, row_bytes] normed + roped keys
  void* v = nullptr;                  // [n_pages, page_size, n_kv, row_bytes]
  const int32_t* block_table = nullptr;  // [n_slots, max_pages] device
  int page_size = 0;
  int max_pages = 0;
  int n_kv = 0;
  int hd = 0;
  GgmlType type = GgmlType::F16;      // F16, Q8_0 or Q4_0
  // Bytes of one head row: GgmlRowBytes(type, hd).
  __host__ __device__ int64_t row_bytes() const {
    return static_cast<int64_t>(GgmlRowBytes(type, hd));
  }
};
// OK for the KV types the kernels implement (F16 any hd; Q8_0 / Q4_0 need hd % 32 == 0).
absl::Status KvTypeCheck(const KvCacheView& kv, const char* what);

struct AttnShape {
  int n_head = 0, n_kv = 0, hd = 0, n_rot = 0;
  float rope_base = 1e7f;
  float eps = 1e-6f;
};

// For every token row t < T (slot tok_slot[t], position tok_pos[t]): RMSNorm the query heads of
// qg and the key heads of k with q_norm / k_norm, rope both on the first n_rot dims, write
// q to q_out (f32) and optionally q16 (f16), and write k/v rows into the cache.
struct QkvPrepArgs {
  AttnShape shape;
  int T = 0;
  const int32_t* tok_slot = nullptr;  // [T] device
  const int32_t* tok_pos = nullptr;   // [T] device
  const float* qg = nullptr;          // [T, n_head*2*hd] per head [query | gate]
  const float* k = nullptr;           // [T, n_kv*hd]
  const float* v = nullptr;           // [T, n_kv*hd]
  const float* q_norm = nullptr;      // [hd]
  const float* k_norm = nullptr;      // [hd]
  float* q_out = nullptr;             // [T, n_head*hd]
  uint16_t* q16 = nullptr;            // [T, n_head*hd] f16, may be null
  KvCacheView kv;
  bool early = false;  // launched early (common.cuh, LaunchMaybeEarly; decode steps on sm_90+)
};
absl::Status QkvPrep(const QkvPrepArgs& a, cudaStream_t stream);

// Decode attention for n_seqs single tokens. Sequence i reads query row rows[i] of q, attends to
// cache rows [0, pos[i]] of slot slots[i], and writes out row rows[i] gated by sigmoid(gate).
struct AttnDecodeArgs {
  AttnShape shape;
  int n_seqs = 0;
  const int32_t* rows = nullptr;   // [n_seqs] device
  const int32_t* slots = nullptr;  // [n_seqs] device
  const int32_t* pos = nullptr;    // [n_seqs] device
  const float* q = nullptr;        // [T, n_head*hd]
  const float* qg = nullptr;       // [T, n_head*2*hd] (gates)
  KvCacheView kv;
  int n_splits = 1;                // fixed per launch shape (CUDA graphs): blocks past a sequence's
                                   // length exit early
  float* partials = nullptr;       // [n_seqs, n_head, n_splits, hd + 2] scratch
  float* out = nullptr;            // [T, n_head*hd]
  // The f16 tensor-core kernel (attention_mma.cu, sm_80+; hd 32..256, GQA group <= 8) instead of
  // the f32 SIMT one: P and K are rounded to f16 (~1e-4..1e-3 relative), ~10x fewer instructions
  // per token, which is what bounds decode at long contexts.
  bool tensor_cores = false;
  bool early = false;  // launched early (common.cuh, LaunchMaybeEarly; decode steps on sm_90+)
};
int64_t AttnDecodePartialFloats(const AttnShape& s, int n_seqs, int n_splits);
absl::Status AttnDecode(const AttnDecodeArgs& a, cudaStream_t stream);

// Causal prefill attention of T new tokens of one sequence (positions pos0..pos0+T-1, already in
// the cache), via cuBLAS batched GEMMs over query chunks of `tq` rows. Output gated. The slot's
// K/V rows are gathered (dequantized for Q8_0 / Q4_0) into the f16 k_tmp / v_tmp first.
struct AttnPrefillArgs {
  AttnShape shape;
  int T = 0, pos0 = 0, slot = 0;
  const uint16_t* q16 = nullptr;  // [T, n_head*hd] f16
  const float* qg = nullptr;      // [T, n_head*2*hd]
  KvCacheView kv;
  uint16_t* k_tmp = nullptr;      // [pos0+T, n_kv*hd] scratch
  uint16_t* v_tmp = nullptr;      // [pos0+T, n_kv*hd] scratch; with wgmma [n_kv*hd, Lpad]:
                                  // AttnPrefillVtElems(shape, pos0+T) elements
  float* scores = nullptr;        // [G, tq, pos0+T] scratch, G = n_head/n_kv
  uint16_t* probs = nullptr;      // [G, tq, pos0+T] scratch
  int tq = 256;
  float* out = nullptr;           // [T, n_head*hd]
  // The flash kernel on f16 tensor cores (attention_prefill_mma.cu, sm_80+; hd 64/128/256, GQA
  // group <= 8) instead of the cuBLAS chunks: the same f16 operands, nothing of size queries x
  // keys in memory (scores / probs unused).
  bool tensor_cores = false;
  // The flash kernel on warpgroup tensor cores instead (attention_prefill_wgmma.cu, sm_90a only:
  // AttnPrefillWgmmaAvailable(); hd 64/128/256): the same operands, V gathered transposed.
  bool wgmma = false;
};
// Elements of v_tmp the prefill of L = pos0 + T cached tokens needs on any path (the wgmma
// kernel's transposed V is padded to whole 64-key tiles).
int64_t AttnPrefillVtElems(const AttnShape& s, int L);
absl::Status AttnPrefill(const AttnPrefillArgs& a, CublasGemm* gemm, cudaStream_t stream);

}  // namespace ds::cuda
