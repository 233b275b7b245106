// The CPU twin of FP8 prefill (CudaBackendOptions::prefill_fp8, kernels/cuda/gemm_fp8.cuh; issue
// #22): products of prefill pieces with a layer matrix of whole 128 x 128 blocks computed on the
// values the CUDA path multiplies, the weights rounded to bf16 (its dense copy's source) and then
// to e4m3 with one scale per 128 x 128 block, the activations to e4m3 with one scale per token
// and 128-element block (kernels/cpu/fp8_ref.h). The sums are f32 (cpu::MatMul) where the GPU's
// tensor cores sum a block's products in a narrower accumulator, so the two agree to the
// rounding of the sums, not bit for bit. Used by the CPU backend for BackendOptions::prefill_fp8
// (`deltaserve perplexity --backend cpu --prefill-fp8 on`): the precision question answered on
// any machine.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "kernels/cpu/ops.h"

namespace ds {

class ThreadPool;

class Fp8PrefillEmulation {
 public:
  // Steps of more rows than this take the emulated product: the CUDA path multiplies the dense
  // copies only past its column kernels (tiled_max_rows, 64 by default).
  static constexpr int64_t kColumnRows = 64;

  // decode_rows: BackendOptions::fp8_decode_rows (0 = never): products of at least that many rows
  // take FP8 too, as the CUDA path's decode steps of that many sequences do. The CPU backend
  // multiplies a step's rows together, so a step that mixes a few decode rows with a prefill
  // piece counts as one product here (the CUDA path cuts it by kind of row).
  explicit Fp8PrefillEmulation(int decode_rows) : decode_rows_(decode_rows) {}

  // Whether a product of N rows with w goes through FP8 on the CUDA path.
  bool Applies(const cpu::WeightView& w, int64_t N) const;

  // y[N, w.rows] = e4m3(x) · e4m3(bf16(W))ᵀ with their block scales. The weights' e4m3 values are
  // made once per matrix (by its data pointer) and kept as f32.
  void MatMul(const cpu::WeightView& w, const float* x, int64_t N, float* y, ThreadPool* pool);

 private:
  int decode_rows_ = 0;
  std::map<const void*, std::vector<float>> weights_;
};

}  // namespace ds
