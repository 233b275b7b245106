// A coarse copy of a tiled Q6_K matrix for MTP drafts ("draft head"), and its one-column matmul.
//
// Why: four MTP drafts per cycle read the 27B's LM head (248,320 x 5,120 Q6_K, 1.04 GB) four
// times, ~1.07 of a 12.4 ms cycle at one stream (docs/perf/h200.md). A draft only proposes a
// token: greedy verification and the speculative sampling rule keep the output exact whatever
// distribution proposes it, so a draft may use a cheaper head as long as its argmax mostly
// agrees. This copy codes every 16 values of the Q6_K matrix in 4 bits with a bf16 scale of
// their own fitted to them (kernels/cpu/draft_head_fit.h: least squared error over 16 candidate
// scales): 2,560 bytes per 16 x 256 tile-unit instead of 3,360 (0.76x). On the trained demo
// model (`deltaserve mtp-accept --draft-heads --draft 4`, heldout text, 7,680 draft chains)
// drafts through it keep 2.2773 tokens per verify step against 2.2874 with the exact head
// (-0.44%; docs/quality.md); the top 4 of the 6 quant bits without a refit lost 0.9%, int8
// sub-block scales under one f32 scale per row 0.65%.
//
// Layout of a coarse tile-unit (kCoarseUnitBytes; tiles and units ordered as the tiled layout,
// gemv_tiled.cuh):
//   [0, 2048)    nibbles at the tiled layout's ql positions: byte j of word w at 512i + 16T is
//                row g's nibble (low) and row g+8's (high) of k = 16s + 4q + j, s = 4i + w; the
//                nibble is the code + 8 (codes -8..7)
//   [2048, 2560) bf16 sub-block scales, [16 rows][16 steps]
// The value of an element is its sub-block's scale times its code.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

constexpr int kCoarseUnitBytes = 2560;

// Bytes of the coarse copy of an [M, K] tiled Q6_K matrix. K % 256 == 0.
uint64_t CoarseBytes(int64_t M, int K);

// Writes the coarse copy of the whole tiled Q6_K matrix `tiled` [M, K] into `coarse` (one
// block per tile-unit, a thread per row and 16 values).
absl::Status CoarsenTiled(const void* tiled, int64_t M, int K, void* coarse, cudaStream_t stream);

// y[M] = coarse W · x for one int8 activation column (xq [K], xd [K/32], as QuantizeActivations
// writes them; xd 16-byte aligned). `early`: launched early (common.cuh, LaunchMaybeEarly).
absl::Status CoarseGemv(const void* coarse, int64_t M, int K, const int8_t* xq, const float* xd,
                        float* y, cudaStream_t stream, bool early = false);

}  // namespace ds::cuda
