// Tensor parallelism in the cluster, end to end (docs/tp.md §6): a real `deltaserve scheduler`,
// a TP = 2 worker group (two `deltaserve worker --tp-rank R --tp-world 2` processes meeting over
// Gloo through the scheduler's rendezvous store) and a `deltaserve gateway`, on loopback with the
// tiny synthesized model, driven through the public API. Greedy output must equal single-process
// `deltaserve generate`; a rank's death must fail requests UNAVAILABLE (or, with --failover-wait,
// replay them on a replacement worker with nothing lost).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "deltaserve/v1/deltaserve.grpc.pb.h"
#include "common/util/model_alias.h"
#include "gateway/client.h"
#include "tests/cluster/cluster_test_util.h"
#include "tools/synth/synth.h"

namespace ds {
namespace {

namespace v1 = deltaserve::v1;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using namespace cluster_test;

const std::string kBin = DS_DELTASERVE_BIN;

// Waits for a process to exit on its own; true if it did within `timeout`.
bool Exits(pid_t pid, std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (!Alive(pid)) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

struct Child {
  std::string name, log;
  pid_t pid = -1;
};

// Single-process greedy reference: `deltaserve generate --json`.
std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_tokens,
                               const std::string& model = TinyModel()) {
  const std::string cmd = kBin + " generate --model " + model + " --prompt-ids '" + Join(prompt) +
                          "' --max-tokens " + std::to_string(max_tokens) +
                          " --backend cpu --threads 1 --json --ignore-eos 2>/dev/null";
  const auto [rc, out] = RunCommand(cmd);
  EXPECT_EQ(rc, 0) << cmd;
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (!j.is_object() || !j.contains("tokens")) {
    ADD_FAILURE() << "bad reference output: " << out;
    return {};
  }
  return j["tokens"].get<std::vector<int32_t>>();
}

struct Gen {
  grpc::Status status;
  std::vector<int32_t> ids;
  int n_started = 0;
  bool finished = false;
  v1::GenerateResponse::Finished fin;
};

v1::GenerateRequest Greedy(const std::vector<int32_t>& prompt, uint32_t max_tokens) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  return r;
}

class TpCluster {
 public:
  struct Options {
    int world = 2;
    std::vector<std::string> scheduler_flags = {};
    bool start_ranks = true;
    // --internal-key-file for the scheduler, --scheduler-key-file for ranks and gateway.
    std::string key_file = {};
    std::string model = TinyModel();
    std::vector<std::string> rank_flags = {};  // more flags for every rank (e.g. --mtp 3)
  };

  explicit TpCluster(Options o) : o_(std::move(o)) {
    static int n = 0;
    dir_ = TestDir() + "/c" + std::to_string(n++);
    std::filesystem::create_directories(dir_);
    std::vector<std::string> sf = {
        "--listen", "127.0.0.1:0", "--port-file", dir_ + "/sched.port", "--slots",
        "4",        "--ctx",       "4096",        "--log-interval",     "0"};
    sf.insert(sf.end(), o_.scheduler_flags.begin(), o_.scheduler_flags.end());
    if (!o_.key_file.empty()) {
      sf.insert(sf.end(), {"--internal-key-file", o_.key_file});
      client_key_ = {"--scheduler-key-file", o_.key_file};
    }
    scheduler_ = Start("scheduler", "scheduler", sf);
    const int port = std::atoi(WaitFor(dir_ + "/sched.port", scheduler_.pid).c_str());
    EXPECT_GT(port, 0) << "scheduler did not start";
    sched_ = "127.0.0.1:" + std::to_string(port);
    if (o_.start_ranks)
      for (int r = 0; r < o_.world; ++r) StartRank(r);
    const std::string gpf = dir_ + "/gw.port";
    Start("gateway", "gateway",
          {"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--scheduler", sched_,
           "--model", o_.model, "--port-file", gpf, "--health-interval-ms", "100"},
          client_key_);
    std::istringstream in(WaitFor(gpf, children_.back().pid));
    int gp = 0, ap = 0;
    in >> gp >> ap;
    EXPECT_GT(gp, 0) << "gateway did not start";
    addr_ = "127.0.0.1:" + std::to_string(gp);
    admin_ = "127.0.0.1:" + std::to_string(ap);
  }

  ~TpCluster() {
    for (Child& c : children_)
      if (Alive(c.pid)) kill(c.pid, SIGTERM);
    const auto end = Clock::now() + 5s;
    for (Child& c : children_) {
      while (Alive(c.pid) && Clock::now() < end) std::this_thread::sleep_for(10ms);
      if (Alive(c.pid)) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, nullptr, 0);
      }
    }
    if (::testing::Test::HasFailure())
      for (Child& c : children_)
        std::fprintf(stderr, "----- %s -----\n%s\n", c.name.c_str(), ReadFile(c.log).c_str());
  }

  pid_t StartRank(int r) {
    std::vector<std::string> f = {
        "--scheduler", sched_, "--model", o_.model, "--backend", "cpu", "--threads", "1",
        "--tp-rank", std::to_string(r), "--tp-world", std::to_string(o_.world),
        "--tp-group", "g", "--split", "1,1", "--worker-id", "rank" + std::to_string(r)};
    f.insert(f.end(), o_.rank_flags.begin(), o_.rank_flags.end());
    return Start("rank" + std::to_string(r), "worker", f, client_key_).pid;
  }
  pid_t StartSingleWorker() {
    std::vector<std::string> f = {"--scheduler", sched_, "--model", o_.model, "--backend", "cpu",
                                  "--threads", "1", "--worker-id", "single"};
    f.insert(f.end(), o_.rank_flags.begin(), o_.rank_flags.end());
    return Start("single", "worker", f).pid;
  }
  pid_t pid(const std::string& name) const {
    for (const Child& c : children_)
      if (c.name == name) return c.pid;
    return -1;
  }

  gw::Health Health() {
    auto ch = gw::MakeChannel(addr_);
    return gw::CheckHealth(ch.get(), 1s);
  }
  bool WaitHealth(gw::Health want, std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      if (Health() == want) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  v1::ClusterStatus Status() {
    auto stub = v1::Admin::NewStub(gw::MakeChannel(admin_));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    v1::ClusterStatus st;
    grpc::Status s = stub->GetClusterStatus(&ctx, {}, &st);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return st;
  }

  // One streamed Generate; `on_token(n)` runs after the n-th token arrived.
  Gen Generate(const v1::GenerateRequest& req, std::chrono::milliseconds deadline = 60s,
               const std::function<void(int)>& on_token = nullptr) {
    auto stub = v1::Generation::NewStub(gw::MakeChannel(addr_));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    Gen g;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
      if (m.has_started()) ++g.n_started;
      if (m.has_chunk()) {
        g.ids.insert(g.ids.end(), m.chunk().token_ids().begin(), m.chunk().token_ids().end());
        if (on_token) on_token(static_cast<int>(g.ids.size()));
      }
      if (m.has_finished()) {
        g.finished = true;
        g.fin = m.finished();
      }
    }
    g.status = reader->Finish();
    return g;
  }

 private:
  Child Start(const std::string& name, const std::string& role, std::vector<std::string> args,
              const std::vector<std::string>& more = {}) {
    Child c{name, dir_ + "/" + name + "." + std::to_string(children_.size()) + ".log", -1};
    args.insert(args.begin(), {kBin, role});
    args.insert(args.end(), more.begin(), more.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    c.pid = fork();
    if (c.pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (!std::freopen(c.log.c_str(), "w", stderr)) _exit(126);
      execv(kBin.c_str(), argv.data());
      _exit(127);
    }
    children_.push_back(c);
    return c;
  }
  std::string WaitFor(const std::string& path, pid_t pid) {
    const auto end = Clock::now() + 20s;
    while (Clock::now() < end) {
      std::string s = ReadFile(path);
      if (!s.empty()) return s;
      if (!Alive(pid)) break;
      std::this_thread::sleep_for(10ms);
    }
    return "";
  }

  Options o_;
  std::string dir_, sched_, addr_, admin_;
  std::vector<std::string> client_key_;
  Child scheduler_;
  std::vector<Child> children_;
};

const std::vector<int32_t> kPrompt = {72, 101, 108, 108, 111, 44, 32, 100, 101, 108, 116, 97};

TEST(TpCluster, GroupServesOnceEveryRankIsUpAndConcurrentGreedyMatchesGenerate) {
  TpCluster c({.start_ranks = false});
  const pid_t r0 = c.StartRank(0);
  // One rank of two: the group is not formed, nothing serves.
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(c.Health(), gw::Health::kNotServing);
  EXPECT_EQ(c.Status().workers_size(), 0);
  EXPECT_TRUE(Alive(r0));
  c.StartRank(1);
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  const v1::ClusterStatus st = c.Status();
  ASSERT_EQ(st.workers_size(), 1);  // the group is one logical worker
  EXPECT_TRUE(st.workers(0).ready());
  EXPECT_NE(st.workers(0).device().find("tp=2"), std::string::npos) << st.workers(0).device();
  EXPECT_NE(st.workers(0).id().find("rank0"), std::string::npos) << st.workers(0).id();
  EXPECT_GT(st.workers(0).warmup_decode_tokens_per_second(), 0);

  constexpr int kMax = 24, kN = 4;
  const std::vector<int32_t> want = Reference(kPrompt, kMax);
  ASSERT_EQ(want.size(), static_cast<size_t>(kMax));
  std::vector<std::future<Gen>> fs;
  for (int i = 0; i < kN; ++i)
    fs.push_back(std::async(std::launch::async, [&] {
      v1::GenerateRequest req = Greedy(kPrompt, kMax);
      req.set_logprobs(2);
      return c.Generate(req);
    }));
  for (auto& f : fs) {
    Gen g = f.get();
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.ids, want);
    EXPECT_EQ(g.n_started, 1);
    EXPECT_EQ(g.fin.reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(g.fin.usage().completion_tokens(), static_cast<uint32_t>(kMax));
  }
}

TEST(TpCluster, MixedLongAndShortPromptsUnderChunkedPrefillMatchAlone) {
  // Chunks of 8 and 16 tokens per step: the long prompt is prefilled over many steps while the
  // short ones decode beside it, on both ranks in lock-step.
  TpCluster c({.scheduler_flags = {"--max-chunk", "8", "--max-batch-tokens", "16"}});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  std::vector<int32_t> long_prompt;
  for (int i = 0; i < 150; ++i) long_prompt.push_back(32 + (i * 37) % 90);
  const std::vector<std::vector<int32_t>> prompts = {
      long_prompt, kPrompt, {87, 111, 114, 108, 100}, {1, 2, 3}};
  const std::vector<int> max_tokens = {20, 30, 12, 25};
  std::vector<std::future<Gen>> fs;
  for (size_t i = 0; i < prompts.size(); ++i)
    fs.push_back(std::async(std::launch::async, [&, i] {
      return c.Generate(Greedy(prompts[i], static_cast<uint32_t>(max_tokens[i])));
    }));
  for (size_t i = 0; i < prompts.size(); ++i) {
    Gen g = fs[i].get();
    ASSERT_TRUE(g.status.ok()) << "prompt " << i << ": " << g.status.error_message();
    EXPECT_EQ(g.ids, Reference(prompts[i], max_tokens[i])) << "prompt " << i;
  }
}

// Prefix cache under TP (issue #17): each rank keeps its shard's checkpoints (the worker's
// default host tier); a chat's second turn resumes on both ranks and both turns give the tokens
// of single-process generate.
TEST(TpCluster, SecondChatTurnResumesOnEveryRankAndMatchesGenerate) {
  TpCluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  constexpr int kMax = 8;
  std::vector<int32_t> p1;
  for (int i = 0; i < 120; ++i) p1.push_back(32 + (i * 29) % 90);
  Gen r1 = c.Generate(Greedy(p1, kMax));
  ASSERT_TRUE(r1.status.ok()) << r1.status.error_message();
  EXPECT_EQ(r1.ids, Reference(p1, kMax));
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), r1.ids.begin(), r1.ids.end());
  for (int i = 0; i < 15; ++i) p2.push_back(40 + (i * 13) % 70);
  Gen r2 = c.Generate(Greedy(p2, kMax));
  ASSERT_TRUE(r2.status.ok()) << r2.status.error_message();
  EXPECT_EQ(r2.ids, Reference(p2, kMax));
  const v1::ClusterStatus st = c.Status();
  ASSERT_EQ(st.workers_size(), 1);
  const v1::PrefixCacheStatus& pc = st.workers(0).prefix_cache();
  EXPECT_TRUE(pc.enabled());
  EXPECT_EQ(pc.hits(), 1u);
  EXPECT_EQ(pc.tokens_saved(), 120u + kMax - 1u);
  EXPECT_EQ(pc.failures(), 0u);
}

// The internal listener with tokens (what a multi-host deployment runs, docs/tp.md "Multi-host"):
// the ranks' registration and Gloo rendezvous and the gateway's calls all carry the token.
// tests/cluster/netns_tp_test.sh runs the same across network namespaces, with TLS.
TEST(TpCluster, WithInternalTokensTheGroupFormsAndMatchesGenerate) {
  const std::string keys = TestDir() + "/internal.keys";
  std::ofstream(keys) << "0123456789abcdef0123456789abcdef\n";
  std::filesystem::permissions(keys, std::filesystem::perms::owner_read |
                                         std::filesystem::perms::owner_write);
  TpCluster c({.key_file = keys});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  constexpr int kMax = 16;
  Gen g = c.Generate(Greedy(kPrompt, kMax));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.ids, Reference(kPrompt, kMax));
}

TEST(TpCluster, KillingOneRankMakesHealthNotServingAndRequestsUnavailable) {
  TpCluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  std::promise<void> streaming;
  auto inflight = std::async(std::launch::async, [&] {
    return c.Generate(Greedy(kPrompt, 3000), 60s, [&](int n) {
      if (n == 5) streaming.set_value();
    });
  });
  ASSERT_EQ(streaming.get_future().wait_for(20s), std::future_status::ready);
  const auto t_kill = Clock::now();
  ASSERT_EQ(kill(c.pid("rank1"), SIGKILL), 0);
  Gen g = inflight.get();
  const double fail_s = std::chrono::duration<double>(Clock::now() - t_kill).count();
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::UNAVAILABLE) << g.status.error_message();
  EXPECT_LT(fail_s, 10.0) << "the request hung after the rank died";
  std::fprintf(stderr, "in-flight request failed %.0f ms after the rank was killed\n",
               fail_s * 1e3);
  EXPECT_TRUE(c.WaitHealth(gw::Health::kNotServing, 3s));
  Gen after = c.Generate(Greedy(kPrompt, 4));
  EXPECT_EQ(after.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << after.status.error_message();
  // The surviving rank's group is gone: the scheduler closed its session and it exits.
  EXPECT_TRUE(Exits(c.pid("rank0"), 15s)) << "rank 0 outlived its group";
}

// Two greedy streams; rank 1 is killed once the first has 10 tokens, then a TP = 1 worker
// (split recomputed: the whole model, the same worker flags) replaces the group: both streams
// end with exactly the reference's tokens.
void FailoverReplaysWithNothingLost(TpCluster::Options o) {
  const std::string model = o.model;
  TpCluster c(std::move(o));
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  constexpr int kMax = 400;
  const std::vector<int32_t> want = Reference(kPrompt, kMax, model);
  ASSERT_EQ(want.size(), static_cast<size_t>(kMax));
  std::promise<void> streaming;
  std::atomic<bool> fired{false};
  std::atomic<int> seen{0};
  auto on_token = [&](int n) {
    seen.store(n);
    if (n >= 10 && !fired.exchange(true)) streaming.set_value();
  };
  auto a = std::async(std::launch::async,
                      [&] { return c.Generate(Greedy(kPrompt, kMax), 90s, on_token); });
  auto b = std::async(std::launch::async, [&] { return c.Generate(Greedy(kPrompt, kMax), 90s); });
  ASSERT_EQ(streaming.get_future().wait_for(30s), std::future_status::ready);
  ASSERT_EQ(kill(c.pid("rank1"), SIGKILL), 0);
  EXPECT_TRUE(c.WaitHealth(gw::Health::kNotServing, 5s));
  // The group died mid-stream: the client is waiting with part of its tokens.
  EXPECT_LT(seen.load(), kMax);
  const int before_replay = seen.load();
  c.StartSingleWorker();
  for (auto* f : {&a, &b}) {
    Gen g = f->get();
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.ids, want);  // no token lost, none sent twice, greedy unchanged
    EXPECT_EQ(g.n_started, 1);
    EXPECT_EQ(g.fin.reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(g.fin.usage().completion_tokens(), static_cast<uint32_t>(kMax));
  }
  std::fprintf(stderr, "stream had %d of %d tokens when the group died\n", before_replay, kMax);
  EXPECT_TRUE(c.WaitHealth(gw::Health::kServing, 5s));
  const v1::ClusterStatus st = c.Status();
  ASSERT_EQ(st.workers_size(), 1);
  EXPECT_EQ(st.workers(0).id(), "single");
}

TEST(TpCluster, FailoverReplaysOnAReplacementWorkerWithNothingLost) {
  FailoverReplaysWithNothingLost({.scheduler_flags = {"--failover-wait", "30"}});
}

// The same with MTP (issue #15): the group speculates with the demo model's MTP head cut over its
// ranks, the replacement worker with the whole one; the replay resumes the streams exactly.
TEST(TpCluster, FailoverWithMtpReplaysOnAReplacementWorkerWithNothingLost) {
  FailoverReplaysWithNothingLost({.scheduler_flags = {"--failover-wait", "30"},
                                  .model = ResolveModelAlias("demo"),
                                  .rank_flags = {"--mtp", "3"}});
}

// MTP under TP (issue #15, docs/tp.md §10): the trained demo model's MTP block cut over the two
// ranks; greedy requests, four at once, stream exactly the tokens of single-process `generate`
// without MTP, and the drafts are accepted, so answers of several tokens cross the scheduler.
TEST(TpCluster, MtpGroupMatchesGenerateAndAnswersSeveralTokensPerStep) {
  const std::string demo = ResolveModelAlias("demo");
  TpCluster c({.model = demo, .rank_flags = {"--mtp", "3"}});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 60s));
  constexpr int kMax = 40;
  const std::vector<std::vector<int32_t>> prompts = {
      {260, 1605, 479, 386}, {72, 101, 108, 108, 111, 44, 32}, {300, 301, 302}, {999, 5, 1200}};
  std::vector<std::future<Gen>> fs;
  for (const auto& p : prompts)
    fs.push_back(std::async(std::launch::async, [&c, p] { return c.Generate(Greedy(p, kMax)); }));
  double tokens_per_step = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Gen g = fs[i].get();
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.ids, Reference(prompts[i], kMax, demo)) << "prompt " << i;
    tokens_per_step = std::max(tokens_per_step, static_cast<double>(g.fin.timings().tokens_per_step()));
  }
  EXPECT_GT(tokens_per_step, 1.3);
}

TEST(TpServe, DemoWithTwoRanksRunsAndExitsCleanly) {
  const std::string cmd = kBin + " serve --model " + TinyModel() +
                          " --tp 2 --split 1,1 --port 0 --slots 2 --ctx 1024 --backend cpu "
                          "--threads 1 --demo 'Hello' --demo-max-tokens 8 2>&1";
  const auto [rc, out] = RunCommand(cmd);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("cluster SERVING"), std::string::npos) << out;
  EXPECT_NE(out.find("generated 8 tok"), std::string::npos) << out;
}

}  // namespace
}  // namespace ds
