// Weight helpers of the GPU kernel tests (kernels_cuda_test, tiled_cuda_test): random raw GGUF
// blocks, their CPU dequantization, the tiled Q6_K copy made as the backend's chunked upload
// makes it, and whether this GPU runs the tiled kernels.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/gemv_tiled.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace ds::cuda {

// Random raw blocks: every quant bit pattern appears; the fp16 scale fields are set to sane
// values so the dequantized weights are in a realistic range (|w| ~ 1e-2..1).
inline std::vector<uint8_t> RandomWeights(std::mt19937& rng, GgmlType t, int64_t rows, int64_t K) {
  const auto& info = GgmlInfo(t);
  const int64_t nblk = rows * (K / info.block_elems);
  std::vector<uint8_t> w(nblk * info.block_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(2e-4f, 4e-3f), val(-1.f, 1.f);
  auto put16 = [&](uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); };
  for (int64_t b = 0; b < nblk; ++b) {
    uint8_t* p = w.data() + b * info.block_bytes;
    switch (t) {
      case GgmlType::F32: { const float f = val(rng); std::memcpy(p, &f, 4); break; }
      case GgmlType::F16: put16(p, F32ToF16(val(rng))); break;
      case GgmlType::BF16: put16(p, F32ToBf16(val(rng))); break;
      default:
        for (int i = 0; i < info.block_bytes; ++i) p[i] = static_cast<uint8_t>(byte(rng));
        if (t == GgmlType::Q6_K) put16(p + 208, F32ToF16(sc(rng)));
        else if (t == GgmlType::Q8_0 || t == GgmlType::IQ4_NL || t == GgmlType::IQ4_XS) put16(p, F32ToF16(sc(rng) * 2));
        else {  // Q4_K / Q5_K: d and dmin
          put16(p, F32ToF16(sc(rng)));
          put16(p + 2, F32ToF16(sc(rng)));
        }
    }
  }
  return w;
}

inline std::vector<float> DequantAll(GgmlType t, const std::vector<uint8_t>& w, int64_t rows, int64_t K) {
  std::vector<float> out(rows * K);
  const uint64_t rb = GgmlRowBytes(t, K);
  for (int64_t r = 0; r < rows; ++r) cpu::DequantizeRow(t, w.data() + r * rb, out.data() + r * K, K);
  return out;
}

// Tiled copy of raw rows already on the device, made in two TileRows calls (rows [0, 32) and the
// rest) like the backend's chunked upload.
inline Dev<uint8_t> TileOnDevice(GgmlType t, const Dev<uint8_t>& raw, int M, int K) {
  Dev<uint8_t> tiled(TiledBytes(t, M, K));
  const int first = std::min(M, 32);
  const uint64_t rb = GgmlRowBytes(t, K);
  EXPECT_TRUE(TileRows(t, raw.p, 0, first, K, tiled.p, nullptr).ok());
  if (M > first) {
    EXPECT_TRUE(TileRows(t, raw.p + first * rb, first, M - first, K, tiled.p, nullptr).ok());
  }
  return tiled;
}

inline bool HaveTiled() {
  int dev = 0;
  cudaGetDevice(&dev);
  return TiledAvailable(dev);
}

}  // namespace ds::cuda
