// Quantized matrix-vector products for decode: y[c, M] = W[M, K] · x[c, K] for c < nc <= 16
// (float weights: nc <= 64).
//
// W stays in its GGUF block format on the GPU. Quantized formats take int8 activations
// (QuantizeActivations: per 32-element block, scale = amax/127, as ggml's q8_1) and use dp4a;
// float formats take the f32 activations. The weights are read once for all nc columns.
// Shapes whose K is not a multiple of 256 take a slow per-element path (no model matrix does).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"

namespace ds::cuda {

constexpr int kGemvMaxCols = 16;
// Float weights (F32 / F16 / BF16): columns past 8 run as column groups of one launch.
constexpr int kGemvFloatMaxCols = 64;
constexpr int kGemvMaxSegs = 4;

// x: [nc, K] f32 -> xq: [nc, K] int8, xd: [nc, K/32] f32 scales. K % 32 == 0. With `xsum`
// ([nc, K/16], 16-byte aligned) also the sum of each 16 consecutive xq (GemvArgs::xsum).
// `early`: launched early (common.cuh, LaunchMaybeEarly; the decode steps on sm_90+).
absl::Status QuantizeActivations(const float* x, int nc, int K, int8_t* xq, float* xd,
                                 cudaStream_t stream, int32_t* xsum = nullptr, bool early = false);

enum class GemvEpilogue {
  kStore,       // y = W x
  kAccumulate,  // y += W x          (residual add fused into the output projection)
  kSiluMul,     // y = silu(W x) * (W2 x)   (FFN gate/up pair; W2 has W's shape and type)
};

struct GemvArgs {
  GgmlType type = GgmlType::F32;
  const void* w = nullptr;     // [M, K] raw GGUF rows
  const void* w2 = nullptr;    // [M, K] second matrix for kSiluMul
  int M = 0, K = 0;
  int nc = 1;                  // columns (activation vectors), 1..GemvMaxCols(type)
  const float* x = nullptr;    // [nc, K] f32 (float formats and the fallback path)
  const int8_t* xq = nullptr;  // [nc, K] int8 (quantized formats)
  const float* xd = nullptr;   // [nc, K/32]
  const int32_t* xsum = nullptr;  // optional [nc, K/16]: sums of 16 xq (tiled kernel, 1 column)
  const uint16_t* xh = nullptr;   // [nc, K] f16 activations scaled per column (TiledF16Multi)
  const float* xs = nullptr;      // [nc] the factors that undo xh's scaling
  // [nc, K/32] the 2^-6 scaled f16 sums of xh's 32-element sub-blocks (HalfActivations' sums):
  // the minimum term of tiled Q4_K / Q5_K in TiledF16Multi.
  const uint16_t* xhs = nullptr;
  float* y = nullptr;          // y[c * ldy + r]
  int64_t ldy = 0;             // defaults to M when 0
  GemvEpilogue epilogue = GemvEpilogue::kStore;
  // Launched early, while the kernel before it still runs (common.cuh, LaunchMaybeEarly; sm_90+):
  // the tiled column kernel at 1..8 columns (each warp loads its first unit of weights before it
  // waits for that kernel) and the unit GEMV (it waits first thing). Same arithmetic.
  bool early_launch = false;
  // The tiled column kernel at one column copies the activations into shared memory once per
  // block instead of reading them from L2 per unit; the same arithmetic. false: the unstaged
  // form (A/B runs, tiled_gemv_bench --stage 0,1).
  bool stage_activations = true;
  // Float weights (F32 / F16 / BF16) at 5 or 6 columns take a 6-column kernel instead of the
  // 8-column one (an MTP verify of 4 drafts has 5 rows; the launch-bound demo model pays for
  // every column of the template). Each column's sums are the same either way. false: the
  // 8-column kernel (A/B runs, `bench --gemv-six off`).
  bool six_columns = true;
  // With early_launch: the unit GEMV of float weights requests each warp's first two units of
  // weights before it waits for the kernel ahead (the weights are constants). Same arithmetic.
  // false: it waits first (A/B runs, `bench --gemv-early-weights off`).
  bool early_weights = true;
};

// True when Gemv can run this format (any K that is a multiple of the block size).
bool GemvSupported(GgmlType t);
// The most columns one Gemv call takes for this format: kGemvFloatMaxCols for float weights,
// else kGemvMaxCols.
int GemvMaxCols(GgmlType t);
// True when the format needs xq/xd (quantized activations) rather than x.
bool GemvWantsQuantizedX(GgmlType t, int K);

absl::Status Gemv(const GemvArgs& args, cudaStream_t stream);

// Several matrices that share type, K, nc and the activations (x / xq / xd) in one launch, each
// with its own w, M, y, ldy and store/accumulate epilogue (not kSiluMul). 1..kGemvMaxSegs.
absl::Status GemvMulti(const GemvArgs* segs, int n_segs, cudaStream_t stream);

}  // namespace ds::cuda
