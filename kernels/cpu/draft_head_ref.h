// CPU reference of the coarse draft head (kernels/cuda/draft_head.cuh): the 4-bit codes and
// scales its copy of a Q6_K matrix holds (kernels/cpu/draft_head_fit.h), the values they stand
// for and the one-column product the kernel computes, exactly and in the kernel's f32 order.
#pragma once
#include <cstdint>

namespace ds::cpu {

// One 256-value unit of the copy: the sub-block scales (bf16 bits) and the codes -8..7.
struct CoarseUnit {
  uint16_t scale[16] = {};
  int code[256] = {};
};

// The copy's unit of one raw GGUF Q6_K block (the values (d * sc) * (q - 32), fitted).
CoarseUnit CoarseFitQ6KBlock(const void* block);

// The coarse values of one Q6_K row (n / 256 raw blocks): scale * code.
void CoarseQ6KRow(const void* row, int64_t n, float* out);

// One Q6_K row's coarse values times one int8 column (xq [n], xd [n / 32]), exactly (double).
// `abs_sum` (optional) gets the sum of |terms|.
double CoarseDotQ6K(const void* row, const int8_t* xq, const float* xd, int64_t n,
                    double* abs_sum = nullptr);

// The same product in the kernel's f32 operation order (MmqDotQ6KKernelOrder's, mmq_ref.h, with
// the codes as the integer operand and the bf16 scale as the sub-block scale): a correct kernel
// matches it bit for bit.
float CoarseDotQ6KKernelOrder(const void* row, const int8_t* xq, const float* xd, int64_t n);

}  // namespace ds::cpu
