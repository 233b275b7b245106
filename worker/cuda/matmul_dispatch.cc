// CudaDevice (cuda_device.h): which kernel runs a matrix product. Up to gemv_max_rows rows
// (tiled Q6_K: tiled_max_rows, with int8_mmq up to mmq_max_rows; among the tiled kernels the
// MMQ table below picks) take the column kernels on int8 activations, more rows are
// dequantized to bf16 and go through cuBLAS; F32 weights always go through cuBLAS's SGEMM there.
// A step's rows are cut into segments first (PlanRowSegments, CudaBackendOptions::
// batch_invariant): decode rows in column segments, each long prefill piece in a cuBLAS product
// of its own, so that no row's numbers depend on the other rows of the step.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/collective/collective.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/mmq.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/tiled_f16.cuh"
#include "worker/cuda/cuda_device.h"

namespace ds::cuda {
namespace {

// Which kernel multiplies a tiled matrix by nc int8 columns: the MMQ kernel (mmq.cuh) in the
// block shape of this table, or the tiled column kernel (kTiledKernel). Both give the same
// numbers bit for bit, so this is a speed table only. Filled from mmq_cuda_test
// MmqTiming.Table27B (H200, 2026-12-01, docs/perf/h200.md "Int8 MMQ"): per column bucket, the
// fastest kernel for the narrow, long-K matrices (M <= 6144: ffn_down, ssm_out, attn_output), the
// wide ones (gdn qkv+gate, attn q+gate, lm_head) and the ffn gate/up pair. At <= 8 columns the
// tiled kernel wins (ffn gate+up 61 vs 92 us); from 9 columns MMQ (gate+up at 16 / 32 / 64
// columns: 81 vs 87, 124 vs 210, 241 vs 419 us).
struct MmqRow {
  int max_nc;
  MmqShape narrow, wide, pair;
};
constexpr MmqShape kTiledKernel{0, 0, 0};
constexpr MmqRow kMmqTable[] = {
    {8, kTiledKernel, kTiledKernel, kTiledKernel},
    {16, {4, 2, 0}, {2, 2, 0}, {2, 2, 0}},
    {24, {4, 2, 0}, {4, 2, 0}, {2, 2, 0}},
    {32, {4, 2, 0}, {2, 2, 0}, {2, 2, 0}},
    {48, {2, 2, 32}, {2, 2, 32}, {2, 2, 32}},  // a 32- and a 16-column pass beat one 48-column one
    {64, {2, 2, 0}, {2, 2, 0}, {2, 2, 0}},
};

MmqShape PickMmq(const GemvArgs& a) {
  for (const MmqRow& r : kMmqTable)
    if (a.nc <= r.max_nc)
      return a.epilogue == GemvEpilogue::kSiluMul ? r.pair : a.M > 6144 ? r.wide : r.narrow;
  return kTiledKernel;
}

}  // namespace

// Tiled matrices: the f16 tensor-core kernel when F16Columns chose it (the segments carry xh /
// xs), else MMQ where the table says so (and the activations are 16-byte aligned, as the
// backend's column segments always are), else the tiled column kernel.
absl::Status CudaDevice::TiledColumns(const GemvArgs* segs, int n, bool f16) {
  if (f16) return TiledF16Multi(segs, n, f16_scratch_, stream_);
  if (copts_.int8_mmq) {
    const MmqShape sh = PickMmq(segs[0]);
    const bool aligned =
        (reinterpret_cast<uintptr_t>(segs[0].xq) | reinterpret_cast<uintptr_t>(segs[0].xd)) % 16 == 0;
    if (sh.slots > 0 && aligned && segs[0].nc <= kMmqMaxCols)
      return MmqTiledMulti(segs, n, sh, stream_);
  }
  return TiledGemvMulti(segs, n, stream_);
}

absl::Status CudaDevice::EnsureQuantized(const float* x, int R, int K) {
  if (xq_src_ == x && xq_rows_ == R) return absl::OkStatus();
  // The 16-element sums serve only one-column launches (the tiled kernel's kSums): a single-row
  // activation; wider steps skip writing them.
  const bool sums = R == 1;
  DS_RETURN_IF_ERROR(
      QuantizeActivations(x, R, K, xq_, xd_, stream_, sums ? xsum_ : nullptr, early_launch_));
  NoteQuantized(x, R, sums);
  return absl::OkStatus();
}
absl::Status CudaDevice::EnsureHalfColumns(const float* x, int R, int K) {
  if (xf_src_ == x && xf_rows_ == R) return absl::OkStatus();
  DS_RETURN_IF_ERROR(HalfActivations(x, R, K, xf_, xf_scale_, stream_, early_launch_,
                                     kq_tiled_ ? xf_sums_ : nullptr,
                                     f16_scratch_.warpgroup_order, copts_.half_rows_in_registers));
  xf_src_ = x;
  xf_rows_ = R;
  return absl::OkStatus();
}
absl::Status CudaDevice::EnsureHalf(const float* x, int R, int K) {
  if (xh_src_ == x && xh_rows_ == R) return absl::OkStatus();
  // f16 (the portable path) is scaled into its range; the GEMMs undo it (dequant.cuh, XhScale).
  const int64_t n = static_cast<int64_t>(R) * K;
  DS_RETURN_IF_ERROR(bf16_ ? ConvertF32ToHalf(x, n, xh_, true, stream_)
                           : ConvertF32ToHalfScaled(x, n, xh_, xh_scale_, stream_));
  xh_src_ = x;
  xh_rows_ = R;
  return absl::OkStatus();
}

absl::Status CudaDevice::GemmFp8Rows(const DMat& w, const float* x, int row0, int n, float* y,
                                     bool accumulate) {
  const float* src = x + static_cast<int64_t>(row0) * w.cols;
  if (x8_src_ != src || x8_rows_ != n || x8_k_ != w.cols) {
    DS_RETURN_IF_ERROR(fp8_->SetActivations(src, n, w.cols, stream_));
    x8_src_ = src;
    x8_rows_ = n;
    x8_k_ = w.cols;
  }
  return fp8_->Multiply(w.dense_fp8, w.dense_fp8_scale, y + static_cast<int64_t>(row0) * w.rows,
                        w.rows, w.rows, accumulate, stream_);
}

// The GEMV path for R <= ColumnRows(w) rows: GemvMaxCols(type) activation columns per launch.
// `w2` is the second matrix of a kSiluMul pair (same type and shape as w), else nullptr.
absl::Status CudaDevice::GemvColumns(const DMat& w, const DMat* w2, const float* x, int R,
                                      float* y, GemvEpilogue epilogue) {
  const bool f16 = F16Columns(w, R);
  const bool qx = !f16 && (w.tiled || GemvWantsQuantizedX(w.type, w.cols));
  if (f16) DS_RETURN_IF_ERROR(EnsureHalfColumns(x, R, w.cols));
  if (qx) DS_RETURN_IF_ERROR(EnsureQuantized(x, R, w.cols));
  const int max_cols = w.tiled ? kTiledMaxCols : GemvMaxCols(w.type);
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
      if (xsum_valid_) a.xsum = xsum_;  // one row, so c0 == 0
    }
    if (f16) {
      a.xh = xf_ + static_cast<int64_t>(c0) * w.cols;
      a.xs = xf_scale_ + c0;
      if (xf_sums_) a.xhs = xf_sums_ + static_cast<int64_t>(c0) * (w.cols / 32);
    }
    a.y = y + static_cast<int64_t>(c0) * w.rows;
    a.epilogue = epilogue;
    a.early_launch = early_launch_;
    a.six_columns = copts_.gemv_six_columns;
    a.early_weights = copts_.gemv_early_weights;
    DS_RETURN_IF_ERROR(w.tiled ? TiledColumns(&a, 1, f16) : Gemv(a, stream_));
  }
  return absl::OkStatus();
}

void CudaDevice::PlanRowSegments(const MicroStep& step) {
  int dec_runs = 0;
  for (const RowRun& r : step.runs) dec_runs += r.decode_like() ? 1 : 0;
  const bool f16_on = xf_ != nullptr && copts_.f16_mma;
  const int exact_cap = ExactCap();
  step_exact_ = false;
  for (int f = 0; f < kFamilies; ++f) {
    if (f == 2 && fp8_column_rows_ < 0) continue;
    const int cap = FamilyCap(f);
    // Prefill pieces keep the column kernels only up to the tiled kernel's own width (not the
    // int8 MMQ widths, which are for decode rows): their numbers stay those of dequantization +
    // cuBLAS above it, as before MMQ (gpu_vs_cpu_test's prefill bounds and tiled-vs-raw check).
    const int prefill_cap = f == 1 || f == 2 ? std::min(cap, PrefillColumnRows()) : cap;
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
        if (dec ? !dec_column : r.n > prefill_cap) {
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
        // A replay's decode_path run must give the numbers of its tokens decoded one by one:
        // with the f16 kernel on (F16Columns), its rows stay in segments of fewer columns.
        const bool exact = f >= 1 && f16_on && r.decode_path && r.spec_entry < 0 && r.n > 1;
        for (int i = 0; i < r.n;) {
          RowSegment* last = out.empty() ? nullptr : &out.back();
          const int lim = exact || (last && last->exact) ? std::min(cap, exact_cap) : cap;
          if (last && last->column && last->row0 + last->n == r.row0 + i && last->n < lim) {
            const int take = std::min(lim - last->n, r.n - i);
            last->n += take;
            last->exact = last->exact || exact;
            i += take;
          } else {
            const int take = std::min(exact ? std::min(cap, exact_cap) : cap, r.n - i);
            out.push_back({r.row0 + i, take, true, exact});
            i += take;
          }
        }
      }
    }
    StepSegments& split = segs_[f];
    split.column.clear();
    split.gemm.clear();
    for (const RowSegment& g : out) {
      (g.column ? split.column : split.gemm).push_back(g);
      if (f >= 1 && g.exact) step_exact_ = true;
    }
    // TP overlap: every cuBLAS segment is cut by its own length only (ceil(n / chunks) rounded
    // up to 64 rows), so a piece's products do not depend on what else shares the step.
    std::vector<RowSegment>& chunks = overlap_gemm_[f];
    chunks.clear();
    if (copts_.overlap_allreduce && tp_world_ > 1) {
      const int k = std::max(1, copts_.overlap_chunks);
      for (const RowSegment& g : split.gemm) {
        const int c = g.n >= std::max(1, copts_.overlap_min_rows) ? ((g.n + k - 1) / k + 63) / 64 * 64
                                                                  : g.n;
        for (int i = 0; i < g.n; i += c) chunks.push_back({g.row0 + i, std::min(c, g.n - i), false});
      }
    }
  }
  // The all-reduce pieces, in order: the rows as a flavour-0 matmul finishes them (column
  // segments, then the chunks), contiguous ones coalesced up to a chunk's worth of rows (64 by
  // default: fewer launches for runs of decode rows or short pieces). Derived from the step and
  // the options only — never from this rank's weights — so every rank issues the same
  // collectives even when its shard's matrices take other kernels (tiled or not, no columns).
  reduce_pieces_.clear();
  if (copts_.overlap_allreduce && tp_world_ > 1) {
    const int piece = std::max(1, copts_.overlap_min_rows / std::max(1, copts_.overlap_chunks));
    int p0 = 0, pn = 0;
    auto add = [&](const RowSegment& g) {
      if (pn > 0 && p0 + pn != g.row0) {
        reduce_pieces_.push_back({p0, pn});
        pn = 0;
      }
      if (pn == 0) p0 = g.row0;
      pn += g.n;
      if (pn >= piece) {
        reduce_pieces_.push_back({p0, pn});
        pn = 0;
      }
    };
    for (const RowSegment& g : segs_[0].column) add(g);
    for (const RowSegment& g : overlap_gemm_[0]) add(g);
    if (pn > 0) reduce_pieces_.push_back({p0, pn});
  }
}

absl::Status CudaDevice::LinearOverlapReduce(const DMat& w, const float* x, int R) {
  if (R != rows_ || w.rows != cfg_.n_embd)
    return absl::InternalError(absl::StrCat("LinearOverlapReduce: ", R, " rows of ", w.rows,
                                            ", the step has ", rows_, " of ", cfg_.n_embd));
  const StepSegments& segs = SegmentsFor(w);
  const std::vector<RowSegment>& chunks = overlap_gemm_[Family(w)];
  const bool acc = ResidualOnThisRank();
  const int64_t M = w.rows, K = w.cols;
  DS_RETURN_IF_ERROR(BeginOverlapReduce());
  for (const RowSegment& g : segs.column) {
    DS_RETURN_IF_ERROR(GemvColumns(w, nullptr, x + g.row0 * K, g.n, h_ + g.row0 * M,
                                   acc ? GemvEpilogue::kAccumulate : GemvEpilogue::kStore));
    DS_RETURN_IF_ERROR(ReduceRowsDone(g.row0, g.n));
  }
  if (!chunks.empty()) {
    const float beta = acc ? 1.f : 0.f;
    const bool f32 = w.type == GgmlType::F32;
    const uint64_t rb = GgmlRowBytes(w.type, w.cols);
    const int wchunk = static_cast<int>(std::min<uint64_t>(w.rows, wh_elems_ / w.cols));
    auto dequant = [&](int m0, int mc) -> absl::Status {
      if (w.tiled) return DequantizeTiledRows(w.type, w.d, m0, mc, w.cols, wh_, bf16_, stream_);
      return DequantizeRows(w.type, static_cast<const uint8_t*>(w.d) + m0 * rb, mc, w.cols, wh_,
                            bf16_, stream_);
    };
    if (!f32 && !w.dense_fp8) {
      DS_RETURN_IF_ERROR(EnsureHalf(x, chunks.back().row0 + chunks.back().n, w.cols));
      if (wchunk == w.rows && !w.dense) DS_RETURN_IF_ERROR(dequant(0, w.rows));  // once for all
    }
    for (const RowSegment& c : chunks) {
      if (w.dense_fp8) {
        DS_RETURN_IF_ERROR(GemmFp8Rows(w, x, c.row0, c.n, h_, acc));
      } else if (w.dense) {
        DS_RETURN_IF_ERROR(gemm_->Run(w.dense, xh_ + c.row0 * K, h_ + c.row0 * M, w.rows, w.cols,
                                      c.n, w.rows, bf16_, beta, stream_, XhScale()));
      } else if (f32) {
        DS_RETURN_IF_ERROR(gemm_->RunF32(static_cast<const float*>(w.d), x + c.row0 * K,
                                         h_ + c.row0 * M, w.rows, w.cols, c.n, w.rows, beta,
                                         stream_));
      } else {
        for (int m0 = 0; m0 < w.rows; m0 += wchunk) {
          const int mc = std::min(wchunk, w.rows - m0);
          if (wchunk != w.rows) DS_RETURN_IF_ERROR(dequant(m0, mc));
          DS_RETURN_IF_ERROR(gemm_->Run(wh_, xh_ + c.row0 * K, h_ + c.row0 * M + m0, mc, w.cols,
                                        c.n, w.rows, bf16_, beta, stream_, XhScale()));
        }
      }
      DS_RETURN_IF_ERROR(ReduceRowsDone(c.row0, c.n));
    }
  }
  return EndOverlapReduce();
}

absl::Status CudaDevice::BeginOverlapReduce() {
  if (!comm_.s) {
    // Above the compute stream's priority: a reduction's blocks start as soon as its chunk is
    // done instead of queueing behind the next GEMM's.
    int least = 0, greatest = 0;
    DS_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    DS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&comm_.s, cudaStreamNonBlocking, greatest));
    DS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&comm_.fork, cudaEventDisableTiming));
    DS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&comm_.join, cudaEventDisableTiming));
  }
  row_done_.assign(rows_, 0);
  next_piece_ = 0;
  return absl::OkStatus();
}

absl::Status CudaDevice::EndOverlapReduce() {
  if (next_piece_ != reduce_pieces_.size())
    return absl::InternalError(absl::StrCat("TP overlap: ", reduce_pieces_.size() - next_piece_,
                                            " all-reduce pieces left with rows never written"));
  residual_reduced_ = true;
  return absl::OkStatus();
}

absl::Status CudaDevice::ReduceRowsDone(int row0, int n) {
  std::fill(row_done_.begin() + row0, row_done_.begin() + row0 + n, 1);
  // Pieces go out in plan order as soon as all their rows are written.
  while (next_piece_ < reduce_pieces_.size()) {
    const auto [p0, pn] = reduce_pieces_[next_piece_];
    if (std::find(row_done_.begin() + p0, row_done_.begin() + p0 + pn, 0) !=
        row_done_.begin() + p0 + pn)
      break;
    const int64_t H = cfg_.n_embd;
    // comm_ starts once stream_ has written these rows (the event covers all of stream_'s
    // earlier work); comm_ runs its reductions one after the other, so the custom all-reduce's
    // buffer and barrier epochs are never used by two calls at once, and stream_ does not touch
    // these rows again before it waits for comm_ (AllReduceResidualFusedNorm).
    DS_CUDA_RETURN_IF_ERROR(cudaEventRecord(comm_.fork, stream_));
    DS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(comm_.s, comm_.fork, 0));
    DS_RETURN_IF_ERROR(coll_->AllReduceSumOnStream(h_ + p0 * H, static_cast<size_t>(pn) * H, comm_.s));
    ++next_piece_;
    ++overlap_pieces_;
  }
  return absl::OkStatus();
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
  if (w.dense_fp8) {  // CudaBackendOptions::prefill_fp8: the e4m3 copy on FP8 tensor cores
    for (const RowSegment& g : segs)
      DS_RETURN_IF_ERROR(GemmFp8Rows(w, x, g.row0, g.n, y, accumulate));
    return absl::OkStatus();
  }
  const int end = segs.back().row0 + segs.back().n;
  DS_RETURN_IF_ERROR(EnsureHalf(x, end, w.cols));
  if (w.dense) {  // CudaBackendOptions::dense_weights: the 16-bit copy, no dequantization
    for (const RowSegment& g : segs)
      DS_RETURN_IF_ERROR(gemm_->Run(w.dense, xh_ + static_cast<int64_t>(g.row0) * w.cols,
                                    y + static_cast<int64_t>(g.row0) * w.rows, w.rows, w.cols, g.n,
                                    w.rows, bf16_, beta, stream_, XhScale()));
    return absl::OkStatus();
  }
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
                                    g.n, w.rows, bf16_, beta, stream_, XhScale()));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::LinearRows(const DMat& w, const float* x, int R, float* y,
                                    bool accumulate, bool prefill_rows) {
  const GemvEpilogue ep = accumulate ? GemvEpilogue::kAccumulate : GemvEpilogue::kStore;
  if (ColumnPath(w, R) && (!prefill_rows || !w.tiled || R <= PrefillColumnRows())) {
    if (step_exact_ && F16Columns(w, R)) {
      // The step holds a replay: its logit rows must get the int8 kernels' numbers, those of
      // decoding one by one, so the head runs in column chunks under the f16 kernel's width.
      const int cap = ExactCap();
      for (int c0 = 0; c0 < R; c0 += cap)
        DS_RETURN_IF_ERROR(GemvColumns(w, nullptr, x + static_cast<int64_t>(c0) * w.cols,
                                       std::min(cap, R - c0),
                                       y + static_cast<int64_t>(c0) * w.rows, ep));
      return absl::OkStatus();
    }
    return GemvColumns(w, nullptr, x, R, y, ep);
  }
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
  if (R != rows_)
    return absl::InternalError(absl::StrCat("LinearMulti: ", R, " rows, the step has ", rows_));
  if (!SameColumnMatrices(mats)) {
    for (auto& [m, y] : mats) DS_RETURN_IF_ERROR(Linear(*m, x, R, y, false));
    return absl::OkStatus();
  }
  // Every column segment in launches of all the matrices together, in a step with prefill pieces
  // too: the f16 kernel's K split follows the launch's matrices (TiledF16Multi), so launching them
  // one by one there would give a decode row other numbers than in a step of decode rows only
  // (batch invariance). The GEMM segments go matrix by matrix.
  const StepSegments& segs = SegmentsFor(*mats.begin()->first);
  for (const RowSegment& g : segs.column) DS_RETURN_IF_ERROR(ColumnsMulti(mats, x, g.n, g.row0));
  if (segs.gemm.empty()) return absl::OkStatus();
  for (auto& [m, y] : mats) DS_RETURN_IF_ERROR(GemmSegments(*m, x, segs.gemm, y, false));
  return absl::OkStatus();
}

bool CudaDevice::SameColumnMatrices(std::initializer_list<std::pair<const DMat*, float*>> mats) const {
  const DMat& m0 = *mats.begin()->first;
  bool same = static_cast<int>(mats.size()) <= kGemvMaxSegs;
  for (auto& [m, y] : mats)
    same = same && m->type == m0.type && m->cols == m0.cols && m->tiled == m0.tiled;
  return same;
}

absl::Status CudaDevice::ColumnsMulti(std::initializer_list<std::pair<const DMat*, float*>> mats,
                                      const float* x, int R, int row0) {
  // One launch per column chunk for all matrices (SameColumnMatrices: one type and width).
  const DMat& m0 = *mats.begin()->first;
  x += static_cast<int64_t>(row0) * m0.cols;
  const bool f16 = F16Columns(m0, R);
  const bool qx = !f16 && (m0.tiled || GemvWantsQuantizedX(m0.type, m0.cols));
  if (f16) DS_RETURN_IF_ERROR(EnsureHalfColumns(x, R, m0.cols));
  if (qx) DS_RETURN_IF_ERROR(EnsureQuantized(x, R, m0.cols));
  const int max_cols = m0.tiled ? kTiledMaxCols : GemvMaxCols(m0.type);
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
        if (xsum_valid_) a.xsum = xsum_;  // one row, so c0 == 0
      }
      if (f16) {
        a.xh = xf_ + static_cast<int64_t>(c0) * m->cols;
        a.xs = xf_scale_ + c0;
        if (xf_sums_) a.xhs = xf_sums_ + static_cast<int64_t>(c0) * (m->cols / 32);
      }
      a.y = y + static_cast<int64_t>(row0 + c0) * m->rows;
      a.epilogue = GemvEpilogue::kStore;
      a.early_launch = early_launch_;
      a.six_columns = copts_.gemv_six_columns;
      a.early_weights = copts_.gemv_early_weights;
    }
    DS_RETURN_IF_ERROR(m0.tiled ? TiledColumns(segs_args, n, f16) : GemvMulti(segs_args, n, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::NormToA(const float* w, int R) {
  const int H = cfg_.n_embd;
  InvalidateX();
  // Steps whose trunk matmuls take the f16 kernel get its activations from the norm itself.
  if (trunk_tiled_ && F16ColumnRows(R) && H % (f16_scratch_.warpgroup_order ? 16 : 8) == 0) {
    DS_RETURN_IF_ERROR(RmsNormHalf(h_, w, a_, xf_, xf_scale_, R, H, cfg_.rms_eps, stream_,
                                   early_launch_, kq_tiled_ ? xf_sums_ : nullptr,
                                   f16_scratch_.warpgroup_order));
    xf_src_ = a_;
    xf_rows_ = R;
    return absl::OkStatus();
  }
  if (R <= QuantRows() && H % 32 == 0) {
    DS_RETURN_IF_ERROR(
        RmsNormQuantize(h_, w, a_, xq_, xd_, R, H, cfg_.rms_eps, stream_, early_launch_));
    NoteQuantized(a_, R, /*sums=*/false);
    return absl::OkStatus();
  }
  return RmsNormRows(h_, H, nullptr, w, a_, R, H, cfg_.rms_eps, stream_, early_launch_);
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
