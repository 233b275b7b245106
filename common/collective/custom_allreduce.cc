// CustomAllReduceCollective (see custom_allreduce.h).
#include "common/collective/custom_allreduce.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/custom_allreduce.cuh"

namespace ds {
namespace {

absl::Status CudaErr(const char* what, cudaError_t e) {
  return absl::InternalError(absl::StrCat("custom all-reduce: CUDA ", what, ": ",
                                          cudaGetErrorString(e)));
}
#define CAR_CHECK(what, expr)                                     \
  do {                                                            \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) return CudaErr(what, e_); \
  } while (0)

// Every rank learns whether all ranks succeeded (a failure on one rank must not leave the others
// waiting in the next step of the set-up). `base` sums a host float.
absl::Status Agree(Collective& base, const std::string& my_error, const char* stage) {
  float bad = my_error.empty() ? 0.f : 1.f;
  DS_RETURN_IF_ERROR(base.AllReduceSum(&bad, 1));
  if (!my_error.empty())
    return absl::FailedPreconditionError(absl::StrCat("custom all-reduce: ", my_error));
  if (bad > 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "custom all-reduce: ", static_cast<int>(bad), " other rank(s) failed at ", stage,
        " (see their logs)"));
  return absl::OkStatus();
}

bool IsDevicePointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

constexpr size_t kSignalBytes = (sizeof(cuda::CarSignal) + 255) / 256 * 256;

}  // namespace

struct CustomAllReduceCollective::Impl {
  int device = 0;
  cuda::CarGroup g{};
  char* own = nullptr;                // this rank's region: signal, then buffer
  std::vector<char*> opened;          // peers' regions mapped here (to close)
  uint32_t* counters = nullptr;       // device
  uint32_t* error_host = nullptr;     // host-mapped
  cudaStream_t stream = nullptr;      // blocking calls
};

absl::StatusOr<std::unique_ptr<CustomAllReduceCollective>> CustomAllReduceCollective::Create(
    std::unique_ptr<Collective> base, int device, const CustomAllReduceOptions& o) {
  if (!base) return absl::InvalidArgumentError("custom all-reduce: no base collective");
  const int W = base->world(), R = base->rank();
  std::unique_ptr<CustomAllReduceCollective> c(new CustomAllReduceCollective());
  c->opts_ = o;
  c->impl_ = std::make_unique<Impl>();
  Impl& m = *c->impl_;
  m.device = device;
  CAR_CHECK("SetDevice", cudaSetDevice(device));

  // 1. Who is where: every rank's host and GPU, through the base collective.
  std::vector<CarRankInfo> all(W);
  {
    CarRankInfo& me = all[R];
    std::strncpy(me.host, CarHostIdentity().c_str(), sizeof me.host - 1);
    CAR_CHECK("DeviceGetPCIBusId", cudaDeviceGetPCIBusId(me.pci_bus, sizeof me.pci_bus, device));
    me.device = device;
    for (int q = 0; q < W; ++q) DS_RETURN_IF_ERROR(base->Broadcast(&all[q], sizeof(CarRankInfo), q));
  }
  std::string err;
  if (W > cuda::kCarMaxRanks) err = absl::StrCat(W, " ranks; at most ", cuda::kCarMaxRanks);
  if (err.empty()) err = CarCheckOneHost(all, R);
  for (int q = 0; q < W && err.empty(); ++q) {
    if (q == R) continue;
    int peer = -1;
    if (cudaDeviceGetByPCIBusId(&peer, all[q].pci_bus) != cudaSuccess) {
      cudaGetLastError();
      err = absl::StrCat("rank ", q, "'s GPU (", all[q].pci_bus,
                         ") is not visible in this process (CUDA_VISIBLE_DEVICES?)");
      break;
    }
    if (peer == device) continue;  // the same GPU: no P2P needed
    int can = 0;
    cudaDeviceCanAccessPeer(&can, device, peer);
    if (!can) err = absl::StrCat("GPU ", device, " cannot access rank ", q, "'s GPU ", peer, " (no P2P)");
  }
  DS_RETURN_IF_ERROR(Agree(*base, err, "the placement check"));

  // 2. This rank's region, zeroed before anyone can see it; its IPC handle to every rank.
  c->capacity_floats_ = std::max<size_t>(4, o.buffer_bytes / 16 * 4);
  const size_t region = kSignalBytes + c->capacity_floats_ * sizeof(float);
  std::vector<cudaIpcMemHandle_t> handles(W);
  if (cudaError_t e = cudaMalloc(&m.own, region); e != cudaSuccess)
    err = absl::StrCat("cudaMalloc of ", region, " bytes: ", cudaGetErrorString(e));
  else if ((e = cudaMemset(m.own, 0, kSignalBytes)) != cudaSuccess ||
           (e = cudaDeviceSynchronize()) != cudaSuccess)
    err = absl::StrCat("clearing the flags: ", cudaGetErrorString(e));
  else if ((e = cudaIpcGetMemHandle(&handles[R], m.own)) != cudaSuccess)
    err = absl::StrCat("cudaIpcGetMemHandle: ", cudaGetErrorString(e));
  if (!err.empty()) cudaGetLastError();
  DS_RETURN_IF_ERROR(Agree(*base, err, "exporting the IPC buffer"));
  for (int q = 0; q < W; ++q)
    DS_RETURN_IF_ERROR(base->Broadcast(&handles[q], sizeof(cudaIpcMemHandle_t), q));

  // 3. Open the peers' regions.
  for (int q = 0; q < W; ++q) {
    char* p = m.own;
    if (q != R) {
      void* v = nullptr;
      if (cudaError_t e = cudaIpcOpenMemHandle(&v, handles[q], cudaIpcMemLazyEnablePeerAccess);
          e != cudaSuccess) {
        cudaGetLastError();
        err = absl::StrCat("cudaIpcOpenMemHandle of rank ", q, "'s buffer: ", cudaGetErrorString(e));
        break;
      }
      p = static_cast<char*>(v);
      m.opened.push_back(p);
    }
    m.g.sig[q] = reinterpret_cast<cuda::CarSignal*>(p);
    m.g.buf[q] = reinterpret_cast<float*>(p + kSignalBytes);
  }
  if (err.empty()) {
    if (cudaError_t e = cudaMalloc(&m.counters, cuda::kCarMaxBlocks * sizeof(uint32_t)); e != cudaSuccess)
      err = absl::StrCat("cudaMalloc counters: ", cudaGetErrorString(e));
    else if ((e = cudaMemset(m.counters, 0, cuda::kCarMaxBlocks * sizeof(uint32_t))) != cudaSuccess)
      err = absl::StrCat("cudaMemset counters: ", cudaGetErrorString(e));
    else if ((e = cudaHostAlloc(&m.error_host, sizeof(uint32_t), cudaHostAllocMapped)) != cudaSuccess)
      err = absl::StrCat("cudaHostAlloc: ", cudaGetErrorString(e));
    else if ((e = cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking)) != cudaSuccess)
      err = absl::StrCat("cudaStreamCreate: ", cudaGetErrorString(e));
    else if ((e = cudaDeviceSynchronize()) != cudaSuccess)
      err = absl::StrCat("cudaDeviceSynchronize: ", cudaGetErrorString(e));
  }
  if (!err.empty()) cudaGetLastError();
  c->base_ = std::move(base);
  DS_RETURN_IF_ERROR(Agree(*c->base_, err, "opening the peers' IPC buffers"));
  *m.error_host = 0;
  uint32_t* error_dev = nullptr;
  CAR_CHECK("HostGetDevicePointer",
            cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_dev), m.error_host, 0));
  m.g.counters = m.counters;
  m.g.error = error_dev;
  m.g.timeout_ns = static_cast<uint64_t>(o.peer_timeout_seconds * 1e9);
  m.g.rank = R;
  m.g.world = W;
  // Nobody launches a kernel before every rank has opened every buffer.
  DS_RETURN_IF_ERROR(c->base_->Barrier());
  return c;
}

CustomAllReduceCollective::~CustomAllReduceCollective() {
  if (!impl_) return;
  Impl& m = *impl_;
  cudaSetDevice(m.device);
  if (m.stream) cudaStreamSynchronize(m.stream);
  for (char* p : m.opened) cudaIpcCloseMemHandle(p);
  if (m.stream) cudaStreamDestroy(m.stream);
  cudaFree(m.counters);
  cudaFree(m.own);
  if (m.error_host) cudaFreeHost(m.error_host);
}

bool CustomAllReduceCollective::TwoShot(size_t n) const {
  return CarUseTwoShot(n * sizeof(float), world(), opts_);
}

absl::Status CustomAllReduceCollective::CheckPeers() {
  if (impl_->error_host && *reinterpret_cast<volatile uint32_t*>(impl_->error_host) != 0)
    return absl::UnavailableError(absl::StrCat(
        "custom all-reduce: a peer did not arrive within ", opts_.peer_timeout_seconds,
        " s (rank lost?); the group must be rebuilt"));
  return absl::OkStatus();
}

absl::Status CustomAllReduceCollective::AllReduceSumOnStream(float* data, size_t n, void* stream) {
  if (world() == 1 || n == 0) return absl::OkStatus();
  const bool two = TwoShot(n);  // by the whole message: every chunk of it runs the same way
  for (const auto& [off, cnt] : CarChunks(n, capacity_floats_))
    DS_RETURN_IF_ERROR(cuda::LaunchCarAllReduce(impl_->g, data + off, cnt, two,
                                                static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::Status CustomAllReduceCollective::AllReduceRmsNormOnStream(const FusedNormArgs& a,
                                                                void* stream) {
  if (world() == 1) return absl::UnimplementedError("fused all-reduce + norm: world of one");
  if (a.rows <= 0 || a.n <= 0) return absl::OkStatus();
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (a.rows > cuda::kCarMaxBlocks || a.n % 32 != 0 ||
      static_cast<size_t>(a.rows) * a.n > capacity_floats_ || !aligned(a.h) || !aligned(a.w) ||
      !aligned(a.out) || (a.xq && (!a.xd || reinterpret_cast<uintptr_t>(a.xq) % 8 != 0)))
    return absl::UnimplementedError("fused all-reduce + norm: shape or alignment not supported");
  return cuda::LaunchCarAllReduceRmsNorm(impl_->g, a.h, a.rows, a.n, a.w, a.eps, a.out, a.xq,
                                         a.xd, static_cast<cudaStream_t>(stream));
}

absl::Status CustomAllReduceCollective::AllReduceSum(float* data, size_t n) {
  if (!IsDevicePointer(data)) return base_->AllReduceSum(data, n);
  DS_RETURN_IF_ERROR(AllReduceSumOnStream(data, n, impl_->stream));
  CAR_CHECK("StreamSynchronize", cudaStreamSynchronize(impl_->stream));
  return CheckPeers();
}

absl::Status CustomAllReduceCollective::AllGather(const float* in, size_t n, float* out) {
  std::vector<size_t> counts(world(), n);
  return AllGatherV(in, counts, out);
}

absl::Status CustomAllReduceCollective::AllGatherV(const float* in, std::span<const size_t> counts,
                                                   float* out) {
  const int W = world();
  if (static_cast<int>(counts.size()) != W)
    return absl::InvalidArgumentError(absl::StrCat("AllGatherV: ", counts.size(), " counts for ", W, " ranks"));
  // Both sides in device memory, or the base collective does it (it stages what it must).
  if (!IsDevicePointer(out) || (counts[rank()] > 0 && !IsDevicePointer(in)))
    return base_->AllGatherV(in, counts, out);
  size_t offsets[cuda::kCarMaxRanks] = {}, max_count = 0;
  for (int q = 0; q < W; ++q) {
    offsets[q] = q == 0 ? 0 : offsets[q - 1] + counts[q - 1];
    max_count = std::max(max_count, counts[q]);
  }
  // Windows of capacity floats over every rank's contribution.
  for (size_t w0 = 0; w0 < max_count; w0 += capacity_floats_) {
    size_t c[cuda::kCarMaxRanks] = {}, o[cuda::kCarMaxRanks] = {};
    for (int q = 0; q < W; ++q) {
      c[q] = counts[q] > w0 ? std::min(capacity_floats_, counts[q] - w0) : 0;
      o[q] = offsets[q] + w0;
    }
    DS_RETURN_IF_ERROR(cuda::LaunchCarAllGatherV(impl_->g, in + std::min(w0, counts[rank()]), c, o,
                                                 out, impl_->stream));
  }
  CAR_CHECK("StreamSynchronize", cudaStreamSynchronize(impl_->stream));
  return CheckPeers();
}

absl::Status CustomAllReduceCollective::Broadcast(void* data, size_t bytes, int root) {
  return base_->Broadcast(data, bytes, root);
}

absl::Status CustomAllReduceCollective::Barrier() { return base_->Barrier(); }

}  // namespace ds
