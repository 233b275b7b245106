// tiled_gemv_bench: the decode matmuls of the 27B (tiled Q6_K) in the order a decode step runs
// them, captured as one CUDA graph, per column count. Per layer (64, each with its
// own weights, ~20 GB in all, like the model's 21 GB): quantize -> qkv+z (16384 x 5120) ->
// quantize -> ssm_out (5120 x 6144, accumulate) -> quantize -> gate+up pair (2 x 17408 x 5120,
// silu*mul) -> quantize -> down (5120 x 17408, accumulate). Prints ms per step and the weight
// bandwidth, then each matrix alone (its 64 launches back to back). Kernel experiments are judged
// by this bench first (kernels/cuda/README.md "Negative results" lists what it turned down).
// --sums 0,1: without / with the activations' 16-element sums (GemvArgs::xsum: the column
// kernel's unsigned decode) for ssm_out and ffn_down, as the worker gives them; one row each.
// --row-scan 1: then ffn_down's shape (K = 17,408) with its first M rows only, M from one tile per
// SM of an H200 (132 tiles) to all 320: whether the time follows the tiles per SM of the busiest
// SM (a block per tile, all resident at once) rather than the bytes.
// --stage 0,1: the activations read from L2 per unit / staged in shared memory per block
// (GemvArgs::stage_activations, the default); a column of its own.
// Usage: tiled_gemv_bench [--layers N] [--cols 1,4] [--reps R] [--sums 0,1] [--stage 0,1] [--row-scan 0|1]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_tiled.cuh"

namespace ds::cuda {
namespace {

struct Mat {
  const char* name;
  int M, K;
  GemvEpilogue ep;
};
// The GEMVs of one GDN layer of the 27B (its attention layers' are of the same sizes).
const Mat kMats[] = {{"qkv+z", 16384, 5120, GemvEpilogue::kStore},
                     {"ssm_out", 5120, 6144, GemvEpilogue::kAccumulate},
                     {"gate+up", 17408, 5120, GemvEpilogue::kSiluMul},
                     {"down", 5120, 17408, GemvEpilogue::kAccumulate}};
constexpr int kNumMats = 4;

// Random raw Q6_K rows with sane f16 scales (xorshift: ~300 MB of it).
std::vector<uint8_t> RandomQ6K(int64_t rows, int K, uint64_t seed) {
  const int64_t rb = GgmlRowBytes(GgmlType::Q6_K, K);
  std::vector<uint8_t> w(rows * rb);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= w.size(); i += 8) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    std::memcpy(&w[i], &s, 8);
  }
  for (size_t off = 208; off + 2 <= w.size(); off += 210) {
    const uint16_t d = 0x0C00 + static_cast<uint16_t>(w[off] & 0x3F);  // ~2.4e-4 .. 3.9e-4
    std::memcpy(&w[off], &d, 2);
  }
  return w;
}

int Main(int argc, char** argv) {
  int layers = 64, reps = 7;
  std::vector<int> cols = {1, 4}, sums_modes = {1}, stage_modes = {1};
  bool row_scan = false;
  auto int_list = [](const char* p) {
    std::vector<int> v;
    while (*p) {
      v.push_back(std::atoi(p));
      while (*p && *p != ',') ++p;
      if (*p == ',') ++p;
    }
    return v;
  };
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--layers")) layers = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--cols")) cols = int_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--sums")) sums_modes = int_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--stage")) stage_modes = int_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--row-scan")) row_scan = std::atoi(argv[i + 1]) != 0;
  }
  int dev = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  if (!TiledAvailable(dev)) {
    std::fprintf(stderr, "tiled_gemv_bench: needs sm_80+\n");
    return 1;
  }
  // Weights: one random tiled matrix per shape, copied into every layer's slot.
  uint64_t bytes_step = 0;
  std::vector<uint8_t*> w(kNumMats);  // [layers][copies] of each shape
  std::vector<uint64_t> tb(kNumMats);
  std::vector<int> per(kNumMats);
  for (int m = 0; m < kNumMats; ++m) {
    const Mat& mt = kMats[m];
    per[m] = mt.ep == GemvEpilogue::kSiluMul ? 2 : 1;
    tb[m] = TiledBytes(GgmlType::Q6_K, mt.M, mt.K);
    bytes_step += tb[m] * per[m] * layers;
    const auto raw = RandomQ6K(mt.M, mt.K, m + 1);
    uint8_t* draw = nullptr;
    DS_CUDA_CHECK(cudaMalloc(&draw, raw.size()));
    DS_CUDA_CHECK(cudaMemcpy(draw, raw.data(), raw.size(), cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(cudaMalloc(&w[m], tb[m] * per[m] * layers));
    auto st = TileRows(GgmlType::Q6_K, draw, 0, mt.M, mt.K, w[m], nullptr);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    for (int i = 1; i < per[m] * layers; ++i)
      DS_CUDA_CHECK(cudaMemcpy(w[m] + tb[m] * i, w[m], tb[m], cudaMemcpyDeviceToDevice));
    DS_CUDA_CHECK(cudaFree(draw));
  }
  const int maxc = *std::max_element(cols.begin(), cols.end());
  const int kmax = 17408;
  float *x = nullptr, *h = nullptr, *y = nullptr, *xd = nullptr;
  int8_t* xq = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&x, sizeof(float) * maxc * kmax));
  DS_CUDA_CHECK(cudaMalloc(&h, sizeof(float) * maxc * kmax));
  DS_CUDA_CHECK(cudaMalloc(&y, sizeof(float) * maxc * kmax));
  DS_CUDA_CHECK(cudaMalloc(&xq, maxc * kmax));
  DS_CUDA_CHECK(cudaMalloc(&xd, sizeof(float) * maxc * kmax / 32));
  int32_t* xsum = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&xsum, sizeof(int32_t) * maxc * kmax / 16));
  bool use_sums = false, use_stage = true;
  {
    std::vector<float> hx(static_cast<size_t>(maxc) * kmax);
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.f - 1.f;
    DS_CUDA_CHECK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(cudaMemcpy(y, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  }
  cudaStream_t s;
  DS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  DS_CUDA_CHECK(cudaEventCreate(&e0));
  DS_CUDA_CHECK(cudaEventCreate(&e1));

  // rows: the matrix's first rows only (0: all of them; the row scan below).
  auto gemv = [&](int m, int layer, int nc, const float* in, float* out, int rows = 0) {
    const Mat& mt = kMats[m];
    // As in the worker: only the activations EnsureQuantized makes (ssm_out's, ffn_down's) come
    // with their sums; qkv+z and the pair read the fused norm's.
    const bool sums_here = use_sums && (m == 1 || m == 3);
    (void)QuantizeActivations(in, nc, mt.K, xq, xd, s, sums_here ? xsum : nullptr);
    GemvArgs a;
    a.type = GgmlType::Q6_K;
    a.w = w[m] + tb[m] * per[m] * layer;
    a.w2 = per[m] == 2 ? w[m] + tb[m] * (per[m] * layer + 1) : nullptr;
    a.M = rows > 0 ? rows : mt.M;
    a.K = mt.K;
    a.nc = nc;
    a.xq = xq;
    a.xd = xd;
    if (sums_here) a.xsum = xsum;
    a.y = out;
    a.epilogue = mt.ep;
    a.stage_activations = use_stage;
    const auto st = TiledGemvMulti(&a, 1, s);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      std::exit(1);
    }
  };
  // ms per replay of `body` captured as one graph (median of reps after one warm-up).
  auto time_graph = [&](auto&& body) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    DS_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    body();
    DS_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    DS_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<float> ms;
    for (int r = 0; r < reps + 1; ++r) {
      DS_CUDA_CHECK(cudaEventRecord(e0, s));
      DS_CUDA_CHECK(cudaGraphLaunch(ge, s));
      DS_CUDA_CHECK(cudaEventRecord(e1, s));
      DS_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      DS_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (r > 0) ms.push_back(t);
    }
    DS_CUDA_CHECK(cudaGraphExecDestroy(ge));
    DS_CUDA_CHECK(cudaGraphDestroy(g));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };

  std::printf("tiled_gemv_bench: %d layers, %.2f GB of tiled Q6_K weights per step\n", layers,
              bytes_step / 1e9);
  std::printf("%4s %5s %3s %9s %8s", "sums", "stage", "nc", "step ms", "GB/s");
  for (const Mat& mt : kMats) std::printf(" %14s", mt.name);
  std::printf("   (each matrix alone: us per launch / GB/s)\n");
  for (int nc : cols) {
    for (int sums : sums_modes) {
      for (int stage : stage_modes) {
        use_stage = stage != 0;
        use_sums = sums != 0;
        const float step = time_graph([&] {
          for (int l = 0; l < layers; ++l) {
            gemv(0, l, nc, x, h);
            gemv(1, l, nc, h, y);
            gemv(2, l, nc, y, h);
            gemv(3, l, nc, h, y);
          }
        });
        std::printf("%4d %5d %3d %9.3f %8.0f", sums, stage, nc, step, bytes_step / (step * 1e6));
        for (int m = 0; m < kNumMats; ++m) {
          const float t = time_graph([&] {
            for (int l = 0; l < layers; ++l) gemv(m, l, nc, m == 3 ? h : x, m == 0 ? h : y);
          });
          const double us = t * 1e3 / layers;
          std::printf(" %6.1f/%7.0f", us, tb[m] * per[m] / (us * 1e3));
        }
        std::printf("\n");
      }
    }
  }
  if (row_scan) {
    const Mat& dn = kMats[3];
    std::printf("ffn_down rows (K = %d), %d columns: tiles, us per launch (with its quantizer), GB/s\n",
                dn.K, cols[0]);
    for (int tiles : {132, 165, 198, 231, 264, 297, 320}) {
      const int rows = std::min(tiles * kTiledRows, dn.M);
      const float t = time_graph([&] {
        for (int l = 0; l < layers; ++l) gemv(3, l, cols[0], h, y, rows);
      });
      const double us = t * 1e3 / layers;
      std::printf("%5d %8.1f %8.0f\n", tiles, us, TiledBytes(GgmlType::Q6_K, rows, dn.K) / (us * 1e3));
    }
  }
  return 0;
}

}  // namespace
}  // namespace ds::cuda

int main(int argc, char** argv) { return ds::cuda::Main(argc, argv); }
