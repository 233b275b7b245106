// The f16 matmul's K split (see tiled_f16_split.cuh).
#include "kernels/cuda/tiled_f16_split.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <tuple>
#include <vector>

#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/tiled_f16.cuh"

namespace ds::cuda {
namespace {

TiledF16TailSplit SplitTailUncached(int rb, int K, int split) {
  const int st = 2 * split, nu = K / kUnitElems, slots = TiledF16Slots();
  TiledF16TailSplit best;
  if (st > kMaxSplit || nu / st < 2) return best;
  // The launch's end in full-K block times when its last `tail` row blocks split st ways.
  auto makespan = [&](int tail) {
    std::priority_queue<double, std::vector<double>, std::greater<double>> free(
        std::greater<double>(), std::vector<double>(slots, 0.0));
    auto run = [&](int n, double t) {
      for (int i = 0; i < n; ++i) {
        const double s0 = free.top();
        free.pop();
        free.push(s0 + t);
      }
    };
    run((rb - tail) * split, 1.0 / split);
    run(tail * st, 1.0 / st);
    double end = 0;
    for (; !free.empty(); free.pop()) end = std::max(end, free.top());
    return end;
  };
  double best_t = makespan(0) * 0.97;
  for (int tail = 1; tail <= rb && (rb - tail) * split + tail * st <= kSplitBlocks; ++tail) {
    const double t = makespan(tail);
    if (t < best_t - 1e-9) {
      best_t = t;
      best = {tail, st};
    }
  }
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
