// CPU reference of the coarse draft head (draft_head_ref.h).
#include "kernels/cpu/draft_head_ref.h"

#include <cmath>

#include "common/util/half.h"
#include "kernels/cpu/quant_blocks.h"

namespace ds::cpu {
namespace {

// Twice the coarse bracket of element e: 2 (4h + 1.5 - 32) = 8h - 61, h = q >> 2.
int Bracket2(const BlockQ6K& b, int e) { return 8 * ((Q6KCentred(b, e) + 32) >> 2) - 61; }

int32_t SubBlockSum(const BlockQ6K& b, const int8_t* xq, int s) {
  int32_t sum = 0;
  for (int k = 16 * s; k < 16 * s + 16; ++k) sum += Bracket2(b, k) * static_cast<int32_t>(xq[k]);
  return sum;
}

}  // namespace

void CoarseQ6KRow(const void* row, int64_t n, float* out) {
  const auto* blocks = static_cast<const BlockQ6K*>(row);
  for (int64_t u = 0; u < n / 256; ++u) {
    const BlockQ6K& b = blocks[u];
    const float d = F16ToF32(b.d);
    for (int e = 0; e < 256; ++e)
      out[256 * u + e] = d * static_cast<float>(b.scales[e / 16]) * 0.5f * static_cast<float>(Bracket2(b, e));
  }
}

double CoarseDotQ6K(const void* row, const int8_t* xq, const float* xd, int64_t n, double* abs_sum) {
  const auto* blocks = static_cast<const BlockQ6K*>(row);
  double sum = 0, abs = 0;
  for (int64_t u = 0; u < n / 256; ++u) {
    const BlockQ6K& b = blocks[u];
    const double d = 0.5 * F16ToF32(b.d);
    for (int s = 0; s < 16; ++s) {
      const double scale = static_cast<double>(xd[8 * u + s / 2]) * d * b.scales[s];
      sum += scale * SubBlockSum(b, xq + 256 * u, s);
      for (int k = 16 * s; k < 16 * s + 16; ++k) abs += std::fabs(scale * Bracket2(b, k) * xq[256 * u + k]);
    }
  }
  if (abs_sum) *abs_sum = abs;
  return sum;
}

float CoarseDotQ6KKernelOrder(const void* row, const int8_t* xq, const float* xd, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6K*>(row);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t u = 0; u < n / 256; ++u) {
    const BlockQ6K& b = blocks[u];
    const float dg = F16ToF32(b.d) * 0.5f;
    float& a = acc[u % 4];
    for (int m = 0; m < 8; ++m) {
      const float s0 = dg * static_cast<float>(b.scales[2 * m]);
      const float s1 = dg * static_cast<float>(b.scales[2 * m + 1]);
      float part = s0 * static_cast<float>(SubBlockSum(b, xq + 256 * u, 2 * m));
      part = std::fma(s1, static_cast<float>(SubBlockSum(b, xq + 256 * u, 2 * m + 1)), part);
      a = std::fma(xd[8 * u + m], part, a);
    }
  }
  float v = 0.f;
  for (int w = 0; w < 4; ++w) v = v + acc[w];
  return v;
}

}  // namespace ds::cpu
