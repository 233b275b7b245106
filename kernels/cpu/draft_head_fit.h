// How the coarse draft head (kernels/cuda/draft_head.cuh) codes a Q6_K matrix: one definition for
// the CUDA copy kernel and the CPU reference (kernels/cpu/draft_head_ref.h), so that both make
// the same codes and scales bit for bit. Every float operation is spelled out (fmaf, no
// expression the compilers could contract differently).
#pragma once
#include <cmath>
#include <cstdint>

#include "common/util/half.h"

#if defined(__CUDACC__)
#define DS_FIT_FN __host__ __device__ inline
#else
#define DS_FIT_FN inline
#endif

namespace ds::draft_head {

// Scale candidates per sub-block (24 or 32 measured the same acceptance on the demo model).
constexpr int kScaleCandidates = 16;

// The code (-8..7) of value w under scale s (> 0).
DS_FIT_FN float Code(float w, float s) { return fminf(fmaxf(rintf(w / s), -8.f), 7.f); }

// The bf16 scale of one 16-value sub-block for 4-bit codes c = Code(w, s): of the candidates
// bf16(amax / (6.5 + 0.125 i)), i = 0..15, the one with the least squared error (the first on a
// tie); 0 for an all-zero sub-block.
DS_FIT_FN uint16_t SubBlockScale(const float* w) {
  float amax = 0.f;
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(w[i]));
  if (amax == 0.f) return 0;
  float best_err = INFINITY;
  uint16_t best = 0;
  for (int c = 0; c < kScaleCandidates; ++c) {
    const uint16_t b = F32ToBf16(amax / (6.5f + 0.125f * static_cast<float>(c)));  // exact divisor
    const float s = Bf16ToF32(b);
    if (!(s > 0.f)) continue;
    float err = 0.f;
    for (int i = 0; i < 16; ++i) {
      const float e = fmaf(-Code(w[i], s), s, w[i]);
      err = fmaf(e, e, err);
    }
    if (err < best_err) {
      best_err = err;
      best = b;
    }
  }
  return best;
}

// The stored nibble (code + 8, 0..15) of value w under the sub-block's bf16 scale.
DS_FIT_FN int Nibble(float w, uint16_t scale) {
  const float s = Bf16ToF32(scale);
  return s > 0.f ? static_cast<int>(Code(w, s)) + 8 : 8;
}

}  // namespace ds::draft_head
