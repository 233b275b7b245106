// Embedding lookup (see embed.cuh): one warp per 256-element unit of a looked-up row.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace ds::cuda {
namespace {

// ids[t], or where it points below zero (EmbedRows' chain_ids).
__device__ __forceinline__ int64_t TokenId(const int32_t* ids, int t, const int32_t* chain_ids) {
  const int32_t id = ids[t];
  return id < 0 && chain_ids != nullptr ? chain_ids[-id - 1] : id;
}

template <GgmlType T>
__global__ void EmbedUnitKernel(const uint8_t* __restrict__ table, int n_embd,
                                const int32_t* __restrict__ ids, int n_tok, float* __restrict__ out,
                                int64_t v0, int64_t v1, const int32_t* __restrict__ chain_ids) {
  const int units = n_embd / kUnitElems;
  const int64_t gw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (gw >= static_cast<int64_t>(n_tok) * units) return;
  const int t = static_cast<int>(gw / units), u = static_cast<int>(gw % units);
  const int lane = threadIdx.x & 31;
  float4* o = reinterpret_cast<float4*>(out + static_cast<int64_t>(t) * n_embd + u * 256 + lane * 8);
  const int64_t id = TokenId(ids, t, chain_ids);
  if (id < v0 || id >= v1) {  // another rank's vocabulary shard holds this row
    o[0] = o[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    return;
  }
  const uint8_t* row = table + (id - v0) * static_cast<int64_t>(GgmlRowBytes(T, n_embd));
  float v[8];
  DecodeLane8<T>(row + u * UnitBytes(T), lane, v);
  o[0] = make_float4(v[0], v[1], v[2], v[3]);
  o[1] = make_float4(v[4], v[5], v[6], v[7]);
}

template <GgmlType T>
__global__ void EmbedElemKernel(const uint8_t* __restrict__ table, int n_embd,
                                const int32_t* __restrict__ ids, int n_tok, float* __restrict__ out,
                                int64_t v0, int64_t v1, const int32_t* __restrict__ chain_ids) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(n_tok) * n_embd) return;
  const int t = static_cast<int>(i / n_embd);
  const int64_t id = TokenId(ids, t, chain_ids);
  if (id < v0 || id >= v1) {
    out[i] = 0.f;
    return;
  }
  const uint8_t* row = table + (id - v0) * static_cast<int64_t>(GgmlRowBytes(T, n_embd));
  out[i] = DecodeElem<T>(row, i % n_embd);
}

}  // namespace

absl::Status EmbedRows(GgmlType type, const void* table, int n_embd, const int32_t* ids, int T,
                       float* out, cudaStream_t stream, int64_t v0, int64_t v1,
                       const int32_t* chain_ids) {
  if (v1 < 0) {
    v0 = 0;
    v1 = INT64_MAX;
  }
  if (UnitBytes(type) == 0)
    return absl::UnimplementedError(
        absl::StrCat("EmbedRows: type ", std::string(GgmlInfo(type).name), " not supported"));
  if (T == 0) return absl::OkStatus();
  const auto* tab = static_cast<const uint8_t*>(table);
  DispatchType(type, [&](auto tag) {
    constexpr GgmlType Ty = decltype(tag)::value;
    if (n_embd % kUnitElems == 0) {
      const int64_t warps = static_cast<int64_t>(T) * (n_embd / kUnitElems);
      EmbedUnitKernel<Ty><<<CeilDiv(warps * 32, 256), 256, 0, stream>>>(tab, n_embd, ids, T, out,
                                                                        v0, v1, chain_ids);
    } else {
      EmbedElemKernel<Ty><<<CeilDiv(static_cast<int64_t>(T) * n_embd, 256), 256, 0, stream>>>(
          tab, n_embd, ids, T, out, v0, v1, chain_ids);
    }
  });
  return LastLaunchStatus("EmbedRows");
}

}  // namespace ds::cuda
