// CudaDevice (cuda_device.h): which kernel runs a matrix product. Up to gemv_max_rows rows
// (tiled Q6_K: tiled_max_rows) take the column kernels on int8 activations, more rows are
// dequantized to bf16 and go through cuBLAS; F32 weights always go through cuBLAS's SGEMM there.
// A step's rows are cut into segments first (PlanRowSegments, CudaBackendOptions::
// batch_invariant): decode rows in column segments, each long prefill piece in a cuBLAS product
// of its own, so that no row's numbers depend on the other rows of the step.
#include <algorithm>

#include "absl/strings/str_cat.h"
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

void CudaDevice::PlanRowSegments(const MicroStep& step) {
  int dec_runs = 0;
  for (const RowRun& r : step.runs) dec_runs += r.decode_like() ? 1 : 0;
  for (int f = 0; f < 2; ++f) {
    const int cap = f == 1 ? tiled_max_rows_ : copts_.gemv_max_rows;
    std::vector<RowSegment>& out = plan_scratch_;
    out.clear();
    if (!copts_.batch_invariant) {
      out.push_back({0, rows_, rows_ <= cap});
    } else {
      // Decode rows keep the column kernels while the step has at most `cap` decode sequences
      // (a long decode_path run is cut into column pieces, which compute every row the same);
      // past that, throughput wins: they share one cuBLAS product and are no longer invariant.
      const bool dec_column = cap > 0 && dec_runs <= cap;
      bool shared_gemm = false;  // out.back() is the decode rows' shared cuBLAS segment
      for (const RowRun& r : step.runs) {
        const bool dec = r.decode_like();
        if (dec ? !dec_column : r.n > cap) {
          // A prefill piece's product is its own (its numbers depend on its rows only); the
          // decode rows of a crowded step share one.
          if (dec && shared_gemm && out.back().row0 + out.back().n == r.row0) {
            out.back().n += r.n;
          } else {
            out.push_back({r.row0, r.n, false});
          }
          shared_gemm = dec;
          continue;
        }
        shared_gemm = false;
        for (int i = 0; i < r.n;) {
          RowSegment* last = out.empty() ? nullptr : &out.back();
          if (last && last->column && last->row0 + last->n == r.row0 + i && last->n < cap) {
            const int take = std::min(cap - last->n, r.n - i);
            last->n += take;
            i += take;
          } else {
            const int take = std::min(cap, r.n - i);
            out.push_back({r.row0 + i, take, true});
            i += take;
          }
        }
      }
    }
    StepSegments& split = segs_[f];
    split.column.clear();
    split.gemm.clear();
    for (const RowSegment& g : out) (g.column ? split.column : split.gemm).push_back(g);
  }
}

absl::Status CudaDevice::GemmSegments(const DMat& w, const float* x,
                                      std::span<const RowSegment> segs, float* y,
                                      bool accumulate) {
  if (segs.empty()) return absl::OkStatus();
  const float beta = accumulate ? 1.f : 0.f;
  if (w.type == GgmlType::F32) {
    for (const RowSegment& g : segs)
      DS_RETURN_IF_ERROR(gemm_->RunF32(static_cast<const float*>(w.d),
                                       x + static_cast<int64_t>(g.row0) * w.cols,
                                       y + static_cast<int64_t>(g.row0) * w.rows, w.rows, w.cols,
                                       g.n, w.rows, beta, stream_));
    return absl::OkStatus();
  }
  const int end = segs.back().row0 + segs.back().n;
  DS_RETURN_IF_ERROR(EnsureHalf(x, end, w.cols));
  const uint64_t rb = GgmlRowBytes(w.type, w.cols);
  const int chunk = static_cast<int>(std::min<uint64_t>(w.rows, wh_elems_ / w.cols));
  for (int m0 = 0; m0 < w.rows; m0 += chunk) {
    const int mc = std::min(chunk, w.rows - m0);
    if (w.tiled)
      DS_RETURN_IF_ERROR(DequantizeTiledRows(w.type, w.d, m0, mc, w.cols, wh_, bf16_, stream_));
    else
      DS_RETURN_IF_ERROR(DequantizeRows(w.type, static_cast<const uint8_t*>(w.d) + m0 * rb, mc,
                                        w.cols, wh_, bf16_, stream_));
    for (const RowSegment& g : segs)
      DS_RETURN_IF_ERROR(gemm_->Run(wh_, xh_ + static_cast<int64_t>(g.row0) * w.cols,
                                    y + static_cast<int64_t>(g.row0) * w.rows + m0, mc, w.cols,
                                    g.n, w.rows, bf16_, beta, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::LinearRows(const DMat& w, const float* x, int R, float* y,
                                    bool accumulate) {
  if (ColumnPath(w, R))
    return GemvColumns(w, nullptr, x, R, y,
                       accumulate ? GemvEpilogue::kAccumulate : GemvEpilogue::kStore);
  const RowSegment all{0, R, false};
  return GemmSegments(w, x, std::span<const RowSegment>(&all, 1), y, accumulate);
}

absl::Status CudaDevice::Linear(const DMat& w, const float* x, int R, float* y, bool accumulate) {
  if (R != rows_)
    return absl::InternalError(absl::StrCat("Linear: ", R, " rows, the step has ", rows_));
  const StepSegments& segs = SegmentsFor(w);
  const GemvEpilogue ep = accumulate ? GemvEpilogue::kAccumulate : GemvEpilogue::kStore;
  for (const RowSegment& g : segs.column)
    DS_RETURN_IF_ERROR(GemvColumns(w, nullptr, x + static_cast<int64_t>(g.row0) * w.cols, g.n,
                                   y + static_cast<int64_t>(g.row0) * w.rows, ep));
  return GemmSegments(w, x, segs.gemm, y, accumulate);
}

absl::Status CudaDevice::LinearMulti(std::initializer_list<std::pair<const DMat*, float*>> mats,
                                      const float* x, int R) {
  const DMat& m0 = *mats.begin()->first;
  bool same = static_cast<int>(mats.size()) <= kGemvMaxSegs;
  for (auto& [m, y] : mats)
    same = same && m->type == m0.type && m->cols == m0.cols && m->tiled == m0.tiled;
  const StepSegments& segs = SegmentsFor(m0);
  if (!same || segs.column.size() != 1 || !segs.gemm.empty()) {
    for (auto& [m, y] : mats) DS_RETURN_IF_ERROR(Linear(*m, x, R, y, false));
    return absl::OkStatus();
  }
  // One column segment over the whole step (every decode step): one launch per column chunk
  // for all matrices.
  const bool qx = m0.tiled || GemvWantsQuantizedX(m0.type, m0.cols);
  if (qx) DS_RETURN_IF_ERROR(EnsureQuantized(x, R, m0.cols));
  const int max_cols = m0.tiled ? kTiledMaxCols : kGemvMaxCols;
  for (int c0 = 0; c0 < R; c0 += max_cols) {
    GemvArgs segs_args[kGemvMaxSegs];
    int n = 0;
    for (auto& [m, y] : mats) {
      GemvArgs& a = segs_args[n++];
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
    DS_RETURN_IF_ERROR(m0.tiled ? TiledGemvMulti(segs_args, n, stream_)
                                : GemvMulti(segs_args, n, stream_));
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
  if (R != rows_)
    return absl::InternalError(absl::StrCat("LinearSiluPair: ", R, " rows, the step has ", rows_));
  if (g.type != u.type || g.tiled != u.tiled) {
    DS_RETURN_IF_ERROR(Linear(g, x, R, y, false));
    DS_RETURN_IF_ERROR(Linear(u, x, R, ffb_, false));
    return SiluMul(y, ffb_, y, static_cast<int64_t>(R) * g.rows, stream_);
  }
  const StepSegments& segs = SegmentsFor(g);
  for (const RowSegment& s : segs.column)
    DS_RETURN_IF_ERROR(GemvColumns(g, &u, x + static_cast<int64_t>(s.row0) * g.cols, s.n,
                                   y + static_cast<int64_t>(s.row0) * g.rows,
                                   GemvEpilogue::kSiluMul));
  if (segs.gemm.empty()) return absl::OkStatus();
  DS_RETURN_IF_ERROR(GemmSegments(g, x, segs.gemm, y, false));
  DS_RETURN_IF_ERROR(GemmSegments(u, x, segs.gemm, ffb_, false));
  for (const RowSegment& s : segs.gemm) {
    const int64_t off = static_cast<int64_t>(s.row0) * g.rows;
    DS_RETURN_IF_ERROR(SiluMul(y + off, ffb_ + off, y + off, static_cast<int64_t>(s.n) * g.rows,
                               stream_));
  }
  return absl::OkStatus();
}

}  // namespace ds::cuda
