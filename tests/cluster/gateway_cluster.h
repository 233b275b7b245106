// The gateway end-to-end rig shared by gateway_test and hardening_test: real `deltaserve
// scheduler`, `worker` and `gateway` processes on loopback (free ports through port files) with the
// tiny synthesized model, and a streamed-Generate helper. Header-only: each test binary has one
// translation unit. Needs DS_DELTASERVE_BIN (the built `deltaserve`).
#pragma once
#include <nlohmann/json.hpp>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "deltaserve/v1/deltaserve.grpc.pb.h"
#include "gateway/client.h"
#include "tests/cluster/cluster_test_util.h"

namespace ds::cluster_test {

namespace v1 = deltaserve::v1;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The built `deltaserve`; DS_DELTASERVE_BIN in the environment overrides it (carried binaries on
// the device machine).
inline const std::string kBin = [] {
  const char* b = std::getenv("DS_DELTASERVE_BIN");
  return std::string(b && *b ? b : DS_DELTASERVE_BIN);
}();

struct Proc {
  std::string role;
  pid_t pid = -1;
  std::string log;
};

inline Proc Spawn(const std::string& role, std::vector<std::string> args, const std::string& log) {
  Proc p{role, -1, log};
  args.insert(args.begin(), {kBin, role});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  p.pid = fork();
  if (p.pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    execv(kBin.c_str(), argv.data());
    _exit(127);
  }
  return p;
}

inline std::string WaitFile(const std::string& path, pid_t pid, std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    std::string s = ReadFile(path);
    if (!s.empty()) return s;
    if (!Alive(pid)) return "";
    std::this_thread::sleep_for(10ms);
  }
  return "";
}

// The model and worker backend of the rig: the tiny model on the CPU, or what DS_CLUSTER_MODEL /
// DS_CLUSTER_BACKEND name (the device machine runs the replica tests on the 27B file and CUDA).
inline std::string ClusterModel() {
  const char* m = std::getenv("DS_CLUSTER_MODEL");
  return m && *m ? std::string(m) : TinyModel();
}
inline std::vector<std::string> ClusterBackendArgs() {
  const char* b = std::getenv("DS_CLUSTER_BACKEND");
  if (b && *b && std::string(b) != "cpu") return {"--backend", b};
  return {"--backend", "cpu", "--threads", "1"};
}
// DS_CLUSTER_GPUS="0,1" (unset: nothing, every worker on its backend's default device): the n-th
// worker a Cluster starts gets `--device` of entry n modulo the list, so replicas land on distinct
// GPUs (tools/device/two_gpu_run.sh: one replica per card).
inline std::vector<std::string> ClusterDeviceArgs(int n) {
  const char* g = std::getenv("DS_CLUSTER_GPUS");
  if (!g || !*g) return {};
  std::vector<std::string> gpus;
  std::stringstream ss(g);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) gpus.push_back(x);
  if (gpus.empty()) return {};
  return {"--device", gpus[static_cast<size_t>(n) % gpus.size()]};
}

struct ClusterOptions {
  int slots = 4;
  int ctx = 4096;
  std::string split = "pool";
  int max_inflight = 64;
  bool start_worker = true;
  std::vector<std::string> scheduler_args = {};  // extra flags of each role
  std::vector<std::string> worker_args = {};
  std::vector<std::string> gateway_args = {};
  std::string model = {};  // empty: ClusterModel()
};

// Result of one streamed Generate.
struct GenResult {
  grpc::Status status;
  bool started = false;
  std::vector<int32_t> ids;
  std::string text;
  int n_chunks = 0;
  int n_logprobs = 0;
  bool finished = false;
  v1::GenerateResponse::Finished fin;
  double seconds = 0;
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions o) : o_(o) {
    static int n = 0;
    dir_ = TestDir() + "/cluster" + std::to_string(n++);
    std::filesystem::create_directories(dir_);
    const std::string sched_pf = dir_ + "/sched.port";
    std::vector<std::string> sargs = {"--listen", "127.0.0.1:0", "--port-file", sched_pf,
                                      "--slots", std::to_string(o.slots), "--ctx",
                                      std::to_string(o.ctx), "--split", o.split,
                                      "--log-interval", "0"};
    sargs.insert(sargs.end(), o.scheduler_args.begin(), o.scheduler_args.end());
    procs_.push_back(Spawn("scheduler", sargs, dir_ + "/scheduler.log"));
    const std::string sp = WaitFile(sched_pf, procs_[0].pid, 20s);
    EXPECT_FALSE(sp.empty()) << "scheduler did not start";
    sched_addr_ = "127.0.0.1:" + std::to_string(std::atoi(sp.c_str()));
    if (o.start_worker) StartWorker();
    gateway_ = StartGateway(o.max_inflight);
  }

  ~Cluster() {
    for (Proc& p : procs_)
      if (p.pid > 0) kill(p.pid, SIGTERM);
    const auto end = Clock::now() + 5s;
    for (Proc& p : procs_) {
      while (p.pid > 0 && Alive(p.pid) && Clock::now() < end) std::this_thread::sleep_for(10ms);
      if (p.pid > 0 && Alive(p.pid)) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
      }
    }
    if (::testing::Test::HasFailure())
      for (Proc& p : procs_)
        std::fprintf(stderr, "----- %s log -----\n%s\n", p.role.c_str(), ReadFile(p.log).c_str());
  }

  std::string model() const { return o_.model.empty() ? ClusterModel() : o_.model; }

  // Starts one more worker (a replica of its own); returns its pid.
  pid_t StartWorker() {
    std::vector<std::string> wargs = {"--scheduler", sched_addr_, "--model", model()};
    for (const std::string& a : ClusterBackendArgs()) wargs.push_back(a);
    for (const std::string& a : ClusterDeviceArgs(n_workers_)) wargs.push_back(a);
    wargs.insert(wargs.end(), o_.worker_args.begin(), o_.worker_args.end());
    const int n = n_workers_++;
    procs_.push_back(
        Spawn("worker", wargs, dir_ + (n == 0 ? "/worker.log" : "/worker" + std::to_string(n) + ".log")));
    worker_pid_ = procs_.back().pid;
    return worker_pid_;
  }

  // A gateway on free ports; returns {public addr, admin addr}.
  std::pair<std::string, std::string> StartGateway(int max_inflight) {
    static int g = 0;
    const std::string pf = dir_ + "/gw" + std::to_string(g) + ".port";
    std::vector<std::string> gargs = {
        "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--scheduler", sched_addr_,
        "--model", model(), "--max-inflight", std::to_string(max_inflight), "--port-file", pf,
        "--health-interval-ms", "200"};
    gargs.insert(gargs.end(), o_.gateway_args.begin(), o_.gateway_args.end());
    procs_.push_back(Spawn("gateway", gargs, dir_ + "/gateway" + std::to_string(g++) + ".log"));
    std::istringstream in(WaitFile(pf, procs_.back().pid, 20s));
    int port = 0, admin = 0;
    in >> port >> admin;
    EXPECT_GT(port, 0);
    return {"127.0.0.1:" + std::to_string(port), "127.0.0.1:" + std::to_string(admin)};
  }

  const std::string& addr() const { return gateway_.first; }
  const std::string& admin_addr() const { return gateway_.second; }
  pid_t worker_pid() const { return worker_pid_; }
  const std::string& scheduler_addr() const { return sched_addr_; }
  const std::string& dir() const { return dir_; }
  pid_t Pid(const std::string& role) const {
    for (const Proc& p : procs_)
      if (p.role == role) return p.pid;
    return -1;
  }
  // The log of the first process of `role` ("scheduler", "gateway", ...).
  std::string Log(const std::string& role) const {
    for (const Proc& p : procs_)
      if (p.role == role) return ReadFile(p.log);
    return "";
  }

  gw::Health Health(const std::string& addr = "") {
    auto ch = gw::MakeChannel(addr.empty() ? this->addr() : addr);
    return gw::CheckHealth(ch.get(), 1s);
  }
  bool WaitHealth(gw::Health want, std::chrono::milliseconds timeout,
                  const std::string& addr = "") {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      if (Health(addr) == want) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  v1::ClusterStatus Status() {
    auto stub = v1::Admin::NewStub(gw::MakeChannel(admin_addr()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    v1::ClusterStatus st;
    grpc::Status s = stub->GetClusterStatus(&ctx, {}, &st);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return st;
  }

  static GenResult Generate(const std::string& addr, const v1::GenerateRequest& req,
                            std::chrono::milliseconds deadline = 60s,
                            std::function<bool(const GenResult&)> cancel_when = nullptr) {
    auto stub = v1::Generation::NewStub(gw::MakeChannel(addr));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    GenResult r;
    const auto t0 = Clock::now();
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse m;
    bool cancelled = false;
    while (reader->Read(&m)) {
      if (m.has_started()) r.started = true;
      if (m.has_chunk()) {
        ++r.n_chunks;
        r.text += m.chunk().text();
        r.ids.insert(r.ids.end(), m.chunk().token_ids().begin(), m.chunk().token_ids().end());
        r.n_logprobs += m.chunk().logprobs_size();
      }
      if (m.has_finished()) {
        r.finished = true;
        r.fin = m.finished();
      }
      if (!cancelled && cancel_when && cancel_when(r)) {
        ctx.TryCancel();
        cancelled = true;
      }
    }
    r.status = reader->Finish();
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
  }
  GenResult Generate(const v1::GenerateRequest& req, std::chrono::milliseconds deadline = 60s) {
    return Generate(addr(), req, deadline);
  }

 private:
  ClusterOptions o_;
  std::string dir_;
  std::string sched_addr_;
  std::vector<Proc> procs_;
  pid_t worker_pid_ = -1;
  int n_workers_ = 0;
  std::pair<std::string, std::string> gateway_;
};

inline v1::GenerateRequest IdsRequest(std::vector<int32_t> ids, uint32_t max_tokens,
                               bool ignore_eos = true) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(ignore_eos);
  return r;
}

// Greedy tokens of single-process `deltaserve generate` for these prompt ids on the cluster's
// backend (the reference a cluster run must reproduce).
inline std::vector<int32_t> GenerateTokens(const std::string& model,
                                           const std::vector<int32_t>& prompt, int max_tokens) {
  std::string ids, backend;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  for (const std::string& a : ClusterBackendArgs()) backend += " " + a;
  const std::string cmd = kBin + " generate --model " + model + " --prompt-ids " + ids +
                          " --max-tokens " + std::to_string(max_tokens) + backend +
                          " --json --ignore-eos 2>/dev/null";
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return {};
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), f)) out.append(buf, n);
  EXPECT_EQ(pclose(f), 0) << cmd;
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  return j.is_object() ? j["tokens"].get<std::vector<int32_t>>() : std::vector<int32_t>{};
}

inline const std::vector<int32_t> kPrompt = {72, 101, 108, 108, 111, 44, 32, 100, 101, 108, 116, 97};

}  // namespace ds::cluster_test
