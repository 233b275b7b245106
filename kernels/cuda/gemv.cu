// Quantized GEMV kernels (see gemv.cuh). Lab notes and measured speeds: kernels/cuda/README.md.
#include "kernels/cuda/gemv.cuh"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace ds::cuda {
namespace {

constexpr int kWarps = 4;  // 128 threads per block

// One warp per 32 activations: lane i quantizes element i of the block.
__global__ void QuantizeActKernel(const float* __restrict__ x, int n_blocks,
                                  int8_t* __restrict__ xq, float* __restrict__ xd) {
  const int lane = threadIdx.x & 31;
  const int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (b >= n_blocks) return;
  const float v = x[static_cast<int64_t>(b) * 32 + lane];
  const float amax = WarpMax(fabsf(v));
  const float d = amax / 127.f;
  const float id = d > 0.f ? 1.f / d : 0.f;
  xq[static_cast<int64_t>(b) * 32 + lane] = static_cast<int8_t>(__float2int_rn(v * id));
  if (lane == 0) xd[b] = d;
}

template <int NR, int NC>
__device__ __forceinline__ void ReduceStore(float (&acc)[NR][NC], const GemvArgs& a, int row0,
                                            int lane) {
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = WarpSum(acc[r][c]);
  if (lane != 0) return;
  const int64_t ldy = a.ldy ? a.ldy : a.M;
  if (a.epilogue == GemvEpilogue::kSiluMul) {
    // NR == 2 here: acc[0] from W (gate), acc[1] from W2 (up), one output row.
#pragma unroll
    for (int c = 0; c < NC; ++c)
      if (c < a.nc) a.y[c * ldy + row0] = Silu(acc[0][c]) * acc[NR - 1][c];
    return;
  }
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    if (row0 + r >= a.M) break;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (c >= a.nc) break;
      float* dst = a.y + c * ldy + row0 + r;
      *dst = a.epilogue == GemvEpilogue::kAccumulate ? *dst + acc[r][c] : acc[r][c];
    }
  }
}

// Unit path. Warp w of block b owns rows [row0, row0 + R) (or, in pair mode, row row0 of W and
// of W2) and walks all K/256 units; lanes own 8 elements of each unit, so activations are loaded
// once per unit and reused across the warp's rows.
template <GgmlType T, int NC, bool kPair>
__global__ void __launch_bounds__(kWarps * 32) GemvUnitKernel(const GemvArgs a) {
  constexpr int R = kPair ? 1 : 2;
  constexpr int NR = kPair ? 2 : R;
  constexpr int UB = UnitBytes(T);
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * R;
  if (row0 >= a.M) return;
  const int nu = a.K / kUnitElems;
  const int64_t rb = static_cast<int64_t>(nu) * UB;
  const uint8_t* rows[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    if (kPair) {
      rows[r] = static_cast<const uint8_t*>(r == 0 ? a.w : a.w2) + row0 * rb;
    } else {
      rows[r] = static_cast<const uint8_t*>(a.w) + min(row0 + r, a.M - 1) * rb;
    }
  }
  float acc[NR][NC];
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = 0.f;

  if constexpr (IsFloatType(T)) {
#pragma unroll 2
    for (int u = 0; u < nu; ++u) {
      float w[NR][8];
#pragma unroll
      for (int r = 0; r < NR; ++r) DecodeFloat8<T>(rows[r] + u * UB, lane, w[r]);
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const int ce = min(c, a.nc - 1);
        const float4* xp =
            reinterpret_cast<const float4*>(a.x + static_cast<int64_t>(ce) * a.K + u * 256 + 8 * lane);
        const float4 x0 = xp[0], x1 = xp[1];
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][c] = fmaf(w[r][i], xv[i], acc[r][c]);
      }
    }
  } else {
    const int kb = a.K / 32;
#pragma unroll 2
    for (int u = 0; u < nu; ++u) {
      LaneQ q[NR];
#pragma unroll
      for (int r = 0; r < NR; ++r) q[r] = UnitCodec<T>::Decode(rows[r] + u * UB, lane);
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const int ce = min(c, a.nc - 1);
        const int2 xw =
            *reinterpret_cast<const int2*>(a.xq + static_cast<int64_t>(ce) * a.K + u * 256 + 8 * lane);
        const float dx = a.xd[ce * kb + u * 8 + (lane >> 2)];
        float sx = 0.f;
        if constexpr (UnitCodec<T>::kHasMin)
          sx = static_cast<float>(__dp4a(xw.x, 0x01010101, __dp4a(xw.y, 0x01010101, 0)));
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          const int s = __dp4a(static_cast<int>(q[r].q0), xw.x, __dp4a(static_cast<int>(q[r].q1), xw.y, 0));
          float v = q[r].sc * static_cast<float>(s);
          if constexpr (UnitCodec<T>::kHasMin) v -= q[r].mn * sx;
          acc[r][c] = fmaf(dx, v, acc[r][c]);
        }
      }
    }
  }
  ReduceStore<NR, NC>(acc, a, row0, lane);
}

// Fallback for K not a multiple of 256: one warp per row, per-element decode, f32 activations.
template <GgmlType T>
__global__ void __launch_bounds__(kWarps * 32) GemvElemKernel(const GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= a.M) return;
  const int64_t rb = static_cast<int64_t>(GgmlRowBytes(T, a.K));
  const bool pair = a.epilogue == GemvEpilogue::kSiluMul;
  const uint8_t* w1 = static_cast<const uint8_t*>(a.w) + row * rb;
  const uint8_t* w2 = pair ? static_cast<const uint8_t*>(a.w2) + row * rb : w1;
  float acc[2][kGemvMaxCols] = {};
  for (int i = lane; i < a.K; i += 32) {
    const float v1 = DecodeElem<T>(w1, i);
    const float v2 = pair ? DecodeElem<T>(w2, i) : 0.f;
#pragma unroll
    for (int c = 0; c < kGemvMaxCols; ++c) {
      if (c >= a.nc) break;
      const float xv = a.x[static_cast<int64_t>(c) * a.K + i];
      acc[0][c] = fmaf(v1, xv, acc[0][c]);
      acc[1][c] = fmaf(v2, xv, acc[1][c]);
    }
  }
  const int64_t ldy = a.ldy ? a.ldy : a.M;
#pragma unroll
  for (int c = 0; c < kGemvMaxCols; ++c) {
    if (c >= a.nc) break;
    const float s1 = WarpSum(acc[0][c]);
    const float s2 = WarpSum(acc[1][c]);
    if (lane == 0) {
      float* dst = a.y + c * ldy + row;
      if (a.epilogue == GemvEpilogue::kSiluMul) *dst = Silu(s1) * s2;
      else if (a.epilogue == GemvEpilogue::kAccumulate) *dst += s1;
      else *dst = s1;
    }
  }
}

template <GgmlType T, int NC>
void LaunchUnit(const GemvArgs& a, cudaStream_t s) {
  if (a.epilogue == GemvEpilogue::kSiluMul) {
    GemvUnitKernel<T, NC, true><<<CeilDiv(a.M, kWarps), kWarps * 32, 0, s>>>(a);
  } else {
    GemvUnitKernel<T, NC, false><<<CeilDiv(a.M, kWarps * 2), kWarps * 32, 0, s>>>(a);
  }
}

}  // namespace

absl::Status QuantizeActivations(const float* x, int nc, int K, int8_t* xq, float* xd,
                                 cudaStream_t stream) {
  if (K % 32 != 0) return absl::InvalidArgumentError(absl::StrCat("QuantizeActivations: K=", K, " not a multiple of 32"));
  const int nb = nc * (K / 32);
  if (nb == 0) return absl::OkStatus();
  QuantizeActKernel<<<CeilDiv(nb, 8), 256, 0, stream>>>(x, nb, xq, xd);
  return LastLaunchStatus("QuantizeActKernel");
}

bool GemvSupported(GgmlType t) { return UnitBytes(t) != 0; }

bool GemvWantsQuantizedX(GgmlType t, int K) {
  return !IsFloatType(t) && UnitBytes(t) != 0 && K % kUnitElems == 0;
}

absl::Status Gemv(const GemvArgs& a, cudaStream_t stream) {
  if (!GemvSupported(a.type))
    return absl::UnimplementedError(absl::StrCat("Gemv: type ", std::string(GgmlInfo(a.type).name), " not supported on CUDA"));
  if (a.nc < 1 || a.nc > kGemvMaxCols)
    return absl::InvalidArgumentError(absl::StrCat("Gemv: nc=", a.nc, " outside [1, ", kGemvMaxCols, "]"));
  if (a.M <= 0 || a.K <= 0 || a.K % BlockElems(a.type) != 0)
    return absl::InvalidArgumentError(absl::StrCat("Gemv: bad shape M=", a.M, " K=", a.K, " for ", std::string(GgmlInfo(a.type).name)));
  if (a.epilogue == GemvEpilogue::kSiluMul && a.w2 == nullptr)
    return absl::InvalidArgumentError("Gemv: kSiluMul needs w2");
  const bool unit = a.K % kUnitElems == 0;
  if (unit && !IsFloatType(a.type) && (a.xq == nullptr || a.xd == nullptr))
    return absl::InvalidArgumentError("Gemv: quantized format needs xq/xd activations");
  if ((!unit || IsFloatType(a.type)) && a.x == nullptr)
    return absl::InvalidArgumentError("Gemv: needs f32 activations x");
  DispatchType(a.type, [&]<GgmlType T>() {
    if (!unit) {
      GemvElemKernel<T><<<CeilDiv(a.M, kWarps), kWarps * 32, 0, stream>>>(a);
    } else if (a.nc == 1) {
      LaunchUnit<T, 1>(a, stream);
    } else if (a.nc == 2) {
      LaunchUnit<T, 2>(a, stream);
    } else if (a.nc <= 4) {
      LaunchUnit<T, 4>(a, stream);
    } else {
      LaunchUnit<T, 8>(a, stream);
    }
  });
  return LastLaunchStatus("Gemv");
}

}  // namespace ds::cuda
