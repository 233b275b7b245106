// Tiled Q6_K, Q4_K, Q5_K and Q8_0 (gemv_tiled.cuh) times f16 activations on f16 tensor cores,
// for batched decode steps (the dispatch: f16_mma_min_cols..64 columns; the formats without an
// int8 kernel, all but Q6_K, at every column count). Lab notes: kernels/cuda/README.md ("Tiled
// Q6_K on f16 tensor cores", "Tiled Q4_K / Q5_K / Q8_0").
//
// Why: the int8 kernels (TiledGemvMulti, MmqTiledMulti) must apply Q6_K's per-16 sub-block scale
// and the per-32 activation scale to every accumulator after every int8 mma (~10 float
// instructions per mma), which is what bounds them at 16-64 columns (MMQ ~92 TOPS at 32
// columns). Here the sub-block scale goes into the A operand instead: each weight is decoded to
// the f16 value (q - 32) * sc (an integer of at most 13 bits, exact up to 2048), once per warp
// and step whatever the column count, so the work that grows with the columns is the mma alone;
// the f16 mma accumulates a whole 256-element unit in f32, then one fma applies the unit's d.
// The activations are f16, scaled per column by a power of two into f16's range
// (HalfActivations), so nothing overflows or flushes and the scale is undone exactly.
//
// Numbers: a (row, column) result is the f32 tensor-core sum of exact f16 products; it depends
// on the matrix shape and the launch's matrices (the K split), never on the column count or the
// other columns, so decode rows stay batch-invariant among the steps this kernel serves. It is
// not the int8 kernels' result (the activations are rounded differently: f16 keeps 11 bits of
// every element, int8 7 bits of each 32-block's largest). A K split's partial sums meet through
// thread-block clusters on sm_90 where that measured faster, else through the scratch below;
// both add them in the same order (the same bits).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/tiled_f16_split.cuh"

namespace ds::cuda {

constexpr int kTiledF16MaxCols = kTiledMaxCols;

// x: [R, K] f32 -> xh: [R, K] f16 bits of x * 2^e_r and xs: [R] = 2^-e_r, where e_r puts the
// row's largest |x| in [2^13, 2^14) (e_r = 0 for an all-zero or non-finite row; e_r <= 114).
// K % 4 == 0, x 16-byte and xh 8-byte aligned. CPU twin: cpu::HalfActivationsRow.
// `early`: launched early (common.cuh, LaunchMaybeEarly). `sums` (optional, K % 32 == 0): [R,
// K/32] the 2^-6 scaled f16 sums of xh's 32-element sub-blocks (GemvArgs::xhs, which tiled
// Q4_K / Q5_K need), exactly cpu::HalfSubBlockSums. `warpgroup_order` (K % 16 == 0): xh in the
// order the wgmma kernel reads (TiledF16Scratch::warpgroup_order; half_rows.cuh, StoreHalf4):
// the same values, permuted within each 16-element group; xs and the sums are unchanged.
// `rows_in_registers`: rows of up to 20,480 take up to 1,024 threads each and are read once
// (held in registers between the row's max and the conversion); false: 256 threads per row
// reading it twice (the form before, for A/B runs). The same bits either way.
absl::Status HalfActivations(const float* x, int R, int K, uint16_t* xh, float* xs,
                             cudaStream_t stream, bool early = false, uint16_t* sums = nullptr,
                             bool warpgroup_order = false, bool rows_in_registers = true);

// Device scratch of the launches that split K over blocks (the narrow matrices): partial sums
// and one ticket per 128-row block (zero at allocation; each launch leaves them zero).
struct TiledF16Scratch {
  float* partial = nullptr;
  int64_t partial_floats = 0;
  int* tickets = nullptr;
  int n_tickets = 0;
  // On sm_90+ a K-split launch adds its partial sums through thread-block clusters (distributed
  // shared memory) instead of this scratch where the clusters fit (TiledF16Multi decides); false
  // keeps the scratch path everywhere (tests and A/B: both give the same bits).
  bool cluster_split = true;
  // The activations are in the order of Hopper's warpgroup tensor-core instruction (wgmma,
  // sm_90a; HalfActivations / RmsNormHalf with warpgroup_order; usable where
  // TiledF16WgmmaAvailable()): launches of 9..64 columns run on wgmma instead of mma.sync (the
  // tensor cores read the activations from shared memory themselves, 64 rows at a time, so the
  // warps' per-column work, a shared load and an mma per 8 columns and 16 rows, is gone); up to 8
  // columns mma.sync reads that order, which measured faster there. The same operands, sums of
  // exact products in f32 per 256-element unit: the same bits (tiled_f16_cuda_test).
  bool warpgroup_order = false;
  // One-matrix launches of whole rounds plus a nearly idle last one run the last round's row
  // blocks as a second launch (early where the first is), each launch at its own rows' K split
  // (TiledF16SplitTail; TiledF16Multi decides from the shape and the device, never the column
  // count, so batch invariance holds; the rows' sums differ from the one launch's). false: one
  // launch (the library's default; the worker turns it on: CudaBackendOptions::f16_tail_split).
  bool tail_split = false;
  // > 0: every launch at this K split instead of TiledF16SplitFor's (and no tail launch), for
  // the benchmark that calibrates SplitFor (TiledF16Timing.DISABLED_SplitScan); a split past
  // kMaxSplit, past half the launch's 256-element units or past the scratch is refused.
  int split_override = 0;
  // The split planning's charge for partial sums (TiledF16SplitFor's `cost`, kSplitCost unless
  // set; CudaBackendOptions::f16_split_cost, `bench --f16-split-cost` for A/B). >= 0.
  double split_cost = kSplitCost;
};
// Whether this build and device run the wgmma form (sm_90a code on an sm_90 device;
// WgmmaAvailable(), wgmma.cuh).
bool TiledF16WgmmaAvailable();
// Scratch that any launch of up to `max_cols` columns fits in.
int64_t TiledF16PartialFloats(int max_cols);
int TiledF16Tickets();

// y = W x for tiled matrices on f16 activations: GemvArgs as for TiledGemvMulti, with xh / xs
// (HalfActivations of the nc columns) instead of xq / xd; 1..kGemvMaxSegs segments sharing K, nc
// and the activations, or one kSiluMul pair; nc <= kTiledF16MaxCols. xh 16-byte aligned.
// Q4_K / Q5_K (w = d sc q - dmin mn) also take xhs, the sub-block sums: per unit the kernel adds
// d * sum((sc q) x) (f16 operands, exact products) and -64 dmin * sum(mn * xhs) (one m16n8k8).
absl::Status TiledF16Multi(const GemvArgs* segs, int n_segs, const TiledF16Scratch& scratch,
                           cudaStream_t stream);

}  // namespace ds::cuda
