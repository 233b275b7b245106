// Shared helpers of the GPU kernel tests (kernels_cuda_test, kv_quant_cuda_test,
// sampling_cuda_test, gdn_cuda_test): a CUDA-error check that aborts the test binary, ASSERT_OK
// for absl::Status, a device buffer with host round trips, and the mean time of a launch (for
// the DISABLED_ timing benchmarks).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <random>
#include <vector>

#include "kernels/cuda/common.cuh"

#define CK(expr) DS_CUDA_CHECK(expr)
#define ASSERT_OK(expr)                        \
  do {                                         \
    const absl::Status st_ = (expr);           \
    ASSERT_TRUE(st_.ok()) << st_.ToString();   \
  } while (0)

namespace ds::cuda {

// Device buffer of `n` T; filled with 0xFF bytes on creation (NaN for floats), so a kernel that
// leaves an output element unwritten is caught.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    CK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)));
    Poison();
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { Up(h); }
  Dev(Dev&& o) noexcept : p(o.p), n(o.n) {
    o.p = nullptr;
    o.n = 0;
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  void Poison() { CK(cudaMemset(p, 0xFF, std::max<size_t>(1, n) * sizeof(T))); }
  void Up(const std::vector<T>& h) {
    if (!h.empty()) CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  // The first `m` elements (all when m is omitted), after the device is idle.
  std::vector<T> Down(size_t m) const {
    std::vector<T> h(m);
    CK(cudaDeviceSynchronize());
    if (m) CK(cudaMemcpy(h.data(), p, m * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  std::vector<T> Down() const { return Down(n); }
};

// n floats uniform in [lo, hi) from `rng` (each test binary keeps its own seeded engine).
inline std::vector<float> RandVec(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Device 0's compute capability major (0 without a device).
inline int ComputeMajor() {
  cudaDeviceProp prop;
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.major : 0;
}

// Whether device 0 runs the sm_80+ tensor-core kernels (attention_mma.cu, the GDN scan's mma
// form); their callers never launch them below.
inline bool HaveTensorCores() { return ComputeMajor() >= 8; }

// Whether device 0 runs thread-block clusters (sm_90+: the f16 matmul's cluster K split).
inline bool HaveClusters() { return ComputeMajor() >= 9; }

// Microseconds per call of `launch` (a Status-returning launch on the legacy stream) over `iters`
// calls after `warm` unmeasured ones; fails the test on a launch error.
template <typename F>
double MeanLaunchUs(int warm, int iters, F&& launch) {
  for (int i = 0; i < warm; ++i) EXPECT_TRUE(launch().ok());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) EXPECT_TRUE(launch().ok());
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return 1e3 * ms / iters;
}

// Mean us of `launch` with a cold L2: before each launch, 128 MiB are written (more than any
// sm_90 L2 holds), then `rewarm` runs (e.g. a read of the activations, which a decode step has
// just written), and only the launch is between the two events. A decode step streams gigabytes
// of weights, so a small matrix it reads comes from HBM, not from the L2 that MeanLaunchUs's
// back-to-back launches leave warm.
template <typename F, typename W>
double MeanColdLaunchUs(int iters, F&& launch, W&& rewarm) {
  constexpr size_t kFlushBytes = size_t{128} << 20;
  void* flush = nullptr;
  CK(cudaMalloc(&flush, kFlushBytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double total_ms = 0;
  for (int i = 0; i <= iters; ++i) {  // i = 0: a warm-up launch, not counted
    CK(cudaMemset(flush, i & 0xff, kFlushBytes));
    rewarm();
    CK(cudaEventRecord(e0));
    EXPECT_TRUE(launch().ok());
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i > 0) total_ms += ms;
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(flush));
  return 1e3 * total_ms / iters;
}

}  // namespace ds::cuda
