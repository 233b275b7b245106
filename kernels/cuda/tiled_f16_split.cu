// The f16 matmul's K split (see tiled_f16_split.cuh).
#include "kernels/cuda/tiled_f16_split.cuh"

#include <cuda_runtime.h>

#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/tiled_f16.cuh"

namespace ds::cuda {

static_assert(kSplitUnitElems == kUnitElems && kSplitMaxCols == kTiledF16MaxCols,
              "tiled_f16_split.cuh's copies of the kernel's constants");

int TiledF16Slots() {
  static const int slots = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        sms <= 0)
      sms = 132;
    return 2 * sms;
  }();
  return slots;
}

int TiledF16SplitFor(int rb, int K, double cost) {
  return TiledF16SplitForSlots(rb, K, TiledF16Slots(), cost);
}

TiledF16TailSplit TiledF16SplitTail(int rb, int K, double cost) {
  return TiledF16SplitTailForSlots(rb, K, TiledF16Slots(), cost);
}

}  // namespace ds::cuda
