// The Gated DeltaNet kernels' access to the delta-rule state in either storage type (gdn.cuh):
// float, or __nv_bfloat16 (CudaBackendOptions::gdn_state_bf16). Loads widen to f32, stores
// round to nearest even; the kernels' arithmetic is f32 either way, and for float every helper
// is the plain load / store / identity, so the f32 instantiations compile to the code they had
// before the type became a parameter. The bf16 conversions are cuda_bf16.h's: a cvt on sm_80+,
// integer code below (no bf16 arithmetic is used anywhere).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

namespace ds::cuda {

__device__ __forceinline__ float LoadState(const float* p) { return *p; }
__device__ __forceinline__ float LoadState(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void StoreState(float* p, float x) { *p = x; }
__device__ __forceinline__ void StoreState(__nv_bfloat16* p, float x) {
  *p = __float2bfloat16_rn(x);
}

// x as a store and a reload of the state give it back: x itself for f32, bf16(x) for bf16. A
// decode run keeps the state in registers between its tokens; this keeps the next token's input
// the value one launch per token would load.
template <typename TS>
__device__ __forceinline__ float AsStored(float x) {
  if constexpr (std::is_same_v<TS, float>)
    return x;
  else
    return __bfloat162float(__float2bfloat16_rn(x));
}

// f(TS{}) with TS = __nv_bfloat16 when `bf16`, else float (a tag value; C++17: no template
// lambdas in the CUDA 11.8 build).
template <typename F>
void DispatchState(bool bf16, F&& f) {
  if (bf16)
    f(__nv_bfloat16{});
  else
    f(float{});
}

}  // namespace ds::cuda
