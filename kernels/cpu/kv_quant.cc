// KV cache quantization reference (see kv_quant.h).
#include "kernels/cpu/kv_quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_blocks.h"

namespace ds::cpu {
namespace {

float Sanitize(float v) {
  if (std::isnan(v)) return 0.0f;
  return std::clamp(v, -FLT_MAX, FLT_MAX);
}

uint16_t F16Saturate(double v) {
  return F32ToF16(static_cast<float>(std::clamp(v, -65504.0, 65504.0)));
}

int RoundClamp(double v, int lo, int hi) {
  if (!(v >= lo)) return lo;
  if (v > hi) return hi;
  return static_cast<int>(std::nearbyint(v));
}

void QuantizeQ4_0(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    float x[kQK4_0];
    float amax = 0.f, m = 0.f;
    for (int j = 0; j < kQK4_0; ++j) {
      x[j] = Sanitize(src[i * kQK4_0 + j]);
      if (std::fabs(x[j]) > amax) {  // strict: the lowest index wins ties
        amax = std::fabs(x[j]);
        m = x[j];
      }
    }
    BlockQ4_0 b;
    b.d = F16Saturate(static_cast<double>(m) / -8.0);
    const double d = F16ToF32(b.d);
    const double id = d != 0 ? 1.0 / d : 0.0;
    uint8_t q[kQK4_0];
    for (int j = 0; j < kQK4_0; ++j) q[j] = static_cast<uint8_t>(RoundClamp(x[j] * id, -8, 7) + 8);
    for (int j = 0; j < kQK4_0 / 2; ++j) b.qs[j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
    StoreBlock(dst, i, b);
  }
}

}  // namespace

bool KvQuantSupported(GgmlType type) {
  return type == GgmlType::F16 || type == GgmlType::Q8_0 || type == GgmlType::Q4_0;
}

bool QuantizeKvRow(GgmlType type, const float* src, void* dst, int64_t n) {
  switch (type) {
    case GgmlType::F16: {  // not QuantizeRow: that saturates at 65504, the GPU store does not
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = F32ToF16(src[i]);
      return true;
    }
    case GgmlType::Q8_0:  // QuantizeRow's Q8_0 already follows the rules in kv_quant.h
      QuantizeRow(type, src, dst, n);
      return true;
    case GgmlType::Q4_0:
      QuantizeQ4_0(src, dst, n);
      return true;
    default:
      return false;
  }
}

bool DequantizeKvRow(GgmlType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::F16:
    case GgmlType::Q8_0:
      DequantizeRow(type, src, dst, n);
      return true;
    case GgmlType::Q4_0:
      for (int64_t i = 0; i < n / kQK4_0; ++i) {
        const BlockQ4_0 b = LoadBlock<BlockQ4_0>(src, i);
        const float d = F16ToF32(b.d);
        for (int j = 0; j < kQK4_0 / 2; ++j) {
          dst[i * kQK4_0 + j] = d * ((b.qs[j] & 0x0F) - 8);
          dst[i * kQK4_0 + j + 16] = d * ((b.qs[j] >> 4) - 8);
        }
      }
      return true;
    default:
      return false;
  }
}

}  // namespace ds::cpu
