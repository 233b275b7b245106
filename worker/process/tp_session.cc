#include "worker/process/tp_session.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "deltaserve/internal/cluster.grpc.pb.h"
#include "common/collective/host_staged_collective.h"
#include "common/log/log.h"
#include "worker/tp/plan.h"
#ifdef DS_HAVE_CUSTOM_ALLREDUCE
#include "common/collective/custom_allreduce.h"
#endif
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
  return tp::HostMemAvailableGiB();
}

}  // namespace

absl::StatusOr<std::string> LocalAddressToward(const std::string& target) {
  std::string t = target;
  if (t.rfind("unix:", 0) == 0 || t.rfind("unix-abstract:", 0) == 0)
    return std::string("127.0.0.1");
  for (const char* scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"})
    if (t.rfind(scheme, 0) == 0) {
      t = t.substr(std::string(scheme).size());
      break;
    }
  t = t.substr(0, t.find(','));  // ipv4:a:p,b:p lists: the first
  std::string host, port;
  if (!t.empty() && t[0] == '[') {
    const size_t close = t.find(']');
    if (close == std::string::npos)
      return absl::InvalidArgumentError("scheduler address '" + target + "': no ']'");
    host = t.substr(1, close - 1);
    if (close + 1 < t.size() && t[close + 1] == ':') port = t.substr(close + 2);
  } else {
    const size_t colon = t.rfind(':');
    host = colon == std::string::npos ? t : t.substr(0, colon);
    if (colon != std::string::npos) port = t.substr(colon + 1);
  }
  if (host.empty())
    return absl::InvalidArgumentError("scheduler address '" + target + "' has no host");
  if (port.empty()) port = "443";  // only the routing decision matters, not the port
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); e != 0)
    return absl::UnavailableError(
        absl::StrCat("cannot resolve scheduler host '", host, "': ", gai_strerror(e)));
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    const bool ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
                    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    if (!ok) why = std::strerror(errno);
    close(fd);
    if (!ok) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (local.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&local);
      inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
      if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) {
        freeaddrinfo(res);
        return std::string("127.0.0.1");
      }
    } else {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&local);
      if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) {
        freeaddrinfo(res);
        return std::string("127.0.0.1");
      }
      inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    }
    freeaddrinfo(res);
    return std::string(buf);
  }
  freeaddrinfo(res);
  return absl::UnavailableError(
      absl::StrCat("no route from this host to the scheduler '", host, "': ", why));
}

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
#ifdef DS_HAVE_CUSTOM_ALLREDUCE
  constexpr bool kCustom = true;
#else
  constexpr bool kCustom = false;
#endif
  if (requested != "auto" && requested != "gloo" && requested != "nccl" && requested != "custom")
    return absl::InvalidArgumentError("--tp-collective expects auto, gloo, nccl or custom, got '" +
                                      requested + "'");
  if (!cuda_backend) {
    if (requested == "nccl" || requested == "custom")
      return absl::InvalidArgumentError("--tp-collective " + requested + " needs --backend cuda");
    return std::string("gloo");
  }
  // CUDA: the IPC all-reduce first (ranks on one host; JoinTpGroup falls back for auto), then
  // NCCL, then Gloo staged through the host.
  if (requested == "custom" || (requested == "auto" && kCustom)) {
    if (!kCustom)
      return absl::UnimplementedError(
          "--tp-collective custom: this build has no CUDA (CustomAllReduceCollective)");
    return std::string(requested == "auto" ? "auto-custom" : "custom");
  }
  if (requested == "nccl" || (requested == "auto" && kNccl)) {
    if (!kNccl)
      return absl::UnimplementedError(
          "--tp-collective nccl: this build has no NCCL (use --tp-collective gloo or custom)");
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
  if (collective != "gloo" && collective != "nccl" && collective != "staged-gloo" &&
      collective != "custom" && collective != "auto-custom")
    return absl::InvalidArgumentError("unknown TP collective '" + collective + "'");
  TpGroup g;
  SchedulerRendezvousStore store(std::move(scheduler));
  auto make_nccl = [&]() -> absl::StatusOr<std::unique_ptr<Collective>> {
#ifdef DS_HAVE_NCCL
    // NCCL finds its interface itself (IB/RoCE first, then non-loopback sockets); --tp-iface
    // pins it unless the operator's environment already does. Set before the unique id: rank
    // 0's bootstrap address is part of it.
    if (!o.iface.empty()) setenv("NCCL_SOCKET_IFNAME", o.iface.c_str(), /*overwrite=*/0);
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
    DS_ASSIGN_OR_RETURN(std::unique_ptr<NcclCollective> n,
                        NcclCollective::Create(o.rank, o.world, id, device));
    return std::unique_ptr<Collective>(std::move(n));
#else
    return absl::UnimplementedError(
        "tensor parallelism over NCCL needs a build with NCCL (NcclCollective)");
#endif
  };
  // The Gloo mesh (CPU), wrapped for device buffers when `staged`.
  auto make_gloo = [&](const std::string& key, bool staged)
      -> absl::StatusOr<std::unique_ptr<Collective>> {
    GlooOptions go;
    go.rank = o.rank;
    go.world = o.world;
    go.store = &store;
    go.prefix = prefix + key;
    go.iface = o.iface;
    go.hostname = o.addr;
    go.timeout = o.timeout;
    DS_ASSIGN_OR_RETURN(std::unique_ptr<GlooCollective> gl, GlooCollective::Create(go));
    std::unique_ptr<Collective> c = std::move(gl);
    if (staged) {
#ifdef DS_HAVE_CUDA_STAGING
      DS_ASSIGN_OR_RETURN(std::unique_ptr<StagingDevice> dev, NewCudaStagingDevice(device));
      c = std::make_unique<HostStagedCollective>(std::move(c), std::move(dev));
#else
      return absl::UnimplementedError("staged-gloo: this build has no CUDA (HostStagedCollective)");
#endif
    }
    return c;
  };
  if (collective == "nccl") {
    DS_ASSIGN_OR_RETURN(g.collective, make_nccl());
  } else if (collective == "custom" || collective == "auto-custom") {
#ifdef DS_HAVE_CUSTOM_ALLREDUCE
    // The IPC handles travel over the Gloo mesh (met through the scheduler's store), which
    // also keeps Broadcast / Barrier and host buffers.
    DS_ASSIGN_OR_RETURN(std::unique_ptr<Collective> base, make_gloo("gloo", true));
    CustomAllReduceOptions co;
    co.peer_timeout_seconds = std::chrono::duration<double>(o.timeout).count();
    auto car = CustomAllReduceCollective::Create(std::move(base), device, co);
    if (car.ok()) {
      g.collective = std::move(*car);
    } else if (collective == "auto-custom" &&
               car.status().code() == absl::StatusCode::kFailedPrecondition) {
      // Every rank got the same answer (the ranks agree inside Create), so all fall back alike:
      // NCCL when built (ranks on several hosts, no P2P), else Gloo staged through the host.
      DS_LOG(WARNING, "tp_custom_allreduce_unavailable",
             {{"reason", std::string(car.status().message())}});
#ifdef DS_HAVE_NCCL
      DS_ASSIGN_OR_RETURN(g.collective, make_nccl());
#else
      DS_ASSIGN_OR_RETURN(g.collective, make_gloo("gloo-fallback", true));
#endif
    } else {
      return car.status();
    }
#else
    return absl::UnimplementedError("--tp-collective custom: this build has no CUDA");
#endif
  } else {
    DS_ASSIGN_OR_RETURN(g.collective, make_gloo("gloo", collective == "staged-gloo"));
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
