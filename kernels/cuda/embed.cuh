// Embedding lookup: out[t] = dequant(table row ids[t]) (spec §2 step 1), any supported format.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"

namespace ds::cuda {

// table: [n_vocab, n_embd] GGUF rows; ids: [T] device token ids (validated on the host);
// out: [T, n_embd] f32.
//
// Vocab-parallel (tensor parallelism, docs/tp.md §3): `table` holds only vocabulary rows
// [v0, v1) (row id - v0); a token outside them gets a zero row, and the group's all-reduce then
// gives every rank the full embedding (exactly: one rank adds its row to zeros). v1 < 0: the
// whole vocabulary, v0 = 0.
//
// chain_ids (optional): an id below zero names its token by where it is, ids[t] = -(1 + i)
// reading chain_ids[i] at run time: an MTP verify's drafts stay where the draft chain wrote
// them (CudaDevice::chain_drafts_) instead of being copied into `ids` by one more small copy
// ahead of each verify.
absl::Status EmbedRows(GgmlType type, const void* table, int n_embd, const int32_t* ids, int T,
                       float* out, cudaStream_t stream, int64_t v0 = 0, int64_t v1 = -1,
                       const int32_t* chain_ids = nullptr);

}  // namespace ds::cuda
