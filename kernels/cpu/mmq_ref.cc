// CPU reference of the int8-activation matmuls (mmq_ref.h).
#include "kernels/cpu/mmq_ref.h"

#include <cmath>

#include "common/util/half.h"
#include "kernels/cpu/quant_blocks.h"

namespace ds::cpu {
namespace {

// Exact integer sum of one 16-element sub-block s of unit u times the int8 activations.
int32_t SubBlockSum(const BlockQ6K& b, const int8_t* xq, int s) {
  int32_t sum = 0;
  for (int k = 16 * s; k < 16 * s + 16; ++k) sum += Q6KCentred(b, k) * static_cast<int32_t>(xq[k]);
  return sum;
}

}  // namespace

void QuantizeActivationsQ8(const float* x, int64_t n, int8_t* xq, float* xd) {
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[32 * b + i]));
    const float d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    for (int i = 0; i < 32; ++i) {
      const float v = x[32 * b + i] * id;
      xq[32 * b + i] = static_cast<int8_t>(std::nearbyint(v));  // default rounding: half to even
    }
    xd[b] = d;
  }
}

double MmqDotQ6K(const void* row, const int8_t* xq, const float* xd, int64_t n, double* abs_sum) {
  const auto* blocks = static_cast<const BlockQ6K*>(row);
  double sum = 0, abs = 0;
  for (int64_t u = 0; u < n / 256; ++u) {
    const BlockQ6K& b = blocks[u];
    const double d = F16ToF32(b.d);
    for (int s = 0; s < 16; ++s) {
      const double t = static_cast<double>(xd[8 * u + s / 2]) * d * b.scales[s] *
                       SubBlockSum(b, xq + 256 * u, s);
      sum += t;
      for (int k = 16 * s; k < 16 * s + 16; ++k)
        abs += std::fabs(static_cast<double>(xd[8 * u + s / 2]) * d * b.scales[s] * Q6KCentred(b, k) *
                         xq[256 * u + k]);
    }
  }
  if (abs_sum) *abs_sum = abs;
  return sum;
}

float MmqDotQ6KKernelOrder(const void* row, const int8_t* xq, const float* xd, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6K*>(row);
  auto scale = [&](int64_t u, int s) {
    return F16ToF32(blocks[u].d) * static_cast<float>(blocks[u].scales[s]);
  };
  auto sum = [&](int64_t u, int s) { return SubBlockSum(blocks[u], xq + 256 * u, s); };
  return TiledKernelOrderDot(n / 256, xd, scale, sum);
}

}  // namespace ds::cpu
