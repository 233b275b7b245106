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
  // Device-resident form (a step replayed from a CUDA graph, where slot and position change
  // between replays): when dev_slot / dev_pos are set, slot and pos are read from them, `valid`
  // is the mask of slot 0 with valid_ld bytes per slot, and n_splits is the most splits: the
  // kernels take MaskedAttnSplits(pos, n_splits), so the result is bit-identical to the host
  // form with that split count.
  const int32_t* dev_slot = nullptr;
  const int32_t* dev_pos = nullptr;
  int64_t valid_ld = 0;
  const float* q = nullptr;      // [n_head * hd] device
  const float* qg = nullptr;     // [n_head * 2 * hd] device (gates at h*2*hd + hd)
  KvCacheView kv;                // type F16
  const uint8_t* valid = nullptr;  // [pos + 1] device: row j attended iff valid[j] != 0
  int n_splits = 1;              // position ranges per head (MaskedAttnSplits)
  float* partials = nullptr;     // [n_head, n_splits, hd + 2] scratch
  float* out = nullptr;          // [n_head * hd]
  bool early = false;  // launched early (common.cuh, LaunchMaybeEarly; decode steps on sm_90+)
};
// Splits for a query at `pos` (at least 128 positions each, at most max_splits).
__host__ __device__ inline int MaskedAttnSplits(int pos, int max_splits) {
  constexpr int kMinPerSplit = 128;
  const int want = (pos + 1 + kMinPerSplit - 1) / kMinPerSplit;
  const int cap = max_splits > 1 ? max_splits : 1;
  return want < 1 ? 1 : (want > cap ? cap : want);
}
int64_t MaskedAttnPartialFloats(const AttnShape& s, int max_splits);
absl::Status MaskedAttnDecode(const MaskedAttnArgs& a, cudaStream_t stream);

// The MTP row mask after writing rows [pos0, pos0 + n) of a slot (spec §8.3: writing row p drops
// every row past it, i.e. rejected drafts): valid[slot * ld + j] = 1 for j in [pos0, pos0 + n),
// 0 for j in [pos0 + n, old_len). args (device, 4 ints): slot, pos0, n, old_len — on the device
// so that a captured draft chain replays with other slots and positions. One block.
absl::Status MtpMaskUpdate(uint8_t* valid, int64_t ld, const int32_t* args, cudaStream_t stream,
                           bool early = false);  // early: common.cuh, LaunchMaybeEarly

}  // namespace ds::cuda
