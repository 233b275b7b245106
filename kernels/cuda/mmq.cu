// MMQ over tiled Q6_K (see mmq.cuh): activations staged in shared memory, shared by the tiles of
// a block; the per-(row, column) arithmetic of TiledKernel (gemv_tiled.cu), bit for bit.
#include "kernels/cuda/mmq.cuh"

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/tiled_q6k.cuh"

namespace ds::cuda {
namespace {

using namespace tiled;  // NOLINT: the layout helpers (tiled_q6k.cuh)

constexpr int kStreams = 4;  // K streams: unit u belongs to stream u % 4, as TiledKernel's warps
// One column's activations of a round (4 units = 1024 int8) padded by 16 bytes: the B-fragment
// loads of a warp (8 columns x 4 words) then hit 32 different banks.
constexpr int kXRow = 4 * kUnitElems + 16;
// One column's 32 block scales of a round, padded to 36 floats: the 8 columns a warp's scale
// loads touch land in 8 different banks (and rows stay 16-byte aligned for cp.async).
constexpr int kSRow = 36;
constexpr int kColBytes = kXRow + 4 * kSRow;

template <int NCB>
constexpr int StageBytes() {
  return NCB * kColBytes;
}

struct MmqLaunch {
  GemvArgs seg[kGemvMaxSegs];
  int blk_end[kGemvMaxSegs];  // inclusive prefix sums of the segments' block counts
  int n_segs;
};

// Block = S slots x 4 streams (warp w: stream w & 3, slot w >> 2). Slot s works on tile
// blk * TPB + s (pair: tile s / 2 of matrix s % 2). Round r stages units 4r..4r+3 of every
// column; stream kw then multiplies unit 4r + kw of its slot's tile.
template <int NT, int S, bool kPair, int kStages>
__global__ void __launch_bounds__(kStreams * 32 * S) MmqTiledKernel(const __grid_constant__ MmqLaunch L) {
  constexpr int NCB = NT * 8;
  constexpr int TPB = kPair ? S / 2 : S;  // 16-row tiles per block
  constexpr int kThreads = kStreams * 32 * S;
  extern __shared__ __align__(16) uint8_t smem[];
  int si = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxSegs; ++i)
    if (i < L.n_segs && static_cast<int>(blockIdx.x) >= L.blk_end[i - 1]) si = i;
  const GemvArgs& a = L.seg[si];
  const int blk = blockIdx.x - (si > 0 ? L.blk_end[si - 1] : 0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kw = warp & 3, slot = warp >> 2, g = lane >> 2, q = lane & 3;
  const int mat = kPair ? (slot & 1) : 0;
  const int n_tiles = (a.M + kTiledRows - 1) / kTiledRows;
  const int tile = blk * TPB + (kPair ? slot >> 1 : slot);
  const bool active = tile < n_tiles;
  const int nu = a.K / kUnitElems, kb = a.K / 32, nc = a.nc;
  const uint8_t* wt = static_cast<const uint8_t*>(kPair && mat ? a.w2 : a.w) +
                      static_cast<int64_t>(active ? tile : 0) * nu * kTileUnitBytes;

  // Stage round r into buffer b: 16-byte cp.async of each column's 4 units and 32 scales.
  // Columns past nc copy column nc - 1 (their results are never stored).
  auto stage = [&](int r, int b) {
    uint8_t* xs = smem + b * StageBytes<NCB>();
    float* xsc = reinterpret_cast<float*>(xs + NCB * kXRow);
    const int u0 = 4 * r, nun = min(4, nu - u0);
    for (int i = tid; i < NCB * 64; i += kThreads) {
      const int c = i >> 6, k16 = i & 63;
      if (k16 < 16 * nun)
        CpAsync16(xs + c * kXRow + 16 * k16,
                  a.xq + static_cast<int64_t>(min(c, nc - 1)) * a.K + u0 * kUnitElems + 16 * k16);
    }
    for (int i = tid; i < NCB * 8; i += kThreads) {
      const int c = i >> 3, k4 = i & 7;
      if (k4 < 2 * nun)
        CpAsync16(xsc + c * kSRow + 4 * k4,
                  a.xd + static_cast<int64_t>(min(c, nc - 1)) * kb + 8 * u0 + 4 * k4);
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

  const int nr = (nu + kStreams - 1) / kStreams;
  stage(0, 0);
  CpAsyncCommit();
  for (int r = 0; r < nr; ++r) {
    const int b = kStages == 2 ? (r & 1) : 0;
    const int u = kStreams * r + kw;
    const bool go = active && u < nu;
    TileUnit tu;
    if (go) LoadTileUnit(tu, wt + static_cast<int64_t>(u) * kTileUnitBytes, lane);  // in flight during the wait
    if constexpr (kStages == 2) {
      if (r + 1 < nr) stage(r + 1, b ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    if (go) {
      const uint8_t* xs = smem + b * StageBytes<NCB>() + kw * kUnitElems + 4 * q;
      const float* xsc = reinterpret_cast<const float*>(smem + b * StageBytes<NCB>() + NCB * kXRow) + 8 * kw;
      const float dg = HalfBitsToF32(tu.d & 0xFFFF), dg8 = HalfBitsToF32(tu.d >> 16);
      float part[NT][4];
#pragma unroll
      for (int s = 0; s < 16; ++s) {
        uint32_t bw[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j)
          bw[j] = *reinterpret_cast<const uint32_t*>(xs + (8 * j + g) * kXRow + 16 * s);
        uint32_t a0, a1;
        DecodeStep(Word(tu.ql[s >> 2], s & 3), Word(tu.qh[s >> 3], (s & 7) >> 1), s & 1, a0, a1);
        const float s0 = dg * static_cast<float>(static_cast<int8_t>(Word(tu.sc0, s >> 2) >> (8 * (s & 3))));
        const float s1 = dg8 * static_cast<float>(static_cast<int8_t>(Word(tu.sc1, s >> 2) >> (8 * (s & 3))));
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          float f[4];
          Mma(a0, a1, bw[j], f);
          if ((s & 1) == 0) {
            part[j][0] = s0 * f[0];
            part[j][1] = s0 * f[1];
            part[j][2] = s1 * f[2];
            part[j][3] = s1 * f[3];
          } else {
            part[j][0] = fmaf(s0, f[0], part[j][0]);
            part[j][1] = fmaf(s0, f[1], part[j][1]);
            part[j][2] = fmaf(s1, f[2], part[j][2]);
            part[j][3] = fmaf(s1, f[3], part[j][3]);
          }
        }
        if (s & 1) {  // both sub-blocks of a 32-element activation block done: its scale
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const float x0 = xsc[(8 * j + 2 * q) * kSRow + (s >> 1)];
            const float x1 = xsc[(8 * j + 2 * q + 1) * kSRow + (s >> 1)];
            acc[j][0] = fmaf(x0, part[j][0], acc[j][0]);
            acc[j][1] = fmaf(x1, part[j][1], acc[j][1]);
            acc[j][2] = fmaf(x0, part[j][2], acc[j][2]);
            acc[j][3] = fmaf(x1, part[j][3], acc[j][3]);
          }
        }
      }
    }
    __syncthreads();  // buffer b is restaged next round (1 stage) or the one after (2 stages)
    if constexpr (kStages == 1) {
      if (r + 1 < nr) {
        stage(r + 1, 0);
        CpAsyncCommit();
      }
    }
  }

  // Streams summed in stream order into red[slot][16][NCB] (reusing the staging buffers; the
  // loop ended on a barrier): ((0 + s0) + s1) + s2) + s3, TiledKernel's order.
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int w = 0; w < kStreams; ++w) {
    if (kw == w) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float& dst = red[(slot * kTiledRows + g + 8 * (e >> 1)) * NCB + 8 * j + 2 * q + (e & 1)];
          dst = (w == 0 ? 0.f : dst) + acc[j][e];
        }
    }
    __syncthreads();
  }
  const int64_t ldy = a.ldy ? a.ldy : a.M;
  constexpr int kRows = TPB * kTiledRows;
  for (int o = tid; o < kRows * NCB; o += kThreads) {
    const int rb = o % kRows, c = o / kRows;
    const int t = rb / kTiledRows, rr = rb % kTiledRows;
    const int row = (blk * TPB + t) * kTiledRows + rr;
    if (c >= nc || row >= a.M) continue;
    float* dst = a.y + c * ldy + row;
    if constexpr (kPair) {
      const float v0 = red[((2 * t) * kTiledRows + rr) * NCB + c];
      const float v1 = red[((2 * t + 1) * kTiledRows + rr) * NCB + c];
      *dst = Silu(v0) * v1;
    } else {
      const float v = red[(t * kTiledRows + rr) * NCB + c];
      *dst = a.epilogue == GemvEpilogue::kAccumulate ? *dst + v : v;
    }
  }
}

template <int NT, int S, bool kPair, int kStages>
absl::Status LaunchOne(MmqLaunch& L, cudaStream_t stream) {
  constexpr int TPB = kPair ? S / 2 : S;
  constexpr int kSmem = kStages * StageBytes<NT * 8>();
  static_assert(kSmem >= S * kTiledRows * NT * 8 * 4, "reduction buffer must fit the stages");
  static const cudaError_t attr = cudaFuncSetAttribute(
      MmqTiledKernel<NT, S, kPair, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (attr != cudaSuccess)
    return absl::InternalError(absl::StrCat("MmqTiledMulti: shared memory ", kSmem, ": ", cudaGetErrorString(attr)));
  int end = 0;
  for (int i = 0; i < L.n_segs; ++i) {
    end += CeilDiv(CeilDiv(L.seg[i].M, kTiledRows), TPB);
    L.blk_end[i] = end;
  }
  MmqTiledKernel<NT, S, kPair, kStages><<<end, kStreams * 32 * S, kSmem, stream>>>(L);
  return LastLaunchStatus("MmqTiledKernel");
}

// Instantiated shapes: 8-column tiles 2 and 4 (ptxas, sm_90a: 98 / 128 registers, no spills)
// with 2 slots or 4; 64 columns only with 2 slots (255 registers with 2 stages, 211 with 1;
// 4 slots spill at the 128-register cap), with 1 or 2 stages (151 KB of shared memory for 2).
template <int NT, bool kPair>
absl::Status LaunchShape(MmqLaunch& L, MmqShape sh, cudaStream_t stream) {
  if constexpr (NT == 8) {
    if (sh.stages == 1) return LaunchOne<NT, 2, kPair, 1>(L, stream);
    return LaunchOne<NT, 2, kPair, 2>(L, stream);
  } else {
    if (sh.slots == 4) return LaunchOne<NT, 4, kPair, 2>(L, stream);
    return LaunchOne<NT, 2, kPair, 2>(L, stream);
  }
}

template <int NT>
absl::Status LaunchNt(MmqLaunch& L, MmqShape sh, cudaStream_t stream) {
  if (L.seg[0].epilogue == GemvEpilogue::kSiluMul) return LaunchShape<NT, true>(L, sh, stream);
  return LaunchShape<NT, false>(L, sh, stream);
}

}  // namespace

bool MmqSupported(GgmlType t) { return TiledInt8Supported(t); }

absl::Status MmqTiledMulti(const GemvArgs* segs, int n_segs, MmqShape shape, cudaStream_t stream) {
  if (n_segs < 1 || n_segs > kGemvMaxSegs)
    return absl::InvalidArgumentError(absl::StrCat("MmqTiledMulti: ", n_segs, " segments outside [1, ", kGemvMaxSegs, "]"));
  if ((shape.slots != 2 && shape.slots != 4) || (shape.stages != 1 && shape.stages != 2) ||
      (shape.max_cols != 0 && (shape.max_cols < 1 || shape.max_cols % 8 != 0)))
    return absl::InvalidArgumentError(absl::StrCat("MmqTiledMulti: shape slots=", shape.slots, " stages=",
                                                   shape.stages, " max_cols=", shape.max_cols));
  const GemvArgs& b = segs[0];
  for (int i = 0; i < n_segs; ++i) {
    const GemvArgs& a = segs[i];
    if (!MmqSupported(a.type))
      return absl::UnimplementedError(absl::StrCat("MmqTiledMulti: no tiled layout for ", std::string(GgmlInfo(a.type).name)));
    if (a.nc < 1 || a.nc > kMmqMaxCols || a.M <= 0 || a.K <= 0 || a.K % kUnitElems != 0)
      return absl::InvalidArgumentError(absl::StrCat("MmqTiledMulti: bad shape M=", a.M, " K=", a.K, " nc=", a.nc));
    if (a.xq == nullptr || a.xd == nullptr || a.y == nullptr || a.w == nullptr)
      return absl::InvalidArgumentError("MmqTiledMulti: needs w, xq/xd and y");
    if (a.epilogue == GemvEpilogue::kSiluMul && (a.w2 == nullptr || n_segs != 1))
      return absl::InvalidArgumentError("MmqTiledMulti: kSiluMul takes one segment with w2");
    if (i > 0 && (a.type != b.type || a.K != b.K || a.nc != b.nc || a.xq != b.xq || a.xd != b.xd))
      return absl::InvalidArgumentError("MmqTiledMulti: segments must share type, K, nc and activations");
  }
  if ((reinterpret_cast<uintptr_t>(b.xq) | reinterpret_cast<uintptr_t>(b.xd)) % 16 != 0)
    return absl::InvalidArgumentError("MmqTiledMulti: xq / xd not 16-byte aligned");
  if (shape.max_cols > 0 && b.nc > shape.max_cols) {
    // Column passes of max_cols (each reads the weights again; columns are independent, so the
    // numbers are those of one pass).
    for (int c0 = 0; c0 < b.nc; c0 += shape.max_cols) {
      GemvArgs part[kGemvMaxSegs];
      for (int i = 0; i < n_segs; ++i) {
        part[i] = segs[i];
        const int64_t ldy = segs[i].ldy ? segs[i].ldy : segs[i].M;
        part[i].nc = std::min(shape.max_cols, b.nc - c0);
        part[i].xq = b.xq + static_cast<int64_t>(c0) * b.K;
        part[i].xd = b.xd + static_cast<int64_t>(c0) * (b.K / 32);
        part[i].y = segs[i].y + c0 * ldy;
        part[i].ldy = ldy;
      }
      MmqShape one = shape;
      one.max_cols = 0;
      DS_RETURN_IF_ERROR(MmqTiledMulti(part, n_segs, one, stream));
    }
    return absl::OkStatus();
  }
  MmqLaunch L{};
  for (int i = 0; i < n_segs; ++i) L.seg[i] = segs[i];
  L.n_segs = n_segs;
  if (b.nc <= 16) return LaunchNt<2>(L, shape, stream);
  if (b.nc <= 32) return LaunchNt<4>(L, shape, stream);
  return LaunchNt<8>(L, shape, stream);
}

}  // namespace ds::cuda
