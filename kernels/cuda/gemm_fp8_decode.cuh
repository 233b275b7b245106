// The block-scaled FP8 product at decode widths (issue #22): 1..32 tokens against e4m3 weights,
// on mma.sync's e4m3 tensor cores, reading the same weights, block scales and quantized
// activations as Fp8Gemm's cuBLASLt product (gemm_fp8.cuh) and computing the same sum.
//
// Why: cuBLASLt's block-scaled kernels read the 27B's weights at only 1.7-2.3 TB/s at 16..64
// tokens (Fp8Timing.DISABLED_DecodeCandidates27B, H100: every algorithm it offers), so the FP8
// mode's decode steps kept the 16-bit column kernels below 33 rows. At these widths the product
// is a stream of the weights: this kernel loads each weight byte once, straight from global
// memory into the tensor cores' operand registers (no shared memory, no decode), with the next
// 128-element block in flight while the current one multiplies.
//
// Form. A block of 4 warps owns one 128-row block of the weights (one weight scale per K block)
// and a contiguous range of K blocks (a K split, so that small matrices still fill the GPU);
// each warp owns 32 rows as two m16n8k32 row tiles and all of the tokens as n-tiles of 8. Per
// 128-element K block a thread loads 16 bytes at offsets 16t and 64 + 16t of its two rows (and
// of its token's row): the dot product does not care in which order k is summed, so each
// thread gives A and B the same k's, in the registers' order, with whole 64-byte runs per row
// and warp instruction. The 4 MMAs of a K block sum into a fresh accumulator that is then scaled
// by the weight block's and the token block's scales and added to the f32 total (the scheme's
// per-block promotion, as cuBLASLt's). K splits write their partial tiles to a scratch; the last
// block of a row block to finish (a counter) adds them in split order: the same bits whatever
// order the blocks ran in.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

// Token counts this product takes (n-tiles of 8: 1..4).
inline constexpr int kFp8DecodeMaxTokens = 32;

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
  // 0: the K split that fills the GPU (Fp8DecodeSplits); else that many (tests and benchmarks).
  int splits = 0;
};

// The kernel's scratch for K splits (partial tiles and a counter per row block), for matrices of
// up to max_m rows; zeroed by Fp8DecodeScratchInit once, and left zeroed by every product.
uint64_t Fp8DecodeScratchBytes(int max_m);
absl::Status Fp8DecodeScratchInit(void* scratch, int max_m, cudaStream_t stream);

// Whether Fp8DecodeGemm takes a product of this shape (M % 128 == 0, K % 128 == 0, 1 <= T <=
// kFp8DecodeMaxTokens, and a K split that its scratch holds).
bool Fp8DecodeTakes(int M, int K, int T);

// The K split a product of M x K takes on the current device for T tokens.
int Fp8DecodeSplits(int M, int K, int T);

// Fp8DecodeTakes(M, K, T), M <= the scratch's max_m. Needs
// compute capability 8.9+ (e4m3 MMA); an error otherwise.
absl::Status Fp8DecodeGemm(const Fp8DecodeArgs& a, void* scratch, int max_m, cudaStream_t stream);

// Whether this build and device run Fp8DecodeGemm.
bool Fp8DecodeAvailable();

}  // namespace ds::cuda
