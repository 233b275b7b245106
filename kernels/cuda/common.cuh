// Shared CUDA helpers for deltaserve kernels: error checks, warp/block reductions, half/bf16 loads.
// Everything here works on sm_70+; faster sm_80+/sm_90 paths are guarded by __CUDA_ARCH__.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "common/util/status.h"

namespace ds::cuda {

// Programmatic dependent launch (sm_90+; no-ops below). A kernel launched early
// (LaunchMaybeEarly) may start while the kernel before it in the stream still runs, once every
// block of that one has called AllowDependentLaunch (or exited). Until it calls
// WaitForPrerequisiteGrids it may only touch what no earlier kernel writes (weights); the wait
// returns when the earlier grids have completed and their writes are visible, and is a no-op in
// a kernel launched the plain way. AllowDependentLaunch changes no result: it only lets such a
// kernel be scheduled earlier (kernels/cuda/README.md, "Early launch of the decode kernels").
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void WaitForPrerequisiteGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, stream>>>(args...); `early`: with programmatic stream
// serialization (the kernel must call WaitForPrerequisiteGrids before it reads or writes anything
// another kernel touches). Errors surface through cudaGetLastError as for <<<>>>. (.cu files
// only: the host compiler of the .cc files that include this header has no <<<>>>.)
#if defined(__CUDACC__)
template <typename... Params, typename... Args>
void LaunchMaybeEarly(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, bool early, Args&&... args) {
#if CUDART_VERSION >= 12000
  if (early) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    return;
  }
#endif
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
}
#endif

#if defined(__CUDACC__)
// Whether the current device's compute capability (10 * major + minor) lies in [cc_lo, cc_hi]
// and `probe`, a one-thread kernel that writes 1 where the code it vouches for was compiled (0
// in builds without it), writes 1 there: for kernels whose body exists only in some builds
// (sm_90 / sm_90a), so that a build without it never launches an empty body.
inline bool ProbeWritesOne(void (*probe)(int*), int cc_lo, int cc_hi) {
  int dev = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
    return false;
  const int cc = 10 * prop.major + prop.minor;
  if (cc < cc_lo || cc > cc_hi) return false;
  int* d = nullptr;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return false;
  int h = 0;
  probe<<<1, 1>>>(d);
  const bool ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
  // A build without code for this device fails the launch ("no kernel image"): not sticky, but
  // left for the next error check to find unless read here.
  (void)cudaGetLastError();
  cudaFree(d);
  return ok && h == 1;
}
#endif

// For tests/bench mains: print the failing statement, file and line, then exit(1).
#define DS_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t ds_err_ = (expr);                                                             \
    if (ds_err_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(ds_err_),       \
                   __FILE__, __LINE__, #expr);                                                \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// For library code: turn a CUDA error into an absl::Status naming the statement.
#define DS_CUDA_RETURN_IF_ERROR(expr)                                                         \
  do {                                                                                        \
    cudaError_t ds_err_ = (expr);                                                             \
    if (ds_err_ != cudaSuccess)                                                               \
      return ::absl::InternalError(::absl::StrCat("CUDA error ", cudaGetErrorString(ds_err_), \
                                                  " at ", __FILE__, ":", __LINE__, ": ",      \
                                                  #expr));                                    \
  } while (0)

inline absl::Status LastLaunchStatus(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return absl::InternalError(absl::StrCat("kernel launch ", what, ": ", cudaGetErrorString(e)));
  return absl::OkStatus();
}

inline int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

#ifdef __CUDACC__
template <typename T>  // float, double, int
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the whole block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `scratch` must hold 32 values; the call contains two __syncthreads.
template <typename T>
__device__ __forceinline__ T BlockSum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T t = lane < nw ? scratch[lane] : T(0);
  return WarpSum(t);
}
// N block sums at once, each value reduced exactly as BlockSum reduces it (the same shuffles and
// the same order), for the price of one pair of __syncthreads. `scratch` holds N x 32 values.
template <int N>
__device__ __forceinline__ void BlockSums(float (&v)[N], float (*scratch)[32]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = WarpSum(v[i]);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) scratch[i][warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = WarpSum(lane < nw ? scratch[i][lane] : 0.f);
}
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nw ? scratch[lane] : -INFINITY;
  return WarpMax(t);
}

__device__ __forceinline__ float Bf16BitsToF32(uint32_t bits16) {
  return __uint_as_float(bits16 << 16);
}
__device__ __forceinline__ float HalfBitsToF32(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ float Silu(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ float Sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }
__device__ __forceinline__ float Softplus(float x) { return x > 20.f ? x : log1pf(__expf(x)); }

// Round-to-nearest-even f32 -> bf16 bits without needing sm_80 intrinsics.
__device__ __forceinline__ uint16_t F32ToBf16Bits(float f) {
  uint32_t b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
#endif  // __CUDACC__

}  // namespace ds::cuda
