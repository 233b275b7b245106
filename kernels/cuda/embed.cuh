// Embedding lookup: out[t] = dequant(table row ids[t]) (spec §2 step 1), any supported format.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"

namespace ds::cuda {

// table: [n_vocab, n_embd] GGUF rows; ids: [T] device token ids (validated on the host);
// out: [T, n_embd] f32.
absl::Status EmbedRows(GgmlType type, const void* table, int n_embd, const int32_t* ids, int T,
                       float* out, cudaStream_t stream);

}  // namespace ds::cuda
