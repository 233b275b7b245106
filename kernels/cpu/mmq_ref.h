// CPU reference of the int8 matmuls on quantized weights (kernels/cuda/mmq.cuh, the tiled Q6_K
// column kernel, the dp4a GEMV): the activation quantizer they share and the dot product they
// compute, so that the GPU kernels are tested against what they are meant to compute (int8
// activations), not only against the f32 product with the int8 noise bound.
#pragma once
#include <cmath>
#include <cstdint>

namespace ds::cpu {

// int8 activations as QuantizeActivations (kernels/cuda/gemv.cu) makes them: per 32 elements
// d = amax / 127 (f32), q = round-half-to-even(x * (1 / d)) in f32, all-zero blocks d = 0, q = 0.
// n % 32 == 0; xq: [n], xd: [n / 32].
void QuantizeActivationsQ8(const float* x, int64_t n, int8_t* xq, float* xd);

// One Q6_K row (n / 256 raw GGUF blocks) times one int8 column, exactly:
//   sum over 32-blocks b of xd[b] * sum over its two 16-element sub-blocks s of
//   (d * sc_s) * sum_k (q_k - 32) * xq_k,
// integer sums exact, the rest in double. `abs_sum` (optional) gets the same sum of |terms|,
// the scale for tolerances.
double MmqDotQ6K(const void* row, const int8_t* xq, const float* xd, int64_t n, double* abs_sum = nullptr);

// The same dot product in the f32 operation order of the tiled kernels (TiledKernel and
// MmqTiledKernel): unit u goes to stream u % 4; per unit and 32-block,
// part = (d * sc_{2m}) * S_{2m}, part = fma(d * sc_{2m+1}, S_{2m+1}, part),
// acc = fma(xd, part, acc); the result ((0 + acc0) + acc1) + acc2) + acc3. A correct kernel
// matches it bit for bit.
float MmqDotQ6KKernelOrder(const void* row, const int8_t* xq, const float* xd, int64_t n);

// That f32 order for any 256-value unit format with 16-value sub-blocks (the tiled kernels and
// the coarse draft head's, draft_head_ref.h): scale(u, s) is sub-block s's f32 scale in unit u,
// sum(u, s) its exact integer sum of weights times xq.
template <class Scale, class Sum>
float TiledKernelOrderDot(int64_t n_units, const float* xd, Scale scale, Sum sum) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t u = 0; u < n_units; ++u) {
    float& a = acc[u % 4];
    for (int m = 0; m < 8; ++m) {
      float part = scale(u, 2 * m) * static_cast<float>(sum(u, 2 * m));
      part = std::fma(scale(u, 2 * m + 1), static_cast<float>(sum(u, 2 * m + 1)), part);
      a = std::fma(xd[8 * u + m], part, a);
    }
  }
  float v = 0.f;
  for (int w = 0; w < 4; ++w) v = v + acc[w];
  return v;
}

}  // namespace ds::cpu
