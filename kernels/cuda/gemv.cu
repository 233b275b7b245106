// Quantized GEMV kernels (see gemv.cuh). Lab notes and measured speeds: kernels/cuda/README.md.
#include "kernels/cuda/gemv.cuh"


#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quantize_block.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace ds::cuda {
namespace {

constexpr int kWarps = 4;  // 128 threads per block

// One warp per 32 activations: lane i quantizes element i of the block.
__global__ void QuantizeActKernel(const float* __restrict__ x, int n_blocks,
                                  int8_t* __restrict__ xq, float* __restrict__ xd,
                                  int32_t* __restrict__ xsum) {
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();      // the column kernel after it may start loading its weights
  const int lane = threadIdx.x & 31;
  const int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (b >= n_blocks) return;
  QuantizeBlock32(x[static_cast<int64_t>(b) * 32 + lane], lane, xq + static_cast<int64_t>(b) * 32,
                  xd + b, xsum != nullptr ? xsum + 2 * static_cast<int64_t>(b) : nullptr);
}

// v2 work layout. Block = 4 warps owning R row streams (R rows, or row r of W and of W2 in pair
// mode); the 4 warps split K (warp w takes units w, w+4, ...), so a matrix of M rows launches
// M/R blocks of 128 threads: 4x the warps of v1 for the short-M / long-K matrices (ffn_down,
// ssm_out, attn_output: M = 5120, K up to 17408 had 19 warps per SM in v1). One launch covers up
// to kGemvMaxSegs matrices that share the activations (GDN qkv+gate, attention q+k+v): the tiny
// ones ride along instead of running alone on a few SMs.
struct GemvLaunch {
  GemvArgs seg[kGemvMaxSegs];
  int blk_end[kGemvMaxSegs];  // exclusive prefix sums of the segments' block counts
  int n_segs;
};

template <GgmlType T, int NC, int NR, bool kA4>
__device__ __forceinline__ void QuantUnit(const GemvArgs& a, const uint8_t* const (&rows)[NR],
                                          int u, int lane, int kb, float (&acc)[NR][NC]) {
  constexpr int UB = UnitBytes(T);
  LaneQ q[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    if constexpr (T == GgmlType::Q6_K) q[r] = UnitCodec<T>::template Decode<kA4>(rows[r] + u * UB, lane);
    else q[r] = UnitCodec<T>::Decode(rows[r] + u * UB, lane);
  }
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int ce = min(c, a.nc - 1);
    const int2 xw = __ldg(reinterpret_cast<const int2*>(a.xq + static_cast<int64_t>(ce) * a.K + u * 256 + 8 * lane));
    const float dx = __ldg(a.xd + ce * kb + u * 8 + (lane >> 2));
    float sx = 0.f;
    if constexpr (UnitCodec<T>::kHasMin)
      sx = static_cast<float>(__dp4a(xw.x, 0x01010101, __dp4a(xw.y, 0x01010101, 0)));
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      // s + 1.5*2^23 as float bits is exact for |s| < 2^22 (|s| <= 8*128*127): an integer add
      // and a float subtract replace I2F, which issues at a quarter of the FP32 rate on sm_90
      // (x16 decode: 16 conversions per decoded weight word).
      const int s = __dp4a(static_cast<int>(q[r].q0), xw.x, __dp4a(static_cast<int>(q[r].q1), xw.y, 0x4B400000));
      float v = q[r].sc * (__int_as_float(s) - 12582912.f);
      if constexpr (UnitCodec<T>::kHasMin) v -= q[r].mn * sx;
      acc[r][c] = fmaf(dx, v, acc[r][c]);
    }
  }
}

template <GgmlType T, int NC, bool kPair, int R>
__global__ void __launch_bounds__(kWarps * 32) GemvUnitKernel(const __grid_constant__ GemvLaunch L) {
  constexpr int NR = kPair ? 2 : R;
  constexpr int UB = UnitBytes(T);
  __shared__ float red[kWarps][NR][NC];
  // Launched early: quantized weights wait here (nothing before this); float weights first
  // request their first kFloatEarlyUnits units per warp below (see there), unless asked not to.
  const bool early_weights = IsFloatType(T) && L.seg[0].early_weights;
  if (!early_weights) {
    WaitForPrerequisiteGrids();
    AllowDependentLaunch();
  }
  int si = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxSegs; ++i)
    if (i < L.n_segs && static_cast<int>(blockIdx.x) >= L.blk_end[i - 1]) si = i;
  const GemvArgs& a = L.seg[si];
  const int blk = blockIdx.x - (si > 0 ? L.blk_end[si - 1] : 0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // Float weights past NC columns: column group blockIdx.y takes columns c0.. (LaunchUnit);
  // every column's sums are the same operations whichever block computes it.
  const int c0 = static_cast<int>(blockIdx.y) * NC, ncb = min(NC, a.nc - c0);
  const int row0 = blk * (kPair ? 1 : R);
  const int nu = a.K / kUnitElems;
  const int64_t rb = static_cast<int64_t>(nu) * UB;
  const uint8_t* rows[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    if (kPair) rows[r] = static_cast<const uint8_t*>(r == 0 ? a.w : a.w2) + row0 * rb;
    else rows[r] = static_cast<const uint8_t*>(a.w) + min(row0 + r, a.M - 1) * rb;
  }
  float acc[NR][NC];
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = 0.f;

  if constexpr (IsFloatType(T)) {
    // The warp's first units of weights are requested before the wait for the kernel ahead:
    // they are the model's constants (no kernel writes them), and launched early this block may
    // start while that kernel ends, so their loads from HBM overlap its tail instead of
    // following it. The ssm_alpha / ssm_beta pair of the 27B (2 MB of F32 behind ~20 GB of other
    // weights) cost 15 us per layer in the x16 step's graph against 6.8 us warm and alone, and
    // every matrix of the F16 demo model goes through here. Only where the loads come from: the
    // same products in the same order.
    constexpr int kFloatEarlyUnits = 2;
    RawFloat8 early[kFloatEarlyUnits][NR];
#pragma unroll
    for (int p = 0; p < kFloatEarlyUnits; ++p) {
      const int u = warp + p * kWarps;
#pragma unroll
      for (int r = 0; r < NR; ++r)
        if (u < nu) early[p][r] = LoadFloat8<T>(rows[r] + u * UB, lane);
    }
    if (early_weights) {
      WaitForPrerequisiteGrids();
      AllowDependentLaunch();
    }
    // Unit u's products with the block's columns, in the order of every unit.
    auto multiply = [&](int u, const float(&w)[NR][8]) {
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const int ce = c0 + min(c, ncb - 1);
        const float4* xp =
            reinterpret_cast<const float4*>(a.x + static_cast<int64_t>(ce) * a.K + u * 256 + 8 * lane);
        const float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][c] = fmaf(w[r][i], xv[i], acc[r][c]);
      }
    };
    // The early units (constant indices into `early`: no local memory), then the rest.
#pragma unroll
    for (int p = 0; p < kFloatEarlyUnits; ++p) {
      const int u = warp + p * kWarps;
      if (u < nu) {
        float w[NR][8];
#pragma unroll
        for (int r = 0; r < NR; ++r) DecodeFloat8<T>(early[p][r], w[r]);
        multiply(u, w);
      }
    }
#pragma unroll 2
    for (int u = warp + kFloatEarlyUnits * kWarps; u < nu; u += kWarps) {
      float w[NR][8];
#pragma unroll
      for (int r = 0; r < NR; ++r) DecodeFloat8<T>(rows[r] + u * UB, lane, w[r]);
      multiply(u, w);
    }
  } else {
    const int kb = a.K / 32;
    // Warp w only ever sees units u = w (mod 4): their alignment is warp-uniform and fixed, so
    // the aligned decode is chosen once per warp (all row starts share it: rb % 4 checked).
    bool a4 = (rb & 3) == 0;
#pragma unroll
    for (int r = 0; r < NR; ++r) a4 = a4 && ((reinterpret_cast<uintptr_t>(rows[r] + warp * UB) & 3) == 0);
    if (a4 && (UB * kWarps) % 4 == 0) {
#pragma unroll 2
      for (int u = warp; u < nu; u += kWarps) QuantUnit<T, NC, NR, true>(a, rows, u, lane, kb, acc);
    } else {
#pragma unroll 2
      for (int u = warp; u < nu; u += kWarps) QuantUnit<T, NC, NR, false>(a, rows, u, lane, kb, acc);
    }
  }

#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const float v = WarpSum(acc[r][c]);
      if (lane == 0) red[warp][r][c] = v;
    }
  __syncthreads();
  const int t = threadIdx.x;
  const int64_t ldy = a.ldy ? a.ldy : a.M;
  if constexpr (kPair) {
    if (t < NC && t < ncb) {
      float g = 0.f, up = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        g += red[w][0][t];
        up += red[w][1][t];
      }
      a.y[(c0 + t) * ldy + row0] = Silu(g) * up;
    }
  } else {
    if (t < NR * NC) {
      const int r = t / NC, c = t % NC;
      if (row0 + r < a.M && c < ncb) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v += red[w][r][c];
        float* dst = a.y + (c0 + c) * ldy + row0 + r;
        *dst = a.epilogue == GemvEpilogue::kAccumulate ? *dst + v : v;
      }
    }
  }
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

// Rows per block: 2 for 1-2 columns; 4 from 4 columns on, so each activation load (L1) feeds
// 4 rows. At 8-16 columns this costs 174-251 registers (ptxas, sm_90a; 2 blocks = 8 warps per
// SM), but the alternative (R = 2, one unit in flight) measured worse: x16 51.7 vs 44.7 ms/step.
template <int NC>
constexpr int RowsFor() { return NC >= 4 ? 4 : 2; }

// Float weights take up to kGemvFloatMaxCols columns in one launch: groups of NC columns on the
// grid's second dimension, so a small matrix (the 27B's ssm_alpha / ssm_beta: 48 rows) at 16-64
// columns runs on 2-8x the blocks of one NC-column pass instead of one launch per 16 columns
// (docs/perf/h200.md, "Small float matrices at decode widths").
template <GgmlType T, int NC>
void LaunchUnit(GemvLaunch& L, cudaStream_t s) {
  const bool pair = L.seg[0].epilogue == GemvEpilogue::kSiluMul;
  constexpr int R = RowsFor<NC>();
  int end = 0;
  for (int i = 0; i < L.n_segs; ++i) {
    end += CeilDiv(L.seg[i].M, pair ? 1 : R);
    L.blk_end[i] = end;
  }
  const dim3 grid(end, CeilDiv(L.seg[0].nc, NC));
  const bool early = L.seg[0].early_launch;
  if (pair)
    LaunchMaybeEarly(GemvUnitKernel<T, NC, true, R>, grid, kWarps * 32, 0, s, early, L);
  else
    LaunchMaybeEarly(GemvUnitKernel<T, NC, false, R>, grid, kWarps * 32, 0, s, early, L);
}

}  // namespace

absl::Status QuantizeActivations(const float* x, int nc, int K, int8_t* xq, float* xd,
                                 cudaStream_t stream, int32_t* xsum, bool early) {
  if (K % 32 != 0) return absl::InvalidArgumentError(absl::StrCat("QuantizeActivations: K=", K, " not a multiple of 32"));
  const int nb = nc * (K / 32);
  if (nb == 0) return absl::OkStatus();
  LaunchMaybeEarly(QuantizeActKernel, CeilDiv(nb, 8), 256, 0, stream, early, x, nb, xq, xd, xsum);
  return LastLaunchStatus("QuantizeActKernel");
}

bool GemvSupported(GgmlType t) { return UnitBytes(t) != 0; }

int GemvMaxCols(GgmlType t) { return IsFloatType(t) ? kGemvFloatMaxCols : kGemvMaxCols; }

bool GemvWantsQuantizedX(GgmlType t, int K) {
  return !IsFloatType(t) && UnitBytes(t) != 0 && K % kUnitElems == 0;
}

namespace {
absl::Status CheckArgs(const GemvArgs& a) {
  if (!GemvSupported(a.type))
    return absl::UnimplementedError(absl::StrCat("Gemv: type ", std::string(GgmlInfo(a.type).name), " not supported on CUDA"));
  if (const int max_cols = GemvMaxCols(a.type); a.nc < 1 || a.nc > max_cols)
    return absl::InvalidArgumentError(absl::StrCat("Gemv: nc=", a.nc, " outside [1, ", max_cols, "]"));
  if (a.M <= 0 || a.K <= 0 || a.K % BlockElems(a.type) != 0)
    return absl::InvalidArgumentError(absl::StrCat("Gemv: bad shape M=", a.M, " K=", a.K, " for ", std::string(GgmlInfo(a.type).name)));
  if (a.epilogue == GemvEpilogue::kSiluMul && a.w2 == nullptr)
    return absl::InvalidArgumentError("Gemv: kSiluMul needs w2");
  const bool unit = a.K % kUnitElems == 0;
  if (unit && !IsFloatType(a.type) && (a.xq == nullptr || a.xd == nullptr))
    return absl::InvalidArgumentError("Gemv: quantized format needs xq/xd activations");
  if ((!unit || IsFloatType(a.type)) && a.x == nullptr)
    return absl::InvalidArgumentError("Gemv: needs f32 activations x");
  return absl::OkStatus();
}
}  // namespace

absl::Status GemvMulti(const GemvArgs* segs, int n_segs, cudaStream_t stream) {
  if (n_segs < 1 || n_segs > kGemvMaxSegs)
    return absl::InvalidArgumentError(absl::StrCat("GemvMulti: ", n_segs, " segments outside [1, ", kGemvMaxSegs, "]"));
  for (int i = 0; i < n_segs; ++i) {
    DS_RETURN_IF_ERROR(CheckArgs(segs[i]));
    const GemvArgs& a = segs[i];
    const GemvArgs& b = segs[0];
    if (i > 0 && (a.type != b.type || a.K != b.K || a.nc != b.nc || a.x != b.x || a.xq != b.xq ||
                  a.xd != b.xd || a.epilogue == GemvEpilogue::kSiluMul ||
                  b.epilogue == GemvEpilogue::kSiluMul))
      return absl::InvalidArgumentError("GemvMulti: segments must share type, K, nc and activations (no kSiluMul)");
  }
  const GemvArgs& a = segs[0];
  const bool unit = a.K % kUnitElems == 0;
  if (!unit) {
    for (int i = 0; i < n_segs; ++i)
      for (int c0 = 0; c0 < a.nc; c0 += kGemvMaxCols) {  // the kernel's columns at a time
        GemvArgs part = segs[i];
        const int64_t ldy = part.ldy ? part.ldy : part.M;
        part.nc = std::min(kGemvMaxCols, a.nc - c0);
        part.x += static_cast<int64_t>(c0) * part.K;
        part.y += static_cast<int64_t>(c0) * ldy;
        part.ldy = ldy;
        DispatchType(a.type, [&](auto tag) {
          constexpr GgmlType T = decltype(tag)::value;
          GemvElemKernel<T><<<CeilDiv(part.M, kWarps), kWarps * 32, 0, stream>>>(part);
        });
      }
    return LastLaunchStatus("Gemv(elem)");
  }
  GemvLaunch L{};
  for (int i = 0; i < n_segs; ++i) L.seg[i] = segs[i];
  L.n_segs = n_segs;
  DispatchType(a.type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    if (a.nc == 1) LaunchUnit<T, 1>(L, stream);
    else if (a.nc == 2) LaunchUnit<T, 2>(L, stream);
    else if (a.nc <= 4) LaunchUnit<T, 4>(L, stream);
    else if (IsFloatType(T) && a.six_columns && a.nc <= 6) {
      if constexpr (IsFloatType(T)) LaunchUnit<T, 6>(L, stream);  // compiled for floats only
    } else if (a.nc <= 8 || IsFloatType(T)) LaunchUnit<T, 8>(L, stream);
    else if constexpr (!IsFloatType(T)) LaunchUnit<T, 16>(L, stream);
  });
  return LastLaunchStatus("Gemv");
}

absl::Status Gemv(const GemvArgs& a, cudaStream_t stream) { return GemvMulti(&a, 1, stream); }

}  // namespace ds::cuda
