// The fused MTP draft chain's resident form (kernels/cuda/mtp_chain.cuh, MtpChainArgs::resident):
// which of each block's weight rows it keeps in shared memory. Plain host code, so the plan is
// checked without a GPU (tests/kernels/cpu/mtp_chain_plan_test.cc).
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace ds::cuda {

// The matrices in the order the plan fills them: the stages' order (eh_proj, q with its gate, k,
// v, o_proj, gate, up, down), the LM head last, the largest and the one stage that still pays an
// L2 round trip when part of it stays in global memory.
constexpr int kMtpChainResidentMats = 9;
struct MtpChainMatShape {
  int rows = 0, cols = 0;
};
struct MtpChainResidentPlan {
  std::array<int, kMtpChainResidentMats> rows{};         // resident rows of each, per block
  std::array<uint32_t, kMtpChainResidentMats> offset{};  // their bytes' start in the region
  size_t bytes = 0;                                      // the weights region of a block
};

// Block b of `blocks` multiplies rows b, b + blocks, b + 2 blocks, ... of every matrix (at most
// ceil(rows / blocks) of them); the first plan.rows[m] go into its shared memory, matrix after
// matrix while `budget` bytes last (a matrix that does not fit whole takes the rows that fit;
// a later one of shorter rows may still take some of what is left). A row
// is elem_bytes * cols bytes, a multiple of 16 for the kernel's widths (multiples of 8), so every
// offset is 16-byte aligned for the copies.
inline MtpChainResidentPlan PlanMtpChainResident(
    const std::array<MtpChainMatShape, kMtpChainResidentMats>& mats, size_t elem_bytes, int blocks,
    size_t budget) {
  MtpChainResidentPlan p;
  if (blocks < 1) return p;
  for (int m = 0; m < kMtpChainResidentMats; ++m) {
    const size_t row_bytes = elem_bytes * static_cast<size_t>(std::max(mats[m].cols, 0));
    const size_t owned = (static_cast<size_t>(std::max(mats[m].rows, 0)) + blocks - 1) / blocks;
    const size_t n = row_bytes == 0 ? 0 : std::min(owned, (budget - p.bytes) / row_bytes);
    p.rows[m] = static_cast<int>(n);
    p.offset[m] = static_cast<uint32_t>(p.bytes);
    p.bytes += n * row_bytes;
  }
  return p;
}

}  // namespace ds::cuda
