// Masked one-row decode attention (see mtp_attention.cuh). Two launches: per (head, split) a
// block of 4 warps walks its positions (warp w takes every 4th), each warp keeping an online
// softmax (max, sum, hd/32 accumulators per lane); the warps and then the splits are merged.
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mtp_attention.cuh"

namespace ds::cuda {
namespace {

constexpr int kWarps = 4;

// The query's slot, position, mask row and split count, from the host or the device form.
struct Query {
  int slot, pos, n_splits;
  const uint8_t* valid;
};
__device__ inline Query ResolveQuery(const MaskedAttnArgs& a) {
  if (!a.dev_pos) return {a.slot, a.pos, a.n_splits, a.valid};
  const int slot = *a.dev_slot, pos = *a.dev_pos;
  return {slot, pos, MaskedAttnSplits(pos, a.n_splits), a.valid + slot * a.valid_ld};
}

template <int HD>
__global__ void __launch_bounds__(kWarps * 32) MaskedAttnPartialKernel(const MaskedAttnArgs a) {
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();
  constexpr int E = HD / 32;  // elements per lane
  const int h = blockIdx.x, split = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const AttnShape& s = a.shape;
  const int group = s.n_head / s.n_kv, kvh = h / group;
  const Query qr = ResolveQuery(a);
  if (split >= qr.n_splits) return;  // device form: fewer splits than launched
  const int n = qr.pos + 1;
  const int per = (n + qr.n_splits - 1) / qr.n_splits;
  const int j0 = split * per, j1 = min(n, j0 + per);
  float q[E];
#pragma unroll
  for (int e = 0; e < E; ++e) q[e] = a.q[h * HD + lane + 32 * e];
  const float scale = rsqrtf(static_cast<float>(HD));
  float m = -INFINITY, l = 0.f, acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  const int64_t rb = a.kv.row_bytes();
  for (int j = j0 + warp; j < j1; j += kWarps) {
    if (!qr.valid[j]) continue;
    const int page = a.kv.block_table[qr.slot * a.kv.max_pages + j / a.kv.page_size];
    const int64_t row = (static_cast<int64_t>(page) * a.kv.page_size + j % a.kv.page_size) * s.n_kv + kvh;
    const __half* kr = reinterpret_cast<const __half*>(static_cast<const uint8_t*>(a.kv.k) + row * rb);
    const __half* vr = reinterpret_cast<const __half*>(static_cast<const uint8_t*>(a.kv.v) + row * rb);
    float d = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) d = fmaf(q[e], __half2float(kr[lane + 32 * e]), d);
    d = WarpSum(d) * scale;
    const float mn = fmaxf(m, d);
    const float c = __expf(m - mn), p = __expf(d - mn);
    l = l * c + p;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = fmaf(p, __half2float(vr[lane + 32 * e]), acc[e] * c);
    m = mn;
  }
  // Merge the warps: shared max, rescaled sums.
  __shared__ float sm[kWarps], sl[kWarps], sacc[kWarps][HD];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) sacc[warp][lane + 32 * e] = acc[e];
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w]);
  float* part = a.partials + (static_cast<int64_t>(h) * a.n_splits + split) * (HD + 2);
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      if (sm[w] > -INFINITY) v += sacc[w][d] * __expf(sm[w] - M);
    part[d] = v;
  }
  if (threadIdx.x == 0) {
    float L = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      if (sm[w] > -INFINITY) L += sl[w] * __expf(sm[w] - M);
    part[HD] = M;
    part[HD + 1] = L;
  }
}

// One block per head, one thread per output dimension.
__global__ void MaskedAttnCombineKernel(const MaskedAttnArgs a) {
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();
  const int h = blockIdx.x, d = threadIdx.x, hd = a.shape.hd;
  if (d >= hd) return;
  // Partials lie at the launched split pitch; the query's own split count is merged.
  const int n_splits = ResolveQuery(a).n_splits;
  const float* part = a.partials + static_cast<int64_t>(h) * a.n_splits * (hd + 2);
  float M = -INFINITY;
  for (int sp = 0; sp < n_splits; ++sp) M = fmaxf(M, part[sp * (hd + 2) + hd]);
  float v = 0.f, L = 0.f;
  for (int sp = 0; sp < n_splits; ++sp) {
    const float* p = part + sp * (hd + 2);
    if (!(p[hd] > -INFINITY)) continue;
    const float w = __expf(p[hd] - M);
    v += p[d] * w;
    L += p[hd + 1] * w;
  }
  const float o = L > 0.f ? v / L : 0.f;
  const float gate = a.qg[static_cast<int64_t>(h) * 2 * hd + hd + d];
  a.out[static_cast<int64_t>(h) * hd + d] = o * Sigmoid(gate);
}

__global__ void MtpMaskUpdateKernel(uint8_t* valid, int64_t ld, const int32_t* args) {
  WaitForPrerequisiteGrids();  // launched early: nothing before this
  AllowDependentLaunch();
  const int slot = args[0], pos0 = args[1], n = args[2], old_len = args[3];
  uint8_t* row = valid + slot * ld;
  const int end = max(pos0 + n, old_len);
  for (int j = pos0 + static_cast<int>(threadIdx.x); j < end; j += blockDim.x)
    row[j] = j < pos0 + n ? 1 : 0;
}

}  // namespace

absl::Status MtpMaskUpdate(uint8_t* valid, int64_t ld, const int32_t* args, cudaStream_t stream,
                           bool early) {
  if (!valid || !args || ld < 1) return absl::InvalidArgumentError("MtpMaskUpdate: bad arguments");
  LaunchMaybeEarly(MtpMaskUpdateKernel, 1, 256, 0, stream, early, valid, ld, args);
  return LastLaunchStatus("MTP mask update");
}

int64_t MaskedAttnPartialFloats(const AttnShape& s, int max_splits) {
  return static_cast<int64_t>(s.n_head) * std::max(1, max_splits) * (s.hd + 2);
}

absl::Status MaskedAttnDecode(const MaskedAttnArgs& a, cudaStream_t stream) {
  const AttnShape& s = a.shape;
  if (a.kv.type != GgmlType::F16)
    return absl::InvalidArgumentError("MaskedAttnDecode: the K/V plane must be f16");
  if (s.n_kv <= 0 || s.n_head % s.n_kv != 0 || a.pos < 0 || a.n_splits < 1 || !a.valid ||
      (a.dev_pos && (!a.dev_slot || a.valid_ld < 1)))
    return absl::InvalidArgumentError("MaskedAttnDecode: bad shape or arguments");
  const dim3 grid(s.n_head, a.n_splits);
  auto partials = [&](auto kernel) {
    LaunchMaybeEarly(kernel, grid, kWarps * 32, 0, stream, a.early, a);
  };
  switch (s.hd) {
    case 32: partials(MaskedAttnPartialKernel<32>); break;
    case 64: partials(MaskedAttnPartialKernel<64>); break;
    case 128: partials(MaskedAttnPartialKernel<128>); break;
    case 256: partials(MaskedAttnPartialKernel<256>); break;
    default:
      return absl::UnimplementedError("MaskedAttnDecode: head_dim not in {32, 64, 128, 256}");
  }
  DS_RETURN_IF_ERROR(LastLaunchStatus("masked attention partials"));
  LaunchMaybeEarly(MaskedAttnCombineKernel, s.n_head, (s.hd + 31) / 32 * 32, 0, stream, a.early, a);
  return LastLaunchStatus("masked attention combine");
}

}  // namespace ds::cuda
