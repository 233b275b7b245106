// The (value, index) reduction of a greedy choice, shared by ArgmaxSplitRows (argmax.cu) and
// SampleRows' greedy pass (sampling.cu): the larger value wins, the lower index on ties.
#pragma once

namespace ds::cuda {

__device__ __forceinline__ void Better(float& bv, int& bi, float v, int i) {
  if (v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}

// Every lane of the warp ends with the warp's best (value, index).
__device__ __forceinline__ void WarpBest(float& bv, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    Better(bv, bi, ov, oi);
  }
}

}  // namespace ds::cuda
