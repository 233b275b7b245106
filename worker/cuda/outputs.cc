// CudaDevice (cuda_device.h): what leaves a micro-step — logits, hidden states, tokens picked
// on the device — and the profiling events.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "worker/cuda/cuda_device.h"

namespace ds::cuda {

absl::Status CudaDevice::Copy(void* dst, const void* src, size_t n) const {
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream_));
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyColumns(float* dst, int64_t ld_dst, const float* src, int64_t ld_src,
                                     int64_t width, int64_t rows) {
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
      dst, static_cast<size_t>(ld_dst) * sizeof(float), src,
      static_cast<size_t>(ld_src) * sizeof(float), static_cast<size_t>(width) * sizeof(float),
      static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::ReadLogits(int n, float* dst) {
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, logits_, static_cast<size_t>(n) * cfg_.n_vocab * 4,
                                          cudaMemcpyDeviceToHost, stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::ReadHidden(int n, float* dst) {
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, hn_, static_cast<size_t>(n) * cfg_.n_embd * 4,
                                          cudaMemcpyDeviceToHost, stream_));
  return absl::OkStatus();
}

absl::StatusOr<int32_t*> CudaDevice::TokensOut(int32_t* dst, int n) {
  if (n < 0 || n > tokens_out_max_)
    return absl::InternalError(absl::StrCat("CUDA device: ", n, " sampled tokens in one call"));
  if (tokens_used_ + n > tokens_out_max_)
    DS_RETURN_IF_ERROR(Finish());  // hands the earlier ones over
  pending_tokens_.push_back({dst, tokens_used_, n});
  int32_t* out = h_tokens_ + tokens_used_;
  tokens_used_ += n;
  return out;
}

absl::StatusOr<cudaStream_t> CudaDevice::BeginSideCopies() {
  if (step_in_flight_ || !stream_tail_ || !copts_.side_copies) return stream_;
  if (!side_.s) {
    DS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&side_.s, cudaStreamNonBlocking));
    DS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&side_.join, cudaEventDisableTiming));
  }
  return side_.s;
}

absl::Status CudaDevice::EndSideCopies(cudaStream_t s) {
  if (s == stream_) return absl::OkStatus();
  DS_CUDA_RETURN_IF_ERROR(cudaEventRecord(side_.join, s));
  DS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, side_.join, 0));
  ++side_copy_batches_;
  return absl::OkStatus();
}

absl::Status CudaDevice::Argmax(int n, int32_t* tokens) {
  DS_ASSIGN_OR_RETURN(int32_t * out, TokensOut(tokens, n));
  ProfBegin("sample");
  DS_RETURN_IF_ERROR(ArgmaxSplitRows(logits_, cfg_.n_vocab, n, cfg_.n_vocab, argmax_scratch_, out,
                                     stream_, early_launch_));
  ProfEnd();
  return absl::OkStatus();
}

absl::Status CudaDevice::Finish() {
  if (chains_after_) {
    // Draft chains judged on the device run on behind the micro-step (QueueChainAfterVerify):
    // wait for the micro-step and its sampling only; later copies may go beside the chains.
    DS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(sampled_));
  } else {
    DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  }
  step_in_flight_ = false;
  stream_tail_ = chains_after_;
  chains_after_ = false;
  last_sample_out_ = nullptr;
  for (const PendingTokens& p : pending_tokens_)
    std::copy(h_tokens_ + p.at, h_tokens_ + p.at + p.n, p.dst);
  pending_tokens_.clear();
  tokens_used_ = 0;
  return FlushProfile();
}

absl::Status CudaDevice::Sample(std::span<const DeviceSampleRow> rows, int32_t* tokens) {
  const int nl = static_cast<int>(rows.size());
  last_sample_out_ = nullptr;
  h_sample_rows_.clear();
  h_sample_pairs_.clear();
  bool any = false;
  for (int r = 0; r < nl; ++r) {
    const DeviceSampleRow& d = rows[r];
    const bool sample = d.mode == DeviceSampleRow::Mode::kSample && d.params != nullptr;
    static const sampling::SamplingParams kNone;
    PackSampleRow(sample ? *d.params : kNone, d.history, cfg_.n_vocab, d.uniform, !sample,
                  &h_sample_rows_, &h_sample_pairs_);
    any |= sample;
  }
  if (!any) {
    std::fill(tokens, tokens + nl, -1);
    return absl::OkStatus();
  }
  if (sample_.params == nullptr) {
    DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&sample_.params, logit_rows_max_ * sizeof(SampleRowParams)));
  }
  // Plain greedy rows only (every decode of greedy requests, an MTP verify's rows): the split
  // argmax, the same token as SampleRows' greedy path (the CPU sampler's), with every row spread
  // over many SMs instead of one.
  bool plain_greedy = h_sample_pairs_.empty();
  for (const SampleRowParams& p : h_sample_rows_) plain_greedy &= p.mode == kSampleGreedy;
  if (plain_greedy) {
    ProfBegin("sample");
    DS_ASSIGN_OR_RETURN(int32_t * out, TokensOut(tokens, nl));
    DS_RETURN_IF_ERROR(ArgmaxSplitRows(logits_, cfg_.n_vocab, nl, cfg_.n_vocab, argmax_scratch_,
                                       out, stream_, early_launch_));
    ProfEnd();
    last_sample_out_ = out;
    return absl::OkStatus();
  }
  if (h_sample_pairs_.size() > sample_.pairs_cap) {
    // The previous launch may still read the old buffer: cudaFree synchronizes the device.
    cudaFree(sample_.pairs);
    sample_.pairs = nullptr;
    sample_.pairs_cap = 0;
    const size_t cap = std::max<size_t>(h_sample_pairs_.size() * 2, 4096);
    DS_CUDA_RETURN_IF_ERROR(cudaMalloc(&sample_.pairs, cap * sizeof(PenaltyPair)));
    sample_.pairs_cap = cap;
  }
  // Pageable sources: the copies are staged before cudaMemcpyAsync returns, so the host vectors
  // may be reused at once.
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sample_.params, h_sample_rows_.data(),
                                          nl * sizeof(SampleRowParams), cudaMemcpyHostToDevice,
                                          stream_));
  if (!h_sample_pairs_.empty())
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sample_.pairs, h_sample_pairs_.data(),
                                            h_sample_pairs_.size() * sizeof(PenaltyPair),
                                            cudaMemcpyHostToDevice, stream_));
  DS_ASSIGN_OR_RETURN(int32_t * out, TokensOut(tokens, nl));
  ProfBegin("sample");
  DS_RETURN_IF_ERROR(SampleRows(logits_, cfg_.n_vocab, nl, cfg_.n_vocab, sample_.params,
                                sample_.pairs, out, stream_));
  ProfEnd();
  last_sample_out_ = out;
  return absl::OkStatus();
}

void CudaDevice::ProfBegin(const char* cls) {
  if (!profiling_) return;
  if (event_next_ + 2 > event_pool_.size()) {
    for (int i = 0; i < 64; ++i) {
      cudaEvent_t e;
      cudaEventCreate(&e);
      event_pool_.push_back(e);
    }
  }
  cudaEvent_t a = event_pool_[event_next_++], b = event_pool_[event_next_++];
  cudaEventRecord(a, stream_);
  prof_events_.push_back({cls, {a, b}});
}
void CudaDevice::ProfEnd() {
  if (!profiling_ || prof_events_.empty()) return;
  cudaEventRecord(prof_events_.back().second.second, stream_);
}
absl::Status CudaDevice::FlushProfile() {
  if (prof_events_.empty()) return absl::OkStatus();
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  for (auto& [cls, ev] : prof_events_) {
    float ms = 0;
    DS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev.first, ev.second));
    prof_ms_[cls] += ms;
  }
  prof_events_.clear();
  event_next_ = 0;
  return absl::OkStatus();
}

}  // namespace ds::cuda
