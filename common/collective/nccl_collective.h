// NcclCollective: ds::Collective over NCCL for GPU worker processes (one process per device).
// Built only with DS_HAVE_CUDA. Every buffer passed to it is a device pointer on `device`;
// collectives run on the collective's own stream and the call returns after the stream has
// synchronised (blocking contract of collective.h; the CUDA backend may later take the stream and
// enqueue without the sync, inside its CUDA graph).
//
// Bootstrap: rank 0 calls NewUniqueId(); the 128 opaque bytes travel to every rank through the
// scheduler (RegisterWorker/AssignTp, see docs/tp.md) or any out-of-band channel; every rank then
// calls Create(rank, world, id, device). Peers on other hosts connect over TCP or InfiniBand
// according to NCCL's own environment (NCCL_SOCKET_IFNAME, NCCL_IB_HCA).
#pragma once
#include <array>
#include <memory>

#include "common/collective/collective.h"

namespace ds {

using NcclId = std::array<char, 128>;  // == sizeof(ncclUniqueId)

class NcclCollective final : public Collective {
 public:
  static absl::StatusOr<NcclId> NewUniqueId();
  static absl::StatusOr<std::unique_ptr<NcclCollective>> Create(int rank, int world,
                                                                const NcclId& id, int device);
  ~NcclCollective() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override { return "nccl"; }
  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status AllGather(const float* in, size_t n, float* out) override;
  absl::Status AllGatherV(const float* in, std::span<const size_t> counts, float* out) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;
  void* stream() const { return stream_; }  // cudaStream_t

 private:
  NcclCollective() = default;
  absl::Status Sync(const char* what);
  void* comm_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t
  float* scratch_ = nullptr;  // [1] device float for Barrier
  int rank_ = 0, world_ = 1, device_ = 0;
};

}  // namespace ds
