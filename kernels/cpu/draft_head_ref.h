// CPU reference of the coarse draft head (kernels/cuda/draft_head.cuh): the values its copy of
// a Q6_K matrix stands for and the one-column product the kernel computes, exactly and in the
// kernel's f32 order.
#pragma once
#include <cstdint>

namespace ds::cpu {

// The coarse values of one Q6_K row (n / 256 raw GGUF blocks): d * sc * (4 (q >> 2) + 1.5 - 32)
// for the unsigned quant q (0..63): each value moved to the middle of its 4-value bucket.
void CoarseQ6KRow(const void* row, int64_t n, float* out);

// One Q6_K row's coarse values times one int8 column (xq [n], xd [n / 32]), exactly (double).
// `abs_sum` (optional) gets the sum of |terms|.
double CoarseDotQ6K(const void* row, const int8_t* xq, const float* xd, int64_t n,
                    double* abs_sum = nullptr);

// The same product in the kernel's f32 operation order (MmqDotQ6KKernelOrder's, mmq_ref.h, with
// the doubled bracket 8 (q >> 2) - 61 as the integer operand and d halved): a correct kernel
// matches it bit for bit.
float CoarseDotQ6KKernelOrder(const void* row, const int8_t* xq, const float* xd, int64_t n);

}  // namespace ds::cpu
