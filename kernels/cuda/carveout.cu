// The early-launched kernels' common shared-memory carveout (common.cuh).
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/common.cuh"

namespace ds::cuda {
namespace {

std::atomic<int> g_carveout{-1};

}  // namespace

void SetEarlyLaunchCarveout(int percent) { g_carveout.store(percent, std::memory_order_relaxed); }

void ApplyEarlyLaunchCarveout(const void* kernel) {
  const int percent = g_carveout.load(std::memory_order_relaxed);
  if (percent < 0) return;
  // Kernel -> the carveout last set on it: one attribute call per kernel and value.
  static std::mutex mu;
  static std::unordered_map<const void*, int> applied;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = applied.try_emplace(kernel, percent);
  if (!inserted && it->second == percent) return;
  it->second = percent;
  (void)cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent);
}

}  // namespace ds::cuda
