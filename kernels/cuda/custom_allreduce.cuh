// All-reduce (sum, f32) and all-gather between the ranks of a TP group on ONE host, reading the
// peers' buffers directly through CUDA IPC mappings (NVLink / PCIe P2P, or the same GPU shared by
// several processes). Used by CustomAllReduceCollective (common/collective/custom_allreduce.h),
// which allocates the buffers, exchanges the IPC handles and picks the algorithm; these kernels
// only move and add data.
//
// Every rank exports one IPC region: `buf` (staging for the message, `capacity_units` float4s)
// and a CarSignal (barrier flags written by the peers). A call:
//   one-shot: copy the input into my buf ─ barrier ─ every rank reads ALL peers' bufs and sums in
//             rank order 0..W-1 into its output ─ barrier (nobody reuses a buf a peer still reads)
//   two-shot: copy ─ barrier ─ rank r sums segment r of every buf (rank order) into its own buf
//             ─ barrier ─ every rank copies segment s from rank s's buf ─ barrier
// Because the sum order is fixed and every output element is computed by one formula, every rank
// gets bitwise the same result (one-shot: same adds in the same order on each rank; two-shot: one
// rank adds, the others copy).
//
// Barriers are per block and live in device memory: block b of rank r bumps its own epoch counter
// (`counters[b]`, local memory, so graph replays keep counting), writes it into flag[b][r] of every
// peer's CarSignal (release, system scope) and spins until each peer has written at least that
// epoch into its own flag[b][peer] (acquire). No host synchronisation, so a call can be captured
// into a CUDA graph. Per-block barriers suffice because every phase of a call partitions the work
// the same way on every rank (element j of each segment always belongs to the same block), and
// the grid is a function of the message size only, so all ranks run identical grids.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/util/status.h"

namespace ds::cuda {

constexpr int kCarMaxRanks = 8;
constexpr int kCarMaxBlocks = 64;

// Barrier flags of one rank; flag[b][q] is written by rank q's block b. Zero-initialised.
struct CarSignal {
  uint32_t flag[kCarMaxBlocks][kCarMaxRanks];
};

// The group as one rank sees it: every rank's buffer and signal mapped into this process (its
// own at index `rank`).
struct CarGroup {
  float* buf[kCarMaxRanks];
  CarSignal* sig[kCarMaxRanks];
  uint32_t* counters;  // [kCarMaxBlocks] this rank's barrier epochs (not shared)
  // Host-mapped word set to 1 by a block that waited longer than `timeout_ns` for a peer (a
  // rank died mid-call): the block gives up instead of spinning forever, the results are
  // garbage and the group must be rebuilt (the collective turns it into an error).
  uint32_t* error = nullptr;
  uint64_t timeout_ns = 30ull * 1000 * 1000 * 1000;
  int rank = 0;
  int world = 1;
};

// data[0..n) ← Σ_ranks data[0..n), in place, enqueued on `stream`. n ≤ the floats of every
// buffer (the caller chunks larger messages). The grid is derived from n and the world only, so
// it is the same on every rank.
absl::Status LaunchCarAllReduce(const CarGroup& g, float* data, size_t n, bool two_shot,
                                cudaStream_t stream);

// The one-shot all-reduce of h[rows, n] (in place) fused with the RMSNorm that follows it in the
// layer: out = h / rms(h) * w, and when xq is set the int8 quantization of out in blocks of 32
// (same rounding as the GEMV activations: d = amax / 127, q = rint(v / d)). One block per row
// (rows <= kCarMaxBlocks), n % 32 == 0, 16-byte aligned h, w, out; rows * n <= the buffer.
absl::Status LaunchCarAllReduceRmsNorm(const CarGroup& g, float* h, int rows, int n,
                                       const float* w, float eps, float* out, int8_t* xq,
                                       float* xd, cudaStream_t stream);

// out[offsets[q] + i] ← rank q's in[i] for i < counts[q], every q (rank-major gather; counts may
// differ). in holds counts[rank] floats; every count ≤ the floats of a buffer. counts/offsets are
// host arrays of world entries (passed to the kernel by value).
absl::Status LaunchCarAllGatherV(const CarGroup& g, const float* in, const size_t* counts,
                                 const size_t* offsets, float* out, cudaStream_t stream);

// Threads per block of these kernels.
constexpr int kCarThreads = 256;

}  // namespace ds::cuda
