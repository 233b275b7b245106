#include "worker/process/tp_session.h"

#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "deltaserve/internal/cluster.grpc.pb.h"
#include "common/collective/host_staged_collective.h"
#include "worker/tp/plan.h"
#if defined(DS_HAVE_NCCL) || defined(DS_HAVE_CUDA_STAGING)
#include <cuda_runtime_api.h>
#endif
#ifdef DS_HAVE_NCCL
#include "common/collective/nccl_collective.h"
#endif

namespace ds::worker {
namespace {

namespace pb = deltaserve::internal;
using Clock = std::chrono::steady_clock;

// Free memory in GiB for `--split mem`: the device's on CUDA, MemAvailable on CPU.
double FreeGiB(bool cuda, int device) {
#if defined(DS_HAVE_NCCL) || defined(DS_HAVE_CUDA_STAGING)
  if (cuda) {
    size_t free_b = 0, total = 0;
    if (cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&free_b, &total) == cudaSuccess)
      return static_cast<double>(free_b) / (1 << 30);
  }
#endif
  (void)cuda;
  (void)device;
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (f >> key >> kb) {
    if (key == "MemAvailable:") return kb / 1048576.0;
    f.ignore(256, '\n');
  }
  return 1.0;
}

}  // namespace

struct SchedulerRendezvousStore::Impl {
  std::unique_ptr<pb::Scheduler::Stub> stub;
};

SchedulerRendezvousStore::SchedulerRendezvousStore(std::shared_ptr<grpc::Channel> channel)
    : impl_(std::make_unique<Impl>()) {
  impl_->stub = pb::Scheduler::NewStub(std::move(channel));
}
SchedulerRendezvousStore::~SchedulerRendezvousStore() = default;

absl::Status SchedulerRendezvousStore::Set(const std::string& key, const std::vector<char>& value) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::RendezvousSetRequest req;
  req.set_key(key);
  req.set_value(std::string(value.begin(), value.end()));
  pb::RendezvousSetResponse resp;
  grpc::Status s = impl_->stub->RendezvousSet(&ctx, req, &resp);
  if (!s.ok())
    return absl::UnavailableError(
        absl::StrCat("rendezvous set '", key, "' at the scheduler: ", s.error_message()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<char>> SchedulerRendezvousStore::Get(const std::string& key,
                                                                std::chrono::milliseconds timeout) {
  const auto give_up = Clock::now() + timeout;
  while (true) {
    // The scheduler waits at most 10 s per call; ask for what is left of ours, then retry.
    const double left = std::chrono::duration<double>(give_up - Clock::now()).count();
    grpc::ClientContext ctx;
    ctx.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(std::max(left, 0.0) * 1e3) + 2000));
    pb::RendezvousGetRequest req;
    req.set_key(key);
    req.set_wait_seconds(std::max(0.0, left));
    pb::RendezvousGetResponse resp;
    grpc::Status s = impl_->stub->RendezvousGet(&ctx, req, &resp);
    if (s.ok()) return std::vector<char>(resp.value().begin(), resp.value().end());
    if (s.error_code() != grpc::StatusCode::NOT_FOUND)
      return absl::UnavailableError(
          absl::StrCat("rendezvous get '", key, "' at the scheduler: ", s.error_message()));
    if (Clock::now() >= give_up)
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous key '", key, "' not set within ", timeout.count(), " ms"));
  }
}

absl::StatusOr<std::string> ResolveTpCollective(const std::string& requested, bool cuda_backend) {
#ifdef DS_HAVE_NCCL
  constexpr bool kNccl = true;
#else
  constexpr bool kNccl = false;
#endif
#ifdef DS_HAVE_CUDA_STAGING
  constexpr bool kStaged = true;
#else
  constexpr bool kStaged = false;
#endif
  if (requested != "auto" && requested != "gloo" && requested != "nccl")
    return absl::InvalidArgumentError("--tp-collective expects auto, gloo or nccl, got '" +
                                      requested + "'");
  if (!cuda_backend) {
    if (requested == "nccl")
      return absl::InvalidArgumentError("--tp-collective nccl needs --backend cuda");
    return std::string("gloo");
  }
  if (requested == "nccl" || (requested == "auto" && kNccl)) {
    if (!kNccl)
      return absl::UnimplementedError(
          "--tp-collective nccl: this build has no NCCL (use --tp-collective gloo)");
    return std::string("nccl");
  }
  if (!kStaged)
    return absl::UnimplementedError(
        "--tp-collective gloo with --backend cuda needs a build with CUDA (HostStagedCollective)");
  return std::string("staged-gloo");
}

absl::StatusOr<TpGroup> JoinTpGroup(const TpOptions& o, const std::string& collective, int device,
                                    const std::string& prefix,
                                    std::shared_ptr<grpc::Channel> scheduler) {
  if (prefix.empty())
    return absl::FailedPreconditionError(
        "the scheduler sent no tp_prefix in Configure (scheduler too old for tensor parallelism?)");
  if (collective != "gloo" && collective != "nccl" && collective != "staged-gloo")
    return absl::InvalidArgumentError("unknown TP collective '" + collective + "'");
  TpGroup g;
  SchedulerRendezvousStore store(std::move(scheduler));
  if (collective == "nccl") {
#ifdef DS_HAVE_NCCL
    // NCCL: rank 0 makes the unique id; it travels through the scheduler's store.
    NcclId id{};
    const std::string key = prefix + "nccl_id";
    if (o.rank == 0) {
      DS_ASSIGN_OR_RETURN(id, NcclCollective::NewUniqueId());
      DS_RETURN_IF_ERROR(store.Set(key, std::vector<char>(id.begin(), id.end())));
    } else {
      DS_ASSIGN_OR_RETURN(std::vector<char> v, store.Get(key, o.timeout));
      if (v.size() != id.size())
        return absl::DataLossError(absl::StrCat("nccl_id has ", v.size(), " bytes"));
      std::copy(v.begin(), v.end(), id.begin());
    }
    DS_ASSIGN_OR_RETURN(g.collective, NcclCollective::Create(o.rank, o.world, id, device));
#else
    return absl::UnimplementedError(
        "tensor parallelism on CUDA needs a build with NCCL (NcclCollective)");
#endif
  } else {
    GlooOptions go;
    go.rank = o.rank;
    go.world = o.world;
    go.store = &store;
    go.prefix = prefix + "gloo";
    go.iface = o.iface;
    go.timeout = o.timeout;
    DS_ASSIGN_OR_RETURN(g.collective, GlooCollective::Create(go));
    if (collective == "staged-gloo") {
#ifdef DS_HAVE_CUDA_STAGING
      DS_ASSIGN_OR_RETURN(std::unique_ptr<StagingDevice> dev, NewCudaStagingDevice(device));
      g.collective = std::make_unique<HostStagedCollective>(std::move(g.collective), std::move(dev));
#else
      return absl::UnimplementedError("staged-gloo: this build has no CUDA (HostStagedCollective)");
#endif
    }
  }
  if (o.split == "mem") {
    // Every rank derives the same plan from every rank's free memory, exchanged through the
    // store (not the collective: NCCL would want device buffers for it).
    const std::string mine = absl::StrCat(FreeGiB(collective != "gloo", device));
    DS_RETURN_IF_ERROR(store.Set(absl::StrCat(prefix, "free/", o.rank),
                                 std::vector<char>(mine.begin(), mine.end())));
    std::vector<double> all(o.world, 0.0);
    for (int r = 0; r < o.world; ++r) {
      DS_ASSIGN_OR_RETURN(std::vector<char> v,
                          store.Get(absl::StrCat(prefix, "free/", r), o.timeout));
      all[r] = std::strtod(std::string(v.begin(), v.end()).c_str(), nullptr);
    }
    g.split = tp::SplitFromFreeBytes(all);
  } else if (!o.split.empty()) {
    DS_ASSIGN_OR_RETURN(g.split, tp::ParseSplit(o.split));
    if (static_cast<int>(g.split.size()) != o.world)
      return absl::InvalidArgumentError(absl::StrCat("--split ", o.split, " has ", g.split.size(),
                                                     " weights for --tp-world ", o.world));
  }
  return g;
}

}  // namespace ds::worker
