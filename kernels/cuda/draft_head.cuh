// A coarse copy of a tiled Q6_K matrix for MTP drafts ("draft head"), and its one-column matmul.
//
// Why: four MTP drafts per cycle read the 27B's LM head (248,320 x 5,120 Q6_K, 1.04 GB) four
// times, ~1.07 of a 12.4 ms cycle at one stream (docs/perf/h200.md). A draft only proposes a
// token: greedy verification and the speculative sampling rule keep the output exact whatever
// distribution proposes it, so a draft may use a cheaper head as long as its argmax mostly
// agrees. This copy keeps the top 4 of each Q6_K quant's 6 bits (each value becomes the middle
// of its 4-value bucket) and the scales as they are: 2,336 bytes per 16 x 256 tile-unit instead
// of 3,360 (0.70x). On the trained demo model (`deltaserve mtp-accept --draft-heads`, heldout
// text, 3,904 draft chains) drafts through it keep 2.109 tokens per verify step against 2.110
// with the exact head (3 bits: 2.078, 2 bits: 1.987).
//
// Layout of a coarse tile-unit (kCoarseUnitBytes; tiles and units ordered as the tiled layout,
// gemv_tiled.cuh):
//   [0, 2048)    nibbles at the tiled layout's ql positions: byte j of word w at 512i + 16T is
//                row g's h (low nibble) and row g+8's (high nibble) of k = 16s + 4q + j, s = 4i+w,
//                h = q6 >> 2 for the unsigned quant q6 (0..63)
//   [2048, 2304) int8 sub-block scales, [16 rows][16 steps] (as the tiled layout)
//   [2304, 2336) f16 d, pairs (row g, row g+8) for g = 0..7 (as the tiled layout)
// The value of an element is d * sc * (4h + 1.5 - 32); the kernel feeds 8h - 61 (= 2x that
// bracket, an int8) to `mma.m16n8k16.s8` and halves d (exact).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

constexpr int kCoarseUnitBytes = 2336;

// Bytes of the coarse copy of an [M, K] tiled Q6_K matrix. K % 256 == 0.
uint64_t CoarseBytes(int64_t M, int K);

// Writes the coarse copy of the whole tiled Q6_K matrix `tiled` [M, K] into `coarse`.
absl::Status CoarsenTiled(const void* tiled, int64_t M, int K, void* coarse, cudaStream_t stream);

// y[M] = coarse W · x for one int8 activation column (xq [K], xd [K/32], as QuantizeActivations
// writes them; xd 16-byte aligned). `early`: launched early (common.cuh, LaunchMaybeEarly).
absl::Status CoarseGemv(const void* coarse, int64_t M, int K, const int8_t* xq, const float* xd,
                        float* y, cudaStream_t stream, bool early = false);

}  // namespace ds::cuda
