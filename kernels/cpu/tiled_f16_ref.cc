// CPU reference of the f16 tensor-core matmul on tiled Q6_K (tiled_f16_ref.h).
#include "kernels/cpu/tiled_f16_ref.h"

#include <algorithm>
#include <cmath>

#include "common/util/half.h"
#include "kernels/cpu/quant_blocks.h"

namespace ds::cpu {

void HalfActivationsRow(const float* x, int64_t n, uint16_t* xh, float* xs) {
  float m = 0.f;
  for (int64_t k = 0; k < n; ++k) m = std::fmax(m, std::fabs(x[k]));
  int ex = 14;
  if (m > 0.f && std::isfinite(m)) std::frexp(m, &ex);
  ex = std::max(ex, -100);  // 2^(14 - ex) stays a finite float
  const float scale = std::ldexp(1.f, 14 - ex);
  for (int64_t k = 0; k < n; ++k) xh[k] = F32ToF16(x[k] * scale);
  *xs = std::ldexp(1.f, ex - 14);
}

double TiledF16DotQ6K(const void* row, const uint16_t* xh, int64_t n, double* abs_sum) {
  const auto* blocks = static_cast<const BlockQ6K*>(row);
  double sum = 0, abs = 0;
  for (int64_t u = 0; u < n / 256; ++u) {
    const BlockQ6K& b = blocks[u];
    const double d = F16ToF32(b.d);
    double unit = 0, unit_abs = 0;
    for (int k = 0; k < 256; ++k) {
      // (q - 32) * sc is an integer of at most 13 bits; the kernel rounds it to f16 once.
      const float a = F16ToF32(F32ToF16(static_cast<float>(Q6KCentred(b, k) * b.scales[k / 16])));
      const double t = static_cast<double>(a) * F16ToF32(xh[256 * u + k]);
      unit += t;
      unit_abs += std::fabs(t);
    }
    sum += d * unit;
    abs += std::fabs(d) * unit_abs;
  }
  if (abs_sum) *abs_sum = abs;
  return sum;
}

}  // namespace ds::cpu
