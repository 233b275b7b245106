// Q6_K repacked into 16-row tiles ("tiled Q6_K") and its int8 tensor-core matmul for decode
// steps of 1..64 activation columns. Lab notes: kernels/cuda/README.md ("Tiled Q6_K").
//
// Why: GGUF's Q6_K block (210 bytes, 2-byte aligned, quants of one element spread over two
// arrays) forces narrow loads and per-lane bit gathering; the v2 GEMV reads it at ~1.3-1.6 TB/s
// and runs out of registers past 8 columns. The tiled layout keeps the exact bits (same size:
// 16 rows x 210 bytes per 256-element unit) but orders them so that each thread of a warp loads
// its operands of `mma.m16n8k16.s8` with 16-byte loads, already in fragment order.
//
// Layout of one matrix [M, K]: tiles of 16 rows (M rounded up; padding rows are zero), each tile
// a run of K/256 tile-units of kTileUnitBytes, tile-major. In a tile-unit (thread T = 4g + q of a
// warp; g = T/4 owns rows g and g+8, q = T%4 owns the 4 k of each 16-element step at 4q..4q+3;
// step s = sub-block s, k = 16s + 4q + j):
//   [0, 2048)    ql: at 512i + 16T four words, word w = step 4i+w; byte j: low nibble of row g,
//                high nibble of row g+8, of t = (q6 - 32) & 63 (the centred value, 6-bit)
//   [2048, 3072) qh: at 2048 + 512i + 16T four words, word w = steps 8i+2w and 8i+2w+1 (p = 0/1);
//                byte j bits 4p..4p+1: t >> 4 of row g, bits 4p+2..4p+3: of row g+8
//   [3072, 3328) int8 sub-block scales, [16 rows][16 steps]
//   [3328, 3360) f16 d, pairs (row g, row g+8) for g = 0..7
// Needs sm_80+ (mma.m16n8k16 with s8 operands); older GPUs keep the raw layout and the v2 GEMV.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"
#include "kernels/cuda/gemv.cuh"

namespace ds::cuda {

constexpr int kTiledRows = 16;
constexpr int kTiledMaxCols = 64;
constexpr int kTileUnitBytes = 16 * 210;

// Formats with a tiled layout: Q6_K (above), and Q4_K, Q5_K, Q8_0, IQ4_XS, IQ4_NL
// (kernels/cpu/tiled_*_layout.h: the same bytes as the raw blocks, ordered for the f16 mma; only
// the f16 tensor-core kernel, tiled_f16.cuh, multiplies them).
bool TiledSupported(GgmlType t);
// Formats whose tiled layout the int8 kernels (TiledGemvMulti, MmqTiledMulti) take: Q6_K.
bool TiledInt8Supported(GgmlType t);
// Bytes of one tile-unit (16 rows x 256 elements) of a tiled format; 0 for others.
int TiledUnitBytes(GgmlType t);
// True when the kernels can run on `device` (compute capability >= 8.0).
bool TiledAvailable(int device);
// Bytes of the tiled copy of an [M, K] matrix (M rounded up to 16). K % 256 == 0.
uint64_t TiledBytes(GgmlType t, int64_t M, int K);

// Repacks `rows` raw GGUF rows (device, contiguous) that start at matrix row `row0`
// (row0 % 16 == 0) into the tiled matrix at `tiled` (device, TiledBytes of the whole matrix).
// Rows of the last tile past `rows` become zero padding, so only the last chunk of a matrix may
// have rows % 16 != 0.
absl::Status TileRows(GgmlType t, const void* raw, int64_t row0, int64_t rows, int K, void* tiled,
                      cudaStream_t stream);

// out: [rows, K] 16-bit (bf16 when `bf16`, else f16) of rows [row0, row0 + rows) of a tiled
// matrix; the values DequantizeRows gives for the raw rows.
absl::Status DequantizeTiledRows(GgmlType t, const void* tiled, int64_t row0, int64_t rows, int K,
                                 void* out, bool bf16, cudaStream_t stream);

// y = W x for tiled matrices, GemvArgs as for GemvMulti (w/w2 point at tiled matrices, xq/xd the
// int8 activations, nc up to kTiledMaxCols). 1..kGemvMaxSegs segments sharing K, nc and the
// activations, or one kSiluMul pair.
absl::Status TiledGemvMulti(const GemvArgs* segs, int n_segs, cudaStream_t stream);

}  // namespace ds::cuda
