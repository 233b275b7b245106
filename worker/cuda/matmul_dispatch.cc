// CudaDevice (cuda_device.h): which kernel runs a matrix product. Up to gemv_max_rows rows
// (tiled Q6_K: tiled_max_rows) take the column kernels on int8 activations, more rows are
// dequantized to bf16 and go through cuBLAS; F32 weights always go through cuBLAS's SGEMM there.
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/norm.cuh"
#include "worker/cuda/cuda_device.h"

namespace ds::cuda {

absl::Status CudaDevice::EnsureQuantized(const float* x, int R, int K) {
  if (xq_src_ == x && xq_rows_ == R) return absl::OkStatus();
  DS_RETURN_IF_ERROR(QuantizeActivations(x, R, K, xq_, xd_, stream_));
  xq_src_ = x;
  xq_rows_ = R;
  return absl::OkStatus();
}
absl::Status CudaDevice::EnsureHalf(const float* x, int R, int K) {
  if (xh_src_ == x && xh_rows_ == R) return absl::OkStatus();
  DS_RETURN_IF_ERROR(ConvertF32ToHalf(x, static_cast<int64_t>(R) * K, xh_, bf16_, stream_));
  xh_src_ = x;
  xh_rows_ = R;
  return absl::OkStatus();
}

// The GEMV path for R <= gemv_max_rows rows: kGemvMaxCols activation columns per weight read.
// `w2` is the second matrix of a kSiluMul pair (same type and shape as w), else nullptr.
absl::Status CudaDevice::GemvColumns(const DMat& w, const DMat* w2, const float* x, int R,
                                      float* y, GemvEpilogue epilogue) {
  const bool qx = w.tiled || GemvWantsQuantizedX(w.type, w.cols);
  if (qx) DS_RETURN_IF_ERROR(EnsureQuantized(x, R, w.cols));
  const int max_cols = w.tiled ? kTiledMaxCols : kGemvMaxCols;
  for (int c0 = 0; c0 < R; c0 += max_cols) {
    GemvArgs a;
    a.type = w.type;
    a.w = w.d;
    if (w2) a.w2 = w2->d;
    a.M = w.rows;
    a.K = w.cols;
    a.nc = std::min(max_cols, R - c0);
    a.x = x + static_cast<int64_t>(c0) * w.cols;
    if (qx) {
      a.xq = xq_ + static_cast<int64_t>(c0) * w.cols;
      a.xd = xd_ + static_cast<int64_t>(c0) * (w.cols / 32);
    }
    a.y = y + static_cast<int64_t>(c0) * w.rows;
    a.epilogue = epilogue;
    DS_RETURN_IF_ERROR(w.tiled ? TiledGemvMulti(&a, 1, stream_) : Gemv(a, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::Linear(const DMat& w, const float* x, int R, float* y, bool accumulate) {
  if (ColumnPath(w, R))
    return GemvColumns(w, nullptr, x, R, y,
                       accumulate ? GemvEpilogue::kAccumulate : GemvEpilogue::kStore);
  if (w.type == GgmlType::F32)
    return gemm_->RunF32(static_cast<const float*>(w.d), x, y, w.rows, w.cols, R, w.rows,
                         accumulate ? 1.f : 0.f, stream_);
  DS_RETURN_IF_ERROR(EnsureHalf(x, R, w.cols));
  const uint64_t rb = GgmlRowBytes(w.type, w.cols);
  const int chunk = static_cast<int>(std::min<uint64_t>(w.rows, wh_elems_ / w.cols));
  for (int m0 = 0; m0 < w.rows; m0 += chunk) {
    const int mc = std::min(chunk, w.rows - m0);
    if (w.tiled)
      DS_RETURN_IF_ERROR(DequantizeTiledRows(w.type, w.d, m0, mc, w.cols, wh_, bf16_, stream_));
    else
      DS_RETURN_IF_ERROR(DequantizeRows(w.type, static_cast<const uint8_t*>(w.d) + m0 * rb, mc,
                                        w.cols, wh_, bf16_, stream_));
    DS_RETURN_IF_ERROR(gemm_->Run(wh_, xh_, y + m0, mc, w.cols, R, w.rows, bf16_,
                                  accumulate ? 1.f : 0.f, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::LinearMulti(std::initializer_list<std::pair<const DMat*, float*>> mats,
                                      const float* x, int R) {
  const DMat& m0 = *mats.begin()->first;
  bool same = ColumnPath(m0, R) &&
              static_cast<int>(mats.size()) <= kGemvMaxSegs;
  for (auto& [m, y] : mats)
    same = same && m->type == m0.type && m->cols == m0.cols && m->tiled == m0.tiled;
  if (!same) {
    for (auto& [m, y] : mats) DS_RETURN_IF_ERROR(Linear(*m, x, R, y, false));
    return absl::OkStatus();
  }
  const bool qx = m0.tiled || GemvWantsQuantizedX(m0.type, m0.cols);
  if (qx) DS_RETURN_IF_ERROR(EnsureQuantized(x, R, m0.cols));
  const int max_cols = m0.tiled ? kTiledMaxCols : kGemvMaxCols;
  for (int c0 = 0; c0 < R; c0 += max_cols) {
    GemvArgs segs[kGemvMaxSegs];
    int n = 0;
    for (auto& [m, y] : mats) {
      GemvArgs& a = segs[n++];
      a.type = m->type;
      a.w = m->d;
      a.M = m->rows;
      a.K = m->cols;
      a.nc = std::min(max_cols, R - c0);
      a.x = x + static_cast<int64_t>(c0) * m->cols;
      if (qx) {
        a.xq = xq_ + static_cast<int64_t>(c0) * m->cols;
        a.xd = xd_ + static_cast<int64_t>(c0) * (m->cols / 32);
      }
      a.y = y + static_cast<int64_t>(c0) * m->rows;
      a.epilogue = GemvEpilogue::kStore;
    }
    DS_RETURN_IF_ERROR(m0.tiled ? TiledGemvMulti(segs, n, stream_) : GemvMulti(segs, n, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::NormToA(const float* w, int R) {
  const int H = cfg_.n_embd;
  InvalidateX();
  if (R <= QuantRows() && H % 32 == 0) {
    DS_RETURN_IF_ERROR(RmsNormQuantize(h_, w, a_, xq_, xd_, R, H, cfg_.rms_eps, stream_));
    xq_src_ = a_;
    xq_rows_ = R;
    return absl::OkStatus();
  }
  return RmsNormRows(h_, H, nullptr, w, a_, R, H, cfg_.rms_eps, stream_);
}

absl::Status CudaDevice::LinearSiluPair(const DMat& g, const DMat& u, const float* x, int R,
                                         float* y) {
  if (g.type == u.type && g.tiled == u.tiled && ColumnPath(g, R))
    return GemvColumns(g, &u, x, R, y, GemvEpilogue::kSiluMul);
  DS_RETURN_IF_ERROR(Linear(g, x, R, y, false));
  DS_RETURN_IF_ERROR(Linear(u, x, R, ffb_, false));
  return SiluMul(y, ffb_, y, static_cast<int64_t>(R) * g.rows, stream_);
}

}  // namespace ds::cuda
