// NcclCollective (see nccl_collective.h).
#include "common/collective/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ds {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NcclId must hold an ncclUniqueId");

absl::Status NcclErr(const char* what, ncclResult_t r) {
  return absl::UnavailableError(absl::StrCat("NCCL ", what, ": ", ncclGetErrorString(r)));
}
absl::Status CudaErr(const char* what, cudaError_t e) {
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::StatusOr<NcclId> NcclCollective::NewUniqueId() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return NcclErr("GetUniqueId", r);
  NcclId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Create(int rank, int world,
                                                                        const NcclId& id,
                                                                        int device) {
  if (world < 1 || rank < 0 || rank >= world)
    return absl::InvalidArgumentError(absl::StrCat("NCCL: rank ", rank, " not in a world of ", world));
  std::unique_ptr<NcclCollective> c(new NcclCollective());
  c->rank_ = rank;
  c->world_ = world;
  c->device_ = device;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaErr("SetDevice", e);
  cudaStream_t s;
  if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess)
    return CudaErr("StreamCreate", e);
  c->stream_ = s;
  if (cudaError_t e = cudaMalloc(&c->scratch_, sizeof(float)); e != cudaSuccess)
    return CudaErr("Malloc", e);
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  ncclComm_t comm;
  if (ncclResult_t r = ncclCommInitRank(&comm, world, uid, rank); r != ncclSuccess)
    return NcclErr("CommInitRank", r);
  c->comm_ = comm;
  return c;
}

NcclCollective::~NcclCollective() {
  if (comm_) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
  if (scratch_) cudaFree(scratch_);
  if (staging_) cudaFree(staging_);
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status NcclCollective::Sync(const char* what) {
  if (cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)); e != cudaSuccess)
    return CudaErr(what, e);
  return absl::OkStatus();
}

absl::StatusOr<bool> NcclCollective::IsHost(const void* p) const {
  cudaPointerAttributes a;
  if (cudaError_t e = cudaPointerGetAttributes(&a, p); e != cudaSuccess) {
    cudaGetLastError();  // older runtimes flag plain host memory as an error; clear it
    return true;
  }
  return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

absl::Status NcclCollective::EnsureStaging(size_t bytes) {
  if (bytes <= staging_bytes_) return absl::OkStatus();
  if (staging_) cudaFree(staging_);
  staging_ = nullptr;
  staging_bytes_ = 0;
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return CudaErr("SetDevice", e);
  if (cudaError_t e = cudaMalloc(&staging_, bytes); e != cudaSuccess) return CudaErr("Malloc staging", e);
  staging_bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status NcclCollective::AllReduceSum(float* data, size_t n) {
  if (n == 0) return absl::OkStatus();
  auto comm = static_cast<ncclComm_t>(comm_);
  auto s = static_cast<cudaStream_t>(stream_);
  DS_ASSIGN_OR_RETURN(const bool host, IsHost(data));
  float* buf = data;
  if (host) {
    DS_RETURN_IF_ERROR(EnsureStaging(n * sizeof(float)));
    buf = static_cast<float*>(staging_);
    if (cudaError_t e = cudaMemcpyAsync(buf, data, n * sizeof(float), cudaMemcpyHostToDevice, s);
        e != cudaSuccess)
      return CudaErr("AllReduce stage in", e);
  }
  if (ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, s); r != ncclSuccess)
    return NcclErr("AllReduce", r);
  if (host) {
    if (cudaError_t e = cudaMemcpyAsync(data, buf, n * sizeof(float), cudaMemcpyDeviceToHost, s);
        e != cudaSuccess)
      return CudaErr("AllReduce stage out", e);
  }
  return Sync("AllReduce sync");
}

absl::Status NcclCollective::AllReduceSumOnStream(float* data, size_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  if (ncclResult_t r = ncclAllReduce(data, data, n, ncclFloat32, ncclSum,
                                     static_cast<ncclComm_t>(comm_),
                                     static_cast<cudaStream_t>(stream));
      r != ncclSuccess)
    return NcclErr("AllReduce (stream-ordered)", r);
  return absl::OkStatus();
}

absl::Status NcclCollective::AllGather(const float* in, size_t n, float* out) {
  if (n == 0) return absl::OkStatus();
  auto comm = static_cast<ncclComm_t>(comm_);
  auto s = static_cast<cudaStream_t>(stream_);
  if (ncclResult_t r = ncclAllGather(in, out, n, ncclFloat32, comm, s); r != ncclSuccess)
    return NcclErr("AllGather", r);
  return Sync("AllGather sync");
}

// NCCL has no all-gather-v: one broadcast per rank inside a group is the library's documented
// way to express it (each rank roots its own block); NCCL fuses the group into one launch.
absl::Status NcclCollective::AllGatherV(const float* in, std::span<const size_t> counts,
                                        float* out) {
  if (static_cast<int>(counts.size()) != world_)
    return absl::InvalidArgumentError(
        absl::StrCat("AllGatherV: ", counts.size(), " counts for a world of ", world_));
  auto comm = static_cast<ncclComm_t>(comm_);
  auto s = static_cast<cudaStream_t>(stream_);
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return NcclErr("GroupStart", r);
  size_t off = 0;
  for (int r = 0; r < world_; ++r) {
    if (counts[r]) {
      const float* src = r == rank_ ? in : out + off;
      if (ncclResult_t e = ncclBroadcast(src, out + off, counts[r], ncclFloat32, r, comm, s);
          e != ncclSuccess) {
        ncclGroupEnd();
        return NcclErr("Broadcast (allgatherv)", e);
      }
    }
    off += counts[r];
  }
  if (ncclResult_t r = ncclGroupEnd(); r != ncclSuccess) return NcclErr("GroupEnd", r);
  return Sync("AllGatherV sync");
}

absl::Status NcclCollective::Broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= world_)
    return absl::InvalidArgumentError(absl::StrCat("Broadcast: root ", root, " not in a world of ", world_));
  if (bytes == 0) return absl::OkStatus();
  auto comm = static_cast<ncclComm_t>(comm_);
  auto s = static_cast<cudaStream_t>(stream_);
  DS_ASSIGN_OR_RETURN(const bool host, IsHost(data));
  void* buf = data;
  if (host) {
    DS_RETURN_IF_ERROR(EnsureStaging(bytes));
    buf = staging_;
    if (cudaError_t e = cudaMemcpyAsync(buf, data, bytes, cudaMemcpyHostToDevice, s); e != cudaSuccess)
      return CudaErr("Broadcast stage in", e);
  }
  if (ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm, s); r != ncclSuccess)
    return NcclErr("Broadcast", r);
  if (host) {
    if (cudaError_t e = cudaMemcpyAsync(data, buf, bytes, cudaMemcpyDeviceToHost, s); e != cudaSuccess)
      return CudaErr("Broadcast stage out", e);
  }
  return Sync("Broadcast sync");
}

absl::Status NcclCollective::Barrier() {
  // A one-element all-reduce: returns only once every rank has joined.
  return AllReduceSum(scratch_, 1);
}

}  // namespace ds
