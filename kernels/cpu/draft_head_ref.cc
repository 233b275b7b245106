// CPU reference of the coarse draft head (draft_head_ref.h).
#include "kernels/cpu/draft_head_ref.h"

#include <cmath>

#include "common/util/half.h"
#include "kernels/cpu/draft_head_fit.h"
#include "kernels/cpu/mmq_ref.h"
#include "kernels/cpu/quant_blocks.h"

namespace ds::cpu {
namespace {

int32_t SubBlockSum(const CoarseUnit& c, const int8_t* xq, int s) {
  int32_t sum = 0;
  for (int k = 16 * s; k < 16 * s + 16; ++k) sum += c.code[k] * static_cast<int32_t>(xq[k]);
  return sum;
}

}  // namespace

CoarseUnit CoarseFitQ6KBlock(const void* block) {
  const auto& b = *static_cast<const BlockQ6K*>(block);
  const float d6 = F16ToF32(b.d);
  CoarseUnit c;
  for (int s = 0; s < 16; ++s) {
    const float dsc = d6 * static_cast<float>(b.scales[s]);
    float w[16];
    for (int i = 0; i < 16; ++i) w[i] = dsc * static_cast<float>(Q6KCentred(b, 16 * s + i));
    c.scale[s] = draft_head::SubBlockScale(w);
    for (int i = 0; i < 16; ++i) c.code[16 * s + i] = draft_head::Nibble(w[i], c.scale[s]) - 8;
  }
  return c;
}

void CoarseQ6KRow(const void* row, int64_t n, float* out) {
  const auto* blocks = static_cast<const BlockQ6K*>(row);
  for (int64_t u = 0; u < n / 256; ++u) {
    const CoarseUnit c = CoarseFitQ6KBlock(blocks + u);
    for (int e = 0; e < 256; ++e)
      out[256 * u + e] = Bf16ToF32(c.scale[e / 16]) * static_cast<float>(c.code[e]);
  }
}

double CoarseDotQ6K(const void* row, const int8_t* xq, const float* xd, int64_t n,
                    double* abs_sum) {
  const auto* blocks = static_cast<const BlockQ6K*>(row);
  double sum = 0, abs = 0;
  for (int64_t u = 0; u < n / 256; ++u) {
    const CoarseUnit c = CoarseFitQ6KBlock(blocks + u);
    for (int s = 0; s < 16; ++s) {
      const double scale =
          static_cast<double>(xd[8 * u + s / 2]) * Bf16ToF32(c.scale[s]);
      sum += scale * SubBlockSum(c, xq + 256 * u, s);
      for (int k = 16 * s; k < 16 * s + 16; ++k)
        abs += std::fabs(scale * c.code[k] * xq[256 * u + k]);
    }
  }
  if (abs_sum) *abs_sum = abs;
  return sum;
}

float CoarseDotQ6KKernelOrder(const void* row, const int8_t* xq, const float* xd, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6K*>(row);
  CoarseUnit c;
  int64_t fitted = -1;  // the unit c holds
  auto unit = [&](int64_t u) -> const CoarseUnit& {
    if (u != fitted) c = CoarseFitQ6KBlock(blocks + (fitted = u));
    return c;
  };
  return TiledKernelOrderDot(
      n / 256, xd, [&](int64_t u, int s) { return Bf16ToF32(unit(u).scale[s]); },
      [&](int64_t u, int s) { return SubBlockSum(unit(u), xq + 256 * u, s); });
}

}  // namespace ds::cpu
