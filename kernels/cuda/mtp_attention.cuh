// Decode attention of one query row over a paged f16 K/V plane with a row mask: the MTP layer's
// attention (spec §8.2, §8.3 item 5). The MTP K/V rows of a slot are written only where a draft
// step ran, so rows that were never written (gaps, stale pages) are masked out, as the CPU
// reference does (kernels/cpu/attention.h AttnArgs::valid). Query already normed and roped
// (QkvPrep); output gated by sigmoid(gate) (spec §6.2 step 5).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/util/status.h"
#include "kernels/cuda/attention.cuh"

namespace ds::cuda {

struct MaskedAttnArgs {
  AttnShape shape;
  int slot = 0;
  int pos = 0;                   // the query's position: rows [0, pos] are candidates
  const float* q = nullptr;      // [n_head * hd] device
  const float* qg = nullptr;     // [n_head * 2 * hd] device (gates at h*2*hd + hd)
  KvCacheView kv;                // type F16
  const uint8_t* valid = nullptr;  // [pos + 1] device: row j attended iff valid[j] != 0
  int n_splits = 1;              // position ranges per head (MaskedAttnSplits)
  float* partials = nullptr;     // [n_head, n_splits, hd + 2] scratch
  float* out = nullptr;          // [n_head * hd]
};
// Splits for a query at `pos` (at least 128 positions each, at most max_splits).
int MaskedAttnSplits(int pos, int max_splits);
int64_t MaskedAttnPartialFloats(const AttnShape& s, int max_splits);
absl::Status MaskedAttnDecode(const MaskedAttnArgs& a, cudaStream_t stream);

}  // namespace ds::cuda
