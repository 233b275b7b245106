// bench --tp N (see bench_tp.h).
#include "tools/bench/bench_tp.h"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/collective/custom_allreduce.h"
#include "common/collective/gloo_collective.h"
#include "common/collective/host_staged_collective.h"
#ifdef DS_HAVE_NCCL
#include "common/collective/nccl_collective.h"
#endif

extern char** environ;

namespace ds {

int RunBenchTpParent(const BenchOptions& o, int argc, char** argv) {
  if (!o.gpus.empty() && static_cast<int>(o.gpus.size()) != o.tp) {
    std::fprintf(stderr, "bench: --gpus lists %zu GPUs for --tp %d\n", o.gpus.size(), o.tp);
    return 1;
  }
  int n_dev = 0;
  cudaGetDeviceCount(&n_dev);
  for (int r = 0; r < o.tp; ++r) {
    const int g = o.gpus.empty() ? r : o.gpus[r];
    if (g < 0 || g >= n_dev) {
      std::fprintf(stderr,
                   "bench: rank %d wants GPU %d but this machine has %d (use --gpus, e.g. --gpus "
                   "0,0 to put every rank on GPU 0)\n", r, g, n_dev);
      return 1;
    }
  }
  char tmpl[] = "/tmp/ds_bench_tp_XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("bench: mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  const std::string exe = std::filesystem::canonical("/proc/self/exe").string();
  std::vector<pid_t> pids;
  for (int r = 0; r < o.tp; ++r) {
    std::vector<std::string> args = {exe, "bench"};
    for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
    args.insert(args.end(), {"--tp-rank", std::to_string(r), "--tp-store", dir + "/store",
                             "--device", std::to_string(o.gpus.empty() ? r : o.gpus[r])});
    std::vector<char*> cargv;
    for (auto& s : args) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = absl::StrCat(dir, "/rank", r, ".log");
    if (r > 0) {
      posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    pid_t pid = -1;
    if (posix_spawn(&pid, exe.c_str(), &fa, nullptr, cargv.data(), environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    pids.push_back(pid);
  }
  int rc = 0;
  for (int r = 0; r < o.tp; ++r) {
    int st = 0;
    const bool ok = pids[r] > 0 && waitpid(pids[r], &st, 0) == pids[r] && WIFEXITED(st) &&
                    WEXITSTATUS(st) == 0;
    if (!ok) {
      rc = 1;
      std::fprintf(stderr, "bench: rank %d failed", r);
      if (r > 0) {
        std::ifstream f(absl::StrCat(dir, "/rank", r, ".log"));
        std::string line, tail[8];
        int n = 0;
        while (std::getline(f, line)) tail[n++ % 8] = line;
        std::fprintf(stderr, "; its last lines:\n");
        for (int k = std::max(0, n - 8); k < n; ++k) std::fprintf(stderr, "  %s\n", tail[k % 8].c_str());
      } else {
        std::fprintf(stderr, "\n");
      }
    }
  }
  if (rc == 0) std::filesystem::remove_all(dir);
  return rc;
}

absl::StatusOr<std::unique_ptr<Collective>> MakeBenchCollective(const BenchOptions& o) {
  GlooOptions go;
  go.rank = o.tp_rank;
  go.world = o.tp;
  go.store_dir = o.tp_store;
  go.prefix = "bench";
  go.timeout = std::chrono::seconds(300);  // rank 0 probes the bandwidth while the others load
  DS_ASSIGN_OR_RETURN(std::unique_ptr<GlooCollective> gloo, GlooCollective::Create(go));
  if (o.tp_collective == "nccl") {
#ifdef DS_HAVE_NCCL
    NcclId id{};
    if (o.tp_rank == 0) {
      DS_ASSIGN_OR_RETURN(id, NcclCollective::NewUniqueId());
    }
    DS_RETURN_IF_ERROR(gloo->Broadcast(id.data(), id.size(), 0));
    DS_ASSIGN_OR_RETURN(std::unique_ptr<NcclCollective> n,
                        NcclCollective::Create(o.tp_rank, o.tp, id, o.device));
    return std::unique_ptr<Collective>(std::move(n));
#else
    return absl::UnimplementedError("bench --tp-collective nccl: this build has no NCCL");
#endif
  }
  DS_ASSIGN_OR_RETURN(std::unique_ptr<StagingDevice> dev, NewCudaStagingDevice(o.device));
  std::unique_ptr<Collective> c =
      std::make_unique<HostStagedCollective>(std::move(gloo), std::move(dev));
  if (o.tp_collective == "staged") return c;
  if (o.tp_collective != "custom")
    return absl::InvalidArgumentError("bench: --tp-collective expects custom, staged or nccl, got '" +
                                      o.tp_collective + "'");
  DS_ASSIGN_OR_RETURN(std::unique_ptr<CustomAllReduceCollective> car,
                      CustomAllReduceCollective::Create(std::move(c), o.device));
  return std::unique_ptr<Collective>(std::move(car));
}

absl::StatusOr<AllReduceTiming> TimeAllReduce(Collective& c, int device, size_t n) {
  AllReduceTiming t;
  if (c.world() <= 1) return t;
  auto cuda = [](cudaError_t e, const char* what) -> absl::Status {
    return e == cudaSuccess ? absl::OkStatus()
                            : absl::InternalError(absl::StrCat("bench all-reduce: ", what, ": ",
                                                               cudaGetErrorString(e)));
  };
  DS_RETURN_IF_ERROR(cuda(cudaSetDevice(device), "SetDevice"));
  float* d = nullptr;
  cudaStream_t s = nullptr;
  DS_RETURN_IF_ERROR(cuda(cudaMalloc(&d, n * sizeof(float)), "Malloc"));
  DS_RETURN_IF_ERROR(cuda(cudaMemset(d, 0, n * sizeof(float)), "Memset"));
  DS_RETURN_IF_ERROR(cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "StreamCreate"));
  constexpr int kCalls = 100, kReps = 9;
  using Clock = std::chrono::steady_clock;
  std::vector<double> us;
  // Eager: kCalls back-to-back launches, one sync; every rank starts after a barrier.
  for (int rep = 0; rep < kReps; ++rep) {
    DS_RETURN_IF_ERROR(c.Barrier());
    const auto t0 = Clock::now();
    for (int k = 0; k < kCalls; ++k) DS_RETURN_IF_ERROR(c.AllReduceSumOnStream(d, n, s));
    DS_RETURN_IF_ERROR(cuda(cudaStreamSynchronize(s), "StreamSynchronize"));
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kCalls);
  }
  std::sort(us.begin(), us.end());
  t.eager_us = us[us.size() / 2];
  if (c.graph_capturable()) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    DS_RETURN_IF_ERROR(cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "BeginCapture"));
    for (int k = 0; k < kCalls; ++k) DS_RETURN_IF_ERROR(c.AllReduceSumOnStream(d, n, s));
    DS_RETURN_IF_ERROR(cuda(cudaStreamEndCapture(s, &g), "EndCapture"));
    DS_RETURN_IF_ERROR(cuda(cudaGraphInstantiate(&ge, g, 0), "GraphInstantiate"));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    us.clear();
    for (int rep = 0; rep < kReps; ++rep) {
      DS_RETURN_IF_ERROR(c.Barrier());
      cudaEventRecord(e0, s);
      DS_RETURN_IF_ERROR(cuda(cudaGraphLaunch(ge, s), "GraphLaunch"));
      cudaEventRecord(e1, s);
      DS_RETURN_IF_ERROR(cuda(cudaEventSynchronize(e1), "EventSynchronize"));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (rep > 0) us.push_back(1e3 * ms / kCalls);  // the first replay uploads the graph
    }
    std::sort(us.begin(), us.end());
    t.graph_us = us[us.size() / 2];
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  }
  cudaStreamDestroy(s);
  cudaFree(d);
  return t;
}

}  // namespace ds
