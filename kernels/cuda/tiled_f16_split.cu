// The f16 matmul's K split (see tiled_f16_split.cuh).
#include "kernels/cuda/tiled_f16_split.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/tiled_f16.cuh"

namespace ds::cuda {
namespace {

TiledF16TailSplit SplitTailUncached(int rb, int K) {
  const int slots = TiledF16Slots(), tail = rb % slots;
  TiledF16TailSplit best;
  // Only a launch of whole rounds of full-K blocks plus a last round at most a quarter full.
  // Each launch then takes SplitFor's split for its own row blocks (the head's whole rounds:
  // 1): on an H100 the 27B pair's 264 head row blocks took 57.6 us at split 1, then its 8 tail
  // row blocks at split 4 launched early 66.0 us in all, against 73.2 for the one launch at
  // split 3 (16 columns; 116.5 against 124.1 at 64); the head at the one launch's split 3, 79.4.
  if (rb <= slots || tail == 0 || 4 * tail > slots) return best;
  best = {tail, TiledF16SplitFor(tail, K)};
  return best;
}

}  // namespace

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

int TiledF16SplitFor(int rb, int K) {
  const int nu = K / kUnitElems;
  const double per_split = 0.5 * 8.0 * kTiledF16MaxCols / (0.82 * K);
  int best = 1;
  double best_t = std::ceil(static_cast<double>(rb) / TiledF16Slots());
  for (int s = 2; s <= std::min(kMaxSplit, nu / 2) && rb * s <= kSplitBlocks; ++s) {
    const double t = std::ceil(static_cast<double>(rb) * s / TiledF16Slots()) / s + s * per_split;
    if (t < best_t - 1e-9) {
      best = s;
      best_t = t;
    }
  }
  return best;
}

TiledF16TailSplit TiledF16SplitTail(int rb, int K) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, TiledF16TailSplit> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(rb, K);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, SplitTailUncached(rb, K)).first;
  return it->second;
}

}  // namespace ds::cuda
