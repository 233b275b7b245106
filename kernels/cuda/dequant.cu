// Dequantization to bf16/f16 (see dequant.cuh): one warp per 256-element unit, lane writes 16 bytes.
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace ds::cuda {
namespace {

__device__ __forceinline__ uint32_t Pack2(float a, float b, bool bf16) {
  if (bf16) return F32ToBf16Bits(a) | (static_cast<uint32_t>(F32ToBf16Bits(b)) << 16);
  return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(a))) |
         (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(b))) << 16);
}

template <GgmlType T>
__global__ void DequantUnitKernel(const uint8_t* __restrict__ w, int64_t n_units, int units_per_row,
                                  uint16_t* __restrict__ out, bool bf16) {
  const int64_t unit = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (unit >= n_units) return;
  // Rows are contiguous and K is a multiple of 256, so unit u of the matrix is unit u of the stream.
  float v[8];
  DecodeLane8<T>(w + unit * UnitBytes(T), lane, v);
  uint4 o;
  o.x = Pack2(v[0], v[1], bf16);
  o.y = Pack2(v[2], v[3], bf16);
  o.z = Pack2(v[4], v[5], bf16);
  o.w = Pack2(v[6], v[7], bf16);
  *reinterpret_cast<uint4*>(out + unit * 256 + lane * 8) = o;
}

template <GgmlType T>
__global__ void DequantElemKernel(const uint8_t* __restrict__ w, int64_t rows, int K,
                                  uint16_t* __restrict__ out, bool bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * K) return;
  const int64_t r = i / K;
  const float v = DecodeElem<T>(w + r * static_cast<int64_t>(GgmlRowBytes(T, K)), i % K);
  out[i] = bf16 ? F32ToBf16Bits(v) : __half_as_ushort(__float2half_rn(v));
}

__global__ void ConvertKernel(const float* __restrict__ x, int64_t n, uint16_t* __restrict__ out,
                              bool bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = bf16 ? F32ToBf16Bits(x[i]) : __half_as_ushort(__float2half_rn(x[i]));
}

// scale[0] (as uint32) = max over i of the bits of |x[i]|: non-negative floats order like their
// bits, so one atomicMax per warp finds the max magnitude (NaN's bits sort above +inf).
__global__ void AbsMaxBitsKernel(const float* __restrict__ x, int64_t n, unsigned int* amax) {
  unsigned int m = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    m = max(m, __float_as_uint(x[i]) & 0x7fffffffu);
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(amax, m);
}

// The exponent e >= 0 with max|x| * 2^-e <= kF16ScaleAbove (0 when it already is, or when the
// max is not finite). Every thread computes the same e from the same bits.
__device__ __forceinline__ int F16ScaleExponent(unsigned int amax_bits) {
  const float amax = __uint_as_float(amax_bits);
  if (!(amax > kF16ScaleAbove) || amax_bits >= 0x7f800000u) return 0;
  int e = 0;
  frexpf(amax / kF16ScaleAbove, &e);  // amax / 2^15 = m * 2^e, m in [0.5, 1): amax * 2^-e < 2^15
  return e;
}

__global__ void ConvertScaledKernel(const float* __restrict__ x, int64_t n,
                                    uint16_t* __restrict__ out, float* scale) {
  const int e = F16ScaleExponent(__float_as_uint(scale[0]));
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i == 0) scale[1] = ldexpf(1.f, e);
  if (i >= n) return;
  out[i] = __half_as_ushort(__float2half_rn(ldexpf(x[i], -e)));
}

}  // namespace

absl::Status ConvertF32ToHalfScaled(const float* x, int64_t n, void* out, float* scale,
                                    cudaStream_t stream) {
  DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scale, 0, sizeof(float), stream));
  if (n > 0)
    AbsMaxBitsKernel<<<static_cast<int>(std::min<int64_t>(CeilDiv(n, 256), 1024)), 256, 0,
                       stream>>>(x, n, reinterpret_cast<unsigned int*>(scale));
  DS_RETURN_IF_ERROR(LastLaunchStatus("ConvertF32ToHalfScaled(max)"));
  ConvertScaledKernel<<<CeilDiv(std::max<int64_t>(n, 1), 256), 256, 0, stream>>>(
      x, n, static_cast<uint16_t*>(out), scale);
  return LastLaunchStatus("ConvertF32ToHalfScaled");
}

absl::Status DequantizeRows(GgmlType type, const void* w, int64_t rows, int K, void* out, bool bf16,
                            cudaStream_t stream) {
  if (UnitBytes(type) == 0)
    return absl::UnimplementedError(
        absl::StrCat("DequantizeRows: type ", std::string(GgmlInfo(type).name), " not supported"));
  if (K % BlockElems(type) != 0)
    return absl::InvalidArgumentError(absl::StrCat("DequantizeRows: K=", K, " not a multiple of the block"));
  if (rows < 0 || K < 0)
    return absl::InvalidArgumentError(absl::StrCat("DequantizeRows: rows=", rows, " K=", K));
  // A TP rank can hold an empty slice (TP = 3 on 4 GDN key heads in granules of 2: no GDN heads
  // on one rank); a launch of zero blocks is an error, nothing to do is not.
  if (rows == 0 || K == 0) return absl::OkStatus();
  const auto* src = static_cast<const uint8_t*>(w);
  auto* dst = static_cast<uint16_t*>(out);
  DispatchType(type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    if (K % kUnitElems == 0) {
      const int64_t n_units = rows * (K / kUnitElems);
      DequantUnitKernel<T><<<CeilDiv(n_units * 32, 256), 256, 0, stream>>>(src, n_units, K / 256, dst, bf16);
    } else {
      DequantElemKernel<T><<<CeilDiv(rows * K, 256), 256, 0, stream>>>(src, rows, K, dst, bf16);
    }
  });
  return LastLaunchStatus("DequantizeRows");
}

absl::Status ConvertF32ToHalf(const float* x, int64_t n, void* out, bool bf16, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  ConvertKernel<<<CeilDiv(n, 256), 256, 0, stream>>>(x, n, static_cast<uint16_t*>(out), bf16);
  return LastLaunchStatus("ConvertF32ToHalf");
}

}  // namespace ds::cuda
