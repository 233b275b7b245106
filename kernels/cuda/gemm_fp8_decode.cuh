// The block-scaled FP8 product at decode widths (issue #22): 1..64 tokens against e4m3 weights,
// reading the same weights, block scales and quantized activations as Fp8Gemm's cuBLASLt product
// (gemm_fp8.cuh) and computing the same sum.
//
// Why: at 16..64 tokens the product is a stream of the weights (a 27B step reads ~24 GB of e4m3
// and multiplies each byte by at most 64 tokens), yet cuBLASLt's block-scaled kernels read them
// at only 1.7-2.3 TB/s there (Fp8Timing.DISABLED_DecodeCandidates27B, H100), and an earlier kernel
// of ours that loaded the weights into the tensor cores' registers did no better (docs/perf/h200.md
// "A decode-width FP8 kernel of our own"): the time went to starting and draining many short
// blocks, each with its own serial wait for its first bytes. This one keeps every SM's copy
// engine busy from the first byte to the last.
//
// Form (gemm_fp8_decode.cu has the details). One block per SM, persistent: the matrix's 128 x 128
// weight blocks, taken in row-block-major order, are cut into one contiguous run per block (a
// "stream-K" split: every SM gets the same bytes, whatever the shape). A block streams its run
// through a ring of shared-memory stages by `cp.async` (16-byte copies of the weight tile and the
// tokens' 128-byte activation rows, swizzled for wgmma), so ~7 tiles are in flight while one
// multiplies; the warpgroup multiplies a stage by `wgmma` (e4m3, both operands from shared
// memory, fresh f32 accumulators per 128-element block, then promoted by the weight block's and
// the token block's scales, as cuBLASLt's scheme does). A row block that one block covers whole
// is written straight to y; one split between blocks is written as partial tiles, and the last of
// its blocks to finish (a counter) adds them in run order: the same bits whatever order the
// blocks ran in.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

// Token counts this product takes.
inline constexpr int kFp8DecodeMaxTokens = 64;
// Blocks (persistent, one per SM) a product runs at most: what the scratch has partial tiles for.
inline constexpr int kFp8DecodeMaxBlocks = 256;

struct Fp8DecodeArgs {
  const uint8_t* w = nullptr;  // [M, K] e4m3, 16-byte aligned rows
  const float* ws = nullptr;   // QuantizeBlocksFp8's scales: [(r / 128) * Fp8BlockScaleLd(K) + k / 128]
  const uint8_t* x = nullptr;  // [T, K] e4m3 (QuantizeTokensFp8), 16-byte aligned rows
  const float* xs = nullptr;   // [(k / 128) * ld_xs + t]
  int64_t ld_xs = 0;
  float* y = nullptr;  // y[t * ldy + r] (+)= the product, r < M, t < T
  int64_t ldy = 0;
  int M = 0, K = 0, T = 0;
  bool accumulate = false;
  // 0: one block per SM (at most kFp8DecodeMaxBlocks); else that many (tests and benchmarks).
  int blocks = 0;
  // 0: the default; else the K blocks the copy engine is asked for at once (1, 2, 4 or 8), for
  // the benchmark's comparison.
  int group = 0;
  // The operands' layouts: false, row-major as above (read by tensor-map copies, 128 bytes per
  // row and K block); true, already in the kernel's shared-memory image, one contiguous piece per
  // stage (Fp8TileWeights / Fp8TileActivations), read by plain bulk copies.
  bool w_tiled = false;
  bool x_tiled = false;
};

// w [M][K] e4m3 (row-major) -> the tiled image: 128 x 128 block (r / 128, k / 128) at
// ((r / 128) * (K / 128) + k / 128) * 16384 bytes, inside it row r % 128's 16-byte chunk c at
// r % 128 * 128 + (c ^ (r % 8)) * 16 (wgmma.cuh's swizzled tile). M % 128 == 0, K % 128 == 0.
absl::Status Fp8TileWeights(const uint8_t* w, int M, int K, uint8_t* tiled, cudaStream_t stream);
// x [T][K] e4m3 -> per K block a swizzled tile of W = Fp8DecodeWidth(T) rows (zeros past T) at
// (k / 128) * W * 128 bytes. T <= kFp8DecodeMaxTokens.
absl::Status Fp8TileActivations(const uint8_t* x, int T, int K, uint8_t* tiled, cudaStream_t stream);
// The token rows the kernel multiplies for T tokens (16, 32, 48 or 64).
inline constexpr int Fp8DecodeWidth(int T) { return (T + 15) / 16 * 16; }

// The kernel's scratch (partial tiles and a counter per row block), for matrices of up to max_m
// rows; zeroed by Fp8DecodeScratchInit once, and left zeroed by every product.
uint64_t Fp8DecodeScratchBytes(int max_m);
absl::Status Fp8DecodeScratchInit(void* scratch, int max_m, cudaStream_t stream);

// Whether Fp8DecodeGemm takes a product of this shape: M % 128 == 0, K % 128 == 0,
// 1 <= T <= kFp8DecodeMaxTokens.
bool Fp8DecodeTakes(int M, int K, int T);

// The blocks a product of M x K runs on the current device (args.blocks == 0).
int Fp8DecodeBlocks(int M, int K);

// Fp8DecodeTakes(M, K, T), M <= the scratch's max_m. Needs Hopper's wgmma (sm_90a code on a
// compute capability 9.0 device: Fp8DecodeAvailable); an error otherwise.
absl::Status Fp8DecodeGemm(const Fp8DecodeArgs& a, void* scratch, int max_m, cudaStream_t stream);

// Whether this build and device run Fp8DecodeGemm.
bool Fp8DecodeAvailable();

}  // namespace ds::cuda
