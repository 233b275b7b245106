// CustomAllReduceCollective: the TP all-reduce for CUDA ranks on ONE host, written for the small
// activations of decode (27B: one 5,120-float row per token, 128 all-reduces per token). Every
// rank cudaMalloc's a staging buffer plus barrier flags, exports a CUDA IPC handle, and the
// handles travel through the group's existing rendezvous (the `base` collective: Gloo over TCP,
// met through the scheduler's store or a FileStore); each rank then opens its peers' buffers and
// the kernels (kernels/cuda/custom_allreduce.cuh) read them directly over NVLink / PCIe P2P — or
// from the same GPU, since IPC handles are valid between processes on one device (how it is
// tested on the one-GPU machine; NCCL refuses two ranks on one device).
//
//   * one-shot (every rank reads all peers' buffers and sums) below
//     CustomAllReduceOptions::two_shot_min_bytes, two-shot (reduce-scatter + all-gather) above;
//   * the sum runs in rank order, so every rank gets bitwise the same result;
//   * stream-ordered and graph-capturable: barriers are epoch flags in device memory, nothing
//     waits on the host, so the CUDA backend keeps its decode graphs;
//   * AllGather / AllGatherV of device buffers (the lm_head logits after each step) go the same
//     way; Broadcast, Barrier and host buffers go to `base`.
//
// Create fails with FailedPrecondition — on every rank alike, the ranks agree first — when the
// group cannot use it: ranks on several hosts, a peer GPU this process cannot see or reach
// (no P2P), more than kCarMaxRanks ranks, or IPC refused. Callers then fall back to NCCL (the
// multi-host path) or the host-staged collective (worker/process/tp_session.cc).
//
// Calls of one rank must not overlap in time (they share the buffer and the barrier epochs): the
// stream-ordered ones are ordered by the caller's stream, and the blocking ones (own stream) are
// only made after the caller synchronised its stream (the runner does before the logits gather).
//
// If a peer dies inside a call, the waiting blocks give up after
// CustomAllReduceOptions::peer_timeout_seconds and the next blocking call (every step ends with
// the logits gather) returns Unavailable; the group must be rebuilt.
#pragma once
#include <memory>
#include <vector>

#include "common/collective/collective.h"
#include "common/collective/custom_allreduce_plan.h"

namespace ds {

class CustomAllReduceCollective final : public Collective {
 public:
  // `base` carries the rendezvous and everything but device all-reduces / gathers; `device` is
  // this rank's CUDA device.
  static absl::StatusOr<std::unique_ptr<CustomAllReduceCollective>> Create(
      std::unique_ptr<Collective> base, int device, const CustomAllReduceOptions& o = {});
  ~CustomAllReduceCollective() override;

  int rank() const override { return base_->rank(); }
  int world() const override { return base_->world(); }
  std::string name() const override { return "custom"; }
  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status AllGather(const float* in, size_t n, float* out) override;
  absl::Status AllGatherV(const float* in, std::span<const size_t> counts, float* out) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;
  bool supports_stream_ordered() const override { return true; }
  absl::Status AllReduceSumOnStream(float* data, size_t n, void* stream) override;
  // One block per row (rows <= kCarMaxBlocks, rows * n within the buffer, n % 32 == 0, 16-byte
  // aligned pointers): the one-shot sum, then the norm and the quantization from the summed row
  // while it is in registers. Else Unimplemented (the caller falls back).
  absl::Status AllReduceRmsNormOnStream(const FusedNormArgs& a, void* stream) override;
  bool graph_capturable() const override { return true; }

  const CustomAllReduceOptions& options() const { return opts_; }
  // Tests: force one-shot or two-shot (every rank must set the same).
  void set_algo(CustomAllReduceOptions::Algo a) { opts_.algo = a; }
  // Whether a message of n floats runs two-shot.
  bool TwoShot(size_t n) const;
  size_t capacity_floats() const { return capacity_floats_; }

 private:
  struct Impl;
  CustomAllReduceCollective() = default;
  absl::Status CheckPeers();  // Unavailable once a kernel timed out waiting for a peer
  std::unique_ptr<Collective> base_;
  std::unique_ptr<Impl> impl_;
  CustomAllReduceOptions opts_;
  size_t capacity_floats_ = 0;
};

}  // namespace ds
