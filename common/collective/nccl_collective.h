// NcclCollective: ds::Collective over NCCL for GPU worker processes (one process per device).
// Built only with DS_HAVE_CUDA and NCCL found (DS_HAVE_NCCL). Buffers are device pointers on
// `device`; AllReduceSum and Broadcast also take host pointers (staged through a device buffer:
// the worker broadcasts sampled token ids from host memory). The blocking collectives run on the
// collective's own stream and return after it has synchronised (contract of collective.h);
// AllReduceSumOnStream enqueues on the caller's stream without a sync, which is how the CUDA
// backend reduces inside its forward pass (and inside its decode CUDA graphs: NCCL >= 2.9
// supports stream capture).
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
  bool supports_stream_ordered() const override { return true; }
  absl::Status AllReduceSumOnStream(float* data, size_t n, void* stream) override;
  void* stream() const { return stream_; }  // cudaStream_t
  int device() const { return device_; }

 private:
  NcclCollective() = default;
  absl::Status Sync(const char* what);
  // Host buffers go through staging_ (grown on demand); device/managed ones are used in place.
  absl::StatusOr<bool> IsHost(const void* p) const;
  absl::Status EnsureStaging(size_t bytes);
  void* comm_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t
  float* scratch_ = nullptr;  // [1] device float for Barrier
  void* staging_ = nullptr;   // [staging_bytes_] device bytes for host-pointer calls
  size_t staging_bytes_ = 0;
  int rank_ = 0, world_ = 1, device_ = 0;
};

}  // namespace ds
