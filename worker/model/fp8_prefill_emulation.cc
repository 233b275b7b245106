// The CPU twin of FP8 prefill (fp8_prefill_emulation.h).
#include "worker/model/fp8_prefill_emulation.h"

#include "common/util/half.h"
#include "kernels/cpu/fp8_ref.h"

namespace ds {

bool Fp8PrefillEmulation::Applies(const cpu::WeightView& w, int64_t N) const {
  const bool rows = N > kColumnRows || (decode_rows_ > 0 && N >= decode_rows_);
  return rows && w.type != GgmlType::F32 && w.rows % cpu::kFp8Block == 0 &&
         w.cols % cpu::kFp8Block == 0;
}

void Fp8PrefillEmulation::MatMul(const cpu::WeightView& w, const float* x, int64_t N, float* y,
                                 ThreadPool* pool) {
  const int K = static_cast<int>(w.cols);
  const int64_t M = w.rows;
  std::vector<float>& wf = weights_[w.data];
  if (wf.empty()) {
    // The dequantized rows rounded to bf16 (the CUDA dense copy's values), then e4m3.
    std::vector<float> rows(static_cast<size_t>(M) * K);
    for (int64_t r = 0; r < M; ++r) {
      cpu::GetRow(w, r, rows.data() + r * K);
      for (int k = 0; k < K; ++k) rows[r * K + k] = Bf16ToF32(F32ToBf16(rows[r * K + k]));
    }
    std::vector<uint8_t> q(rows.size());
    std::vector<float> s(cpu::Fp8BlockScaleLd(K) * (M / cpu::kFp8Block));
    cpu::QuantizeBlocksFp8(rows.data(), M, K, q.data(), s.data());
    wf.resize(rows.size());
    for (int64_t r = 0; r < M; ++r)
      for (int k = 0; k < K; ++k)
        wf[r * K + k] = cpu::E4M3ToF32(q[r * K + k]) *
                        s[(r / cpu::kFp8Block) * cpu::Fp8BlockScaleLd(K) + k / cpu::kFp8Block];
  }
  std::vector<uint8_t> xq(static_cast<size_t>(N) * K);
  std::vector<float> xs(static_cast<size_t>(K / cpu::kFp8Block) * N), xf(xq.size());
  cpu::QuantizeTokensFp8(x, N, K, xq.data(), xs.data(), N);
  for (int64_t t = 0; t < N; ++t)
    for (int k = 0; k < K; ++k)
      xf[t * K + k] = cpu::E4M3ToF32(xq[t * K + k]) * xs[(k / cpu::kFp8Block) * N + t];
  cpu::MatMul(cpu::WeightView{GgmlType::F32, wf.data(), K, M}, xf.data(), N, y, pool);
}

}  // namespace ds
