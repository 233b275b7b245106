// Cluster tests.
//  - Worker process units (TP collective choice, address toward the scheduler); the step
//    executor's own tests are in tests/worker.
//  - Real processes on loopback: `deltaserve scheduler` + `deltaserve worker` children with a tiny
//    synthesized model, a client calling Scheduler.Submit directly; outputs are compared with
//    single-process `deltaserve generate --json` (greedy).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deltaserve/internal/cluster.grpc.pb.h"
#include "tests/cluster/cluster_test_util.h"
#include "tools/synth/synth.h"
#include "worker/process/tp_session.h"

extern char** environ;

namespace ds {
namespace {

namespace pb = deltaserve::internal;
using cluster_test::CommandResult;
using cluster_test::Join;
using cluster_test::ReadFile;
using cluster_test::RunCommand;
namespace v1 = deltaserve::v1;
using namespace std::chrono_literals;

// ===================== worker process units =====================

// --tp-collective for a TP rank: Gloo on CPU; on CUDA NCCL by default (when built with it) and
// Gloo behind the host-staged adapter on request (several ranks on one GPU, docs/tp.md).
TEST(TpCollectiveChoice, FollowsTheBackend) {
  EXPECT_EQ(*worker::ResolveTpCollective("auto", false), "gloo");
  EXPECT_EQ(*worker::ResolveTpCollective("gloo", false), "gloo");
  EXPECT_EQ(worker::ResolveTpCollective("nccl", false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(worker::ResolveTpCollective("mpi", true).status().code(),
            absl::StatusCode::kInvalidArgument);
#ifdef DS_HAVE_CUDA_STAGING
  EXPECT_EQ(*worker::ResolveTpCollective("gloo", true), "staged-gloo");
#else
  EXPECT_EQ(worker::ResolveTpCollective("gloo", true).status().code(),
            absl::StatusCode::kUnimplemented);
#endif
  EXPECT_EQ(worker::ResolveTpCollective("custom", false).status().code(),
            absl::StatusCode::kInvalidArgument);
#ifdef DS_HAVE_CUSTOM_ALLREDUCE
  // CUDA ranks default to the IPC all-reduce (falling back when the group cannot use it).
  EXPECT_EQ(*worker::ResolveTpCollective("custom", true), "custom");
  EXPECT_EQ(*worker::ResolveTpCollective("auto", true), "auto-custom");
#else
  EXPECT_EQ(worker::ResolveTpCollective("custom", true).status().code(),
            absl::StatusCode::kUnimplemented);
#endif
#ifdef DS_HAVE_NCCL
  EXPECT_EQ(*worker::ResolveTpCollective("nccl", true), "nccl");
#ifndef DS_HAVE_CUSTOM_ALLREDUCE
  EXPECT_EQ(*worker::ResolveTpCollective("auto", true), "nccl");
#endif
#else
  EXPECT_EQ(worker::ResolveTpCollective("nccl", true).status().code(),
            absl::StatusCode::kUnimplemented);
#endif
}

// ===================== real processes =====================

// The built binary (CMake passes its path); DS_DELTASERVE_BIN in the environment overrides it when
// the tests run from a copied tree.
const char* const kBin = getenv("DS_DELTASERVE_BIN") ? getenv("DS_DELTASERVE_BIN") : DS_DELTASERVE_BIN;

struct Child {
  pid_t pid = -1;
  std::string log;
  void Kill(int sig = SIGKILL) {
    if (pid > 0) {
      kill(pid, sig);
      int st = 0;
      waitpid(pid, &st, 0);
      pid = -1;
    }
  }
  ~Child() { Kill(); }
};

std::unique_ptr<Child> Spawn(const std::vector<std::string>& args, const std::string& log,
                             const std::vector<std::string>& more = {}) {
  auto c = std::make_unique<Child>();
  c->log = log;
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  for (const auto& a : more) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // The child dies with the test binary, even when the binary itself is killed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execve(argv[0], argv.data(), environ);
    _exit(127);
  }
  c->pid = pid;
  return c;
}

// Greedy single-process reference: `deltaserve generate --json`.
std::vector<int32_t> Reference(const std::string& model, const std::vector<int32_t>& prompt,
                               int max_tokens) {
  const std::string cmd = std::string(kBin) + " generate --backend cpu --threads 1 --model " +
                          model + " --prompt-ids " + Join(prompt) + " --max-tokens " +
                          std::to_string(max_tokens) + " --temperature 0 --ignore-eos --json";
  const std::string out = RunCommand(cmd).output;
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("tokens")) {
    ADD_FAILURE() << "generate failed: " << cmd << "\n" << out;
    return {};
  }
  return j["tokens"].get<std::vector<int32_t>>();
}

struct Outcome {
  std::vector<int32_t> tokens;
  bool admitted = false;
  bool finished = false;
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  std::string error;
  grpc::Status status;
};

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 11 + 5) % 200 + 1);
  return p;
}

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::filesystem::temp_directory_path() /
                           ("ds_cluster_test_" + std::to_string(getpid())));
    std::filesystem::create_directories(*dir_);
    model_ = new std::string(*dir_ + "/tiny.gguf");
    SynthOptions o = SynthOptions::Tiny();
    o.n_threads = 1;
    absl::Status s = SynthesizeGguf(o, *model_);
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete model_;
  }
  void TearDown() override {
    if (worker_) worker_->Kill();
    if (sched_) sched_->Kill();
    if (HasFailure()) {
      if (sched_) std::fprintf(stderr, "--- scheduler log ---\n%s\n", ReadFile(sched_->log).c_str());
      if (worker_) std::fprintf(stderr, "--- worker log ---\n%s\n", ReadFile(worker_->log).c_str());
    }
  }

  // Starts the scheduler (on a free port it picks itself) and one CPU worker; waits until serving.
  // `token`: sent on the test's own calls (the scheduler runs with --internal-key-file).
  void StartCluster(std::vector<std::string> sched_flags,
                    std::vector<std::string> worker_flags = {}, std::string token = "") {
    token_ = std::move(token);
    const std::string tag = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const std::string port_file = *dir_ + "/" + tag + ".port";
    std::vector<std::string> args = {kBin, "scheduler", "--listen", "127.0.0.1:0", "--port-file",
                                     port_file, "--step-timeout", "60", "--log-interval", "0"};
    args.insert(args.end(), sched_flags.begin(), sched_flags.end());
    sched_ = Spawn(args, *dir_ + "/" + tag + ".scheduler.log");
    ASSERT_GT(sched_->pid, 0);
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (!std::filesystem::exists(port_file)) {
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "scheduler did not start";
      std::this_thread::sleep_for(20ms);
    }
    addr_ = "127.0.0.1:" + std::to_string(std::stoi(ReadFile(port_file)));
    worker_ = Spawn({kBin, "worker", "--scheduler", addr_, "--model", *model_, "--backend", "cpu",
                     "--threads", "1", "--worker-id", "w0"},
                    *dir_ + "/" + tag + ".worker.log", worker_flags);
    ASSERT_GT(worker_->pid, 0);
    channel_ = grpc::CreateChannel(addr_, grpc::InsecureChannelCredentials());
    stub_ = pb::Scheduler::NewStub(channel_);
    while (!Status().serving()) {
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "cluster never became serving";
      std::this_thread::sleep_for(50ms);
    }
  }

  v1::ClusterStatus Status(grpc::Status* status = nullptr) {
    grpc::ClientContext ctx;
    Auth(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    v1::ClusterStatus st;
    v1::GetClusterStatusRequest req;
    grpc::Status s = stub_->GetClusterStatus(&ctx, req, &st);
    if (status) *status = s;
    return st;
  }
  void Auth(grpc::ClientContext* ctx) {
    if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  }

  // Runs one Submit call to the end. `on_token` may cancel the context.
  Outcome Submit(uint64_t id, const std::vector<int32_t>& prompt, int max_tokens,
                 grpc::ClientContext* ctx = nullptr, std::atomic<int>* progress = nullptr) {
    grpc::ClientContext local;
    if (!ctx) ctx = &local;
    Auth(ctx);
    pb::SubmitRequest req;
    req.set_request_id(id);
    for (int32_t t : prompt) req.add_prompt_ids(t);
    req.set_max_tokens(static_cast<uint32_t>(max_tokens));
    req.mutable_sampling()->set_temperature(0);
    req.set_ignore_eos(true);
    auto reader = stub_->Submit(ctx, req);
    Outcome o;
    pb::RequestEvent ev;
    while (reader->Read(&ev)) {
      if (ev.has_admitted()) o.admitted = true;
      if (ev.has_token()) {
        o.tokens.push_back(ev.token().id());
        if (progress) progress->fetch_add(1);
      }
      if (ev.has_finished()) {
        o.finished = true;
        o.reason = ev.finished().reason();
        o.error = ev.finished().error();
      }
    }
    o.status = reader->Finish();
    return o;
  }

  static std::string* dir_;
  static std::string* model_;
  std::unique_ptr<Child> sched_, worker_;
  std::string addr_, token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Scheduler::Stub> stub_;
};
std::string* ClusterTest::dir_ = nullptr;
std::string* ClusterTest::model_ = nullptr;

TEST_F(ClusterTest, ConcurrentIdenticalGreedyRequestsMatchSingleProcess) {
  StartCluster({"--slots", "4", "--ctx", "1024"});
  const std::vector<int32_t> prompt = Prompt(12, 1);
  const int kTokens = 24;
  const std::vector<int32_t> ref = Reference(*model_, prompt, kTokens);
  ASSERT_EQ(ref.size(), static_cast<size_t>(kTokens));
  constexpr int kN = 4;
  std::vector<Outcome> out(kN);
  std::vector<std::thread> th;
  for (int i = 0; i < kN; ++i)
    th.emplace_back([&, i] { out[i] = Submit(100 + i, prompt, kTokens); });
  for (auto& t : th) t.join();
  for (int i = 0; i < kN; ++i) {
    EXPECT_TRUE(out[i].status.ok()) << out[i].status.error_message();
    EXPECT_TRUE(out[i].admitted);
    EXPECT_TRUE(out[i].finished);
    EXPECT_EQ(out[i].reason, v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(out[i].tokens, ref) << "request " << i;
  }
}

TEST_F(ClusterTest, MixedPromptsUnderChunkedPrefillMatchEachAlone) {
  // Small chunks and token budget: long prompts are prefilled over several steps, batched with
  // other sequences' decodes.
  StartCluster({"--slots", "4", "--ctx", "2048", "--max-chunk", "16", "--max-batch-tokens", "24"});
  const std::vector<std::pair<std::vector<int32_t>, int>> cases = {
      {Prompt(150, 2), 12}, {Prompt(3, 3), 20}, {Prompt(57, 4), 16}, {Prompt(1, 5), 10},
      {Prompt(33, 6), 18}};
  std::vector<std::vector<int32_t>> refs;
  for (const auto& [p, n] : cases) refs.push_back(Reference(*model_, p, n));
  std::vector<Outcome> out(cases.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < cases.size(); ++i)
    th.emplace_back([&, i] { out[i] = Submit(200 + i, cases[i].first, cases[i].second); });
  for (auto& t : th) t.join();
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE(out[i].status.ok()) << out[i].status.error_message();
    EXPECT_EQ(out[i].tokens, refs[i]) << "case " << i << " (prompt " << cases[i].first.size()
                                      << " tokens)";
  }
}

// Issue #23: the worker's paged KV pool bounds what the scheduler admits. The CPU worker gets 8
// slots (4 asked, 8 the CPU minimum) sharing 320 tokens in 16-token pages: the replica admits
// within 320 - 8 x 15 = 200 positions (one partial page per slot), not the 2048 of its policy, so
// requests whose reservations together outgrow the pool wait instead of failing, and every one
// completes with the tokens it gives alone.
TEST_F(ClusterTest, AdmissionsStayWithinTheWorkersKvPool) {
  StartCluster({"--slots", "4", "--ctx", "2048"}, {"--kv-pool-tokens", "320", "--kv-page", "16"});
  EXPECT_EQ(Status().context_total(), 200u);
  Outcome big = Submit(1, Prompt(150, 9), 100);  // 250 positions can never fit 200
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << big.status.error_message();
  const int kTokens = 40;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(Prompt(40 + 5 * i, 20 + i));  // 80-95 each
  std::vector<Outcome> out(prompts.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < prompts.size(); ++i)
    th.emplace_back([&, i] { out[i] = Submit(10 + i, prompts[i], kTokens); });
  for (auto& t : th) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(out[i].status.ok()) << out[i].status.error_message();
    EXPECT_EQ(out[i].reason, v1::FINISH_REASON_LENGTH) << out[i].error;
    EXPECT_EQ(out[i].tokens, Reference(*model_, prompts[i], kTokens)) << "request " << i;
  }
}

// Over-commit (issue #23): the scheduler reserves known tokens + 8 and grows the reservation as
// requests generate; when the worker's pool (bounded as above) cannot hold the growth it preempts
// the youngest, whose pages the worker frees, and which resumes later by re-prefilling prompt +
// generated. Every request completes, untruncated, with the tokens it gives alone.
TEST_F(ClusterTest, OvercommittedPoolPreemptsAndLosesNothing) {
  StartCluster({"--slots", "4", "--ctx", "2048", "--overcommit-headroom", "8"},
               {"--kv-pool-tokens", "320", "--kv-page", "16"});
  const int kTokens = 40;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(Prompt(40 + 5 * i, 30 + i));
  std::vector<Outcome> out(prompts.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < prompts.size(); ++i)
    th.emplace_back([&, i] { out[i] = Submit(50 + i, prompts[i], kTokens); });
  for (auto& t : th) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(out[i].status.ok()) << out[i].status.error_message();
    EXPECT_EQ(out[i].reason, v1::FINISH_REASON_LENGTH) << out[i].error;
    EXPECT_EQ(out[i].tokens, Reference(*model_, prompts[i], kTokens)) << "request " << i;
  }
  EXPECT_NE(ReadFile(sched_->log).find("event=preempted"), std::string::npos)
      << "the pool never ran short: nothing was preempted";
}

TEST_F(ClusterTest, CancellingASubmitFreesItsSlot) {
  StartCluster({"--slots", "2", "--ctx", "8192", "--split", "pool"});
  grpc::ClientContext long_ctx;
  std::atomic<int> progress{0};
  Outcome cancelled;
  std::atomic<bool> done{false};
  std::thread t([&] {
    cancelled = Submit(300, Prompt(8, 7), 4000, &long_ctx, &progress);
    done = true;
  });
  while (progress.load() < 3 && !done) std::this_thread::sleep_for(1ms);
  ASSERT_FALSE(done) << cancelled.status.error_message() << " " << cancelled.error;
  // The slot is busy with request 300.
  bool busy = false;
  const v1::ClusterStatus before = Status();
  for (const auto& s : before.slots()) busy |= s.request_id() == 300;
  EXPECT_TRUE(busy);
  long_ctx.TryCancel();
  t.join();
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(cancelled.tokens.size(), 4000u);
  const auto until = std::chrono::steady_clock::now() + 2s;
  while (true) {
    v1::ClusterStatus st = Status();
    bool still = false;
    for (const auto& s : st.slots()) still |= s.request_id() == 300;
    if (!still && st.running_requests() == 0) break;
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "slot not freed: " << st.DebugString();
    std::this_thread::sleep_for(5ms);
  }
  // Other requests still complete, greedy and correct.
  const std::vector<int32_t> p = Prompt(6, 8);
  Outcome ok = Submit(301, p, 8);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens, Reference(*model_, p, 8));
}

TEST_F(ClusterTest, KillingTheWorkerFailsInFlightStreamsAndStopsServing) {
  StartCluster({"--slots", "2", "--ctx", "8192"});
  std::atomic<int> progress{0};
  std::vector<Outcome> out(3);
  std::vector<std::thread> th;
  for (int i = 0; i < 3; ++i)  // 2 running + 1 queued
    th.emplace_back([&, i] { out[i] = Submit(400 + i, Prompt(5, i), 4000, nullptr, &progress); });
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (progress.load() < 4 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  ASSERT_GE(progress.load(), 4) << "requests did not start";
  worker_->Kill(SIGKILL);
  for (auto& t : th) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << i << ": " << out[i].status.error_message();
    EXPECT_TRUE(out[i].finished) << i;
    EXPECT_EQ(out[i].reason, v1::FINISH_REASON_ERROR) << i;
    EXPECT_NE(out[i].error.find("worker lost"), std::string::npos) << out[i].error;
  }
  v1::ClusterStatus st = Status();
  EXPECT_FALSE(st.serving());
  EXPECT_EQ(st.running_requests(), 0u);
  EXPECT_EQ(st.waiting_requests(), 0u);
  // New requests are refused at once while not serving.
  Outcome refused = Submit(500, Prompt(3, 1), 4);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

// The internal listener with --internal-key-file: every call needs one of the file's tokens
// (docs/tp.md "Multi-host"); a worker with --scheduler-key-file registers and serves.
TEST_F(ClusterTest, InternalKeyFileRefusesCallsWithoutTheToken) {
  const std::string token = "0123456789abcdef0123456789abcdef";
  const std::string keys = *dir_ + "/internal.keys";
  std::ofstream(keys) << "# internal tokens\n" << token << "\n";
  std::filesystem::permissions(keys, std::filesystem::perms::owner_read |
                                         std::filesystem::perms::owner_write);
  StartCluster({"--slots", "2", "--ctx", "1024", "--internal-key-file", keys},
               {"--scheduler-key-file", keys}, token);
  for (const std::string& bad : {std::string(), std::string("wrong-token-0123456789")}) {
    token_ = bad;
    grpc::Status s;
    Status(&s);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "token '" << bad << "'";
    Outcome o = Submit(700, Prompt(3, 1), 4);
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  token_ = token;
  const std::vector<int32_t> p = Prompt(7, 9);
  Outcome ok = Submit(701, p, 12);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens, Reference(*model_, p, 12));
  // A worker without the token is refused at Register and exits with the reason.
  auto intruder = Spawn({kBin, "worker", "--scheduler", addr_, "--model", *model_, "--backend",
                         "cpu", "--threads", "1", "--worker-id", "intruder"},
                        *dir_ + "/intruder.log");
  int st = 0;
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (waitpid(intruder->pid, &st, WNOHANG) == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "the worker without a token stayed up";
    std::this_thread::sleep_for(20ms);
  }
  intruder->pid = -1;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1);
  EXPECT_NE(ReadFile(*dir_ + "/intruder.log").find("authorization"), std::string::npos)
      << ReadFile(*dir_ + "/intruder.log");
  EXPECT_TRUE(Status().serving());
}

TEST(SchedulerFlags, ANonLoopbackListenNeedsTokensOrAnExplicitOptOut) {
  auto run = [](const std::string& flags) {
    const std::string cmd = std::string(kBin) + " scheduler " + flags + " 2>&1";
    const CommandResult r = RunCommand(cmd);
    return std::make_pair(r.exit_code, r.output);
  };
  auto [rc, out] = run("--listen 0.0.0.0:0");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--internal-key-file"), std::string::npos) << out;
  std::tie(rc, out) = run("--listen 0.0.0.0:0 --allow-unauthenticated perhaps");
  EXPECT_EQ(rc, 2) << out;
  // A key file that does not exist: one clear error at start, nothing listens.
  std::tie(rc, out) = run("--listen 127.0.0.1:0 --internal-key-file /nonexistent/keys");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("/nonexistent/keys"), std::string::npos) << out;
  std::tie(rc, out) = run("--lookahead maybe");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--lookahead expects on or off"), std::string::npos) << out;
}

// The Gloo address a TP rank advertises by default: the local end of its route to the scheduler.
// (The netns test checks a non-loopback route: 10.77.0.2 toward 10.77.0.1.)
TEST(TpAddress, LoopbackSchedulerTargetsGiveLoopback) {
  for (const char* t : {"127.0.0.1:50061", "localhost:50061", "ipv4:127.0.0.1:1",
                        "dns:///localhost:1", "[::1]:50061", "127.0.0.1", "unix:/tmp/sched.sock"}) {
    absl::StatusOr<std::string> a = worker::LocalAddressToward(t);
    if (std::string(t) == "[::1]:50061" && !a.ok()) continue;  // no IPv6 on this host
    ASSERT_TRUE(a.ok()) << t << ": " << a.status();
    EXPECT_EQ(*a, "127.0.0.1") << t;
  }
  EXPECT_FALSE(worker::LocalAddressToward("no-such-host.invalid:1").ok());
  EXPECT_FALSE(worker::LocalAddressToward(":50061").ok());
  EXPECT_FALSE(worker::LocalAddressToward("[::1:50061").ok());
}

// The step statistics (GetStepStats) count every step of a batch-1 request once, with ordered
// percentiles and a histogram that adds up; `reset` clears them. Behaviour only: the numbers are
// the benchmark below.
TEST_F(ClusterTest, StepStatsCountEveryStepAtBatchOne) {
  StartCluster({"--slots", "1", "--ctx", "4096"});
  Submit(600, Prompt(4, 1), 16);
  {
    grpc::ClientContext ctx;
    pb::StepStatsRequest req;
    req.set_reset(true);
    pb::StepStats st;
    ASSERT_TRUE(stub_->GetStepStats(&ctx, req, &st).ok());
    EXPECT_GE(st.steps(), 16u);
  }
  const int kTokens = 64;
  Outcome o = Submit(601, Prompt(4, 2), kTokens);
  ASSERT_TRUE(o.status.ok());
  ASSERT_EQ(o.tokens.size(), static_cast<size_t>(kTokens));
  grpc::ClientContext ctx;
  pb::StepStats st;
  ASSERT_TRUE(stub_->GetStepStats(&ctx, pb::StepStatsRequest(), &st).ok());
  EXPECT_EQ(st.steps(), static_cast<uint64_t>(kTokens)) << "reset did not clear, or steps missed";
  EXPECT_GT(st.mean_us(), 0);
  EXPECT_LE(st.p50_us(), st.p90_us());
  EXPECT_LE(st.p90_us(), st.p99_us());
  EXPECT_LE(st.p99_us(), st.max_us());
  EXPECT_GT(st.mean_worker_us(), 0);
  ASSERT_EQ(st.bucket_upper_us_size(), st.bucket_count_size());
  uint64_t counted = 0;
  for (uint64_t n : st.bucket_count()) counted += n;
  EXPECT_EQ(counted, st.steps());
  // Lookahead (on by default): a one-sequence decode runs ahead of every answer but the ones
  // after its prefill and around its end.
  EXPECT_GT(st.steps_ahead(), st.steps() / 2);
  EXPECT_LE(st.steps_ahead(), st.steps());
}

// With an MTP worker (--mtp 2) the decodes are sent ahead too (their work follows the answer in
// flight, SlotWork.follows), and the request gets all its tokens.
TEST_F(ClusterTest, MtpStepsAreSentAhead) {
  StartCluster({"--slots", "1", "--ctx", "4096"}, {"--mtp", "2"});
  const int kTokens = 48;
  Outcome o = Submit(700, Prompt(4, 3), kTokens);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.tokens.size(), static_cast<size_t>(kTokens));
  grpc::ClientContext ctx;
  pb::StepStats st;
  ASSERT_TRUE(stub_->GetStepStats(&ctx, pb::StepStatsRequest(), &st).ok());
  EXPECT_GT(st.steps_ahead(), 0u) << "no MTP step was sent ahead of an answer";
}

// Benchmark, not a test (DISABLED_: ctest skips it; docs/conventions.md "Benchmarks"): control
// overhead per step at batch 1 (scheduler + RPC + worker bookkeeping, excluding the worker's
// forward + sample), the numbers docs/perf/cluster.md records. Run it with --gtest_filter=
// ClusterTest.DISABLED_StepOverheadAtBatchOne --gtest_also_run_disabled_tests.
TEST_F(ClusterTest, DISABLED_StepOverheadAtBatchOne) {
  StartCluster({"--slots", "1", "--ctx", "4096"});
  Submit(600, Prompt(4, 1), 16);  // warm the path
  {
    grpc::ClientContext ctx;
    pb::StepStatsRequest req;
    req.set_reset(true);
    pb::StepStats st;
    ASSERT_TRUE(stub_->GetStepStats(&ctx, req, &st).ok());
  }
  const int kTokens = 512;
  const auto t0 = std::chrono::steady_clock::now();
  Outcome o = Submit(601, Prompt(4, 2), kTokens);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(o.status.ok());
  ASSERT_EQ(o.tokens.size(), static_cast<size_t>(kTokens));
  grpc::ClientContext ctx;
  pb::StepStats st;
  ASSERT_TRUE(stub_->GetStepStats(&ctx, pb::StepStatsRequest(), &st).ok());
  EXPECT_EQ(st.steps(), static_cast<uint64_t>(kTokens));
  std::printf(
      "batch-1 steps: %llu | control overhead us: mean %.1f p50 %.1f p90 %.1f p99 %.1f max %.1f | "
      "worker compute mean %.1f us | schedule+send %.1f us | apply+route %.1f us | "
      "client wall %.1f us/token\n",
      static_cast<unsigned long long>(st.steps()), st.mean_us(), st.p50_us(), st.p90_us(),
      st.p99_us(), st.max_us(), st.mean_worker_us(), st.mean_schedule_us(), st.mean_apply_us(),
      wall * 1e6 / kTokens);
}

}  // namespace
}  // namespace ds
