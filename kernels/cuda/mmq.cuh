// MMQ: the int8 tensor-core matmul on quantized weights for steps of 9..64 activation columns
// (batched decode, MTP verify), over the tiled Q6_K layout (gemv_tiled.cuh). Lab notes:
// kernels/cuda/README.md ("MMQ").
//
// Why a second kernel: the tiled column kernel (TiledGemvMulti) gives each block one 16-row tile,
// so every block re-reads all nc activation columns from L2 with 4-byte loads that feed the mma
// directly: at 16+ columns it waits on those loads (x16 ffn 9.9 ms/step vs 6.4 at x1; at 64
// columns 84 ms/step, slower than dequantization + cuBLAS). Here a block holds S warp slots (S/2
// tiles x 2 matrices for the gate/up pair) x 4 K streams; the activations of 4 units (one per
// stream) x all columns are staged in shared memory with cp.async (double-buffered) and shared by
// the block's S tiles, and B fragments come from shared memory.
//
// Same numbers as TiledGemvMulti, bit for bit: warp stream kw takes units kw, kw+4, ... like the
// tiled kernel's warp kw, each (row, column) accumulates in the same order with the same float
// operations, and the 4 streams are summed in stream order. So the dispatch may take either
// kernel for any column count without changing a decode row's result (batch invariance,
// worker/README.md) — the choice is a pure speed question (worker/cuda/matmul_dispatch.cc).
#pragma once
#include <cuda_runtime.h>

#include "common/util/status.h"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_tiled.cuh"

namespace ds::cuda {

constexpr int kMmqMaxCols = 64;

// Block shape of one launch: `slots` warp slots of 4 warps each (2 or 4; the pair epilogue puts
// gate and up of one tile in two slots; more than 32 columns always take 2), `stages` activation
// buffers (1 or 2; only more than 32 columns use 1), and at most `max_cols` columns per pass
// (0 = all in one pass; a multiple of 8: e.g. 64 columns as two 32-column passes, which read the
// weights twice but run at 128 registers instead of 255).
struct MmqShape {
  int slots = 2;
  int stages = 2;
  int max_cols = 0;
};

// True when MmqTiledMulti can run this weight type (tiled Q6_K).
bool MmqSupported(GgmlType t);

// y = W x for tiled matrices; arguments as TiledGemvMulti (1..kGemvMaxSegs segments sharing K, nc
// and the activations, or one kSiluMul pair), nc <= kMmqMaxCols. xq and xd must be 16-byte
// aligned (they are for every column segment of the backend's buffers); otherwise this returns
// InvalidArgument and the caller takes TiledGemvMulti, which computes the same numbers.
absl::Status MmqTiledMulti(const GemvArgs* segs, int n_segs, MmqShape shape, cudaStream_t stream);

}  // namespace ds::cuda
