// The f16 matmul's K split (see tiled_f16_split.cuh).
#include "kernels/cuda/tiled_f16_split.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/tiled_f16.cuh"

namespace ds::cuda {
namespace {

TiledF16TailSplit SplitTailUncached(int rb, int K, int split) {
  const int slots = TiledF16Slots(), per_round = slots / split;
  TiledF16TailSplit best;
  const int tail = rb % per_round;
  // Only a launch of whole rounds plus a last one at most a quarter full.
  if (rb < per_round || tail == 0 || 4 * tail * split > slots) return best;
  // The tail's own split, as for a launch of its row blocks alone: on an H100 the 27B pair's 8
  // tail row blocks at split 4 (SplitFor's) took 16.2 us alone and 68.6 us after the head
  // (launched early) against 74.7 for the one launch; at split 8 the two launches took 79.7.
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

TiledF16TailSplit TiledF16SplitTail(int rb, int K, int split) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int>, TiledF16TailSplit> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(rb, K, split);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, SplitTailUncached(rb, K, split)).first;
  return it->second;
}

}  // namespace ds::cuda
