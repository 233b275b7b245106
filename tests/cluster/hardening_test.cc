// What a hostile client and a careless operator found (issue #18), each as a test: listeners own
// their port, every repeated or free-text request field has a limit, health follows Drain, requests
// that do not parse are INVALID_ARGUMENT naming the field. In-process gateways where no cluster is
// needed; real processes on loopback otherwise (gateway_cluster.h).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <future>
#include <sstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log/log.h"
#include "deltaserve/internal/cluster.grpc.pb.h"
#include "deltaserve/v1/deltaserve.grpc.pb.h"
#include "gateway/gateway.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/cluster/gateway_cluster.h"

namespace ds {
namespace {

using namespace cluster_test;
namespace pb = deltaserve::internal;
namespace hv1 = grpc::health::v1;

gw::GatewayOptions InProcessOptions() {
  gw::GatewayOptions o;
  o.listen = "127.0.0.1:0";
  o.admin_listen = "127.0.0.1:0";
  o.scheduler = "127.0.0.1:1";  // nothing there: Tokenize and parsing need no scheduler
  o.model = TinyModel();
  return o;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Waits (bounded) for `pid` to exit; its exit code, or -1 when it did not exit in time.
int WaitExit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    std::this_thread::sleep_for(20ms);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// ---- 1. listeners own their port ----

TEST(Listeners, SecondGatewayOnTheSamePortsFailsNamingTheAddress) {
  auto first = gw::Gateway::Start(InProcessOptions());
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string pub = "127.0.0.1:" + std::to_string((*first)->port());
  const std::string admin = "127.0.0.1:" + std::to_string((*first)->admin_port());

  gw::GatewayOptions o = InProcessOptions();
  o.listen = pub;
  auto second = gw::Gateway::Start(o);
  ASSERT_FALSE(second.ok()) << "a second gateway bound " << pub << " too (SO_REUSEPORT)";
  EXPECT_TRUE(Contains(std::string(second.status().message()), pub)) << second.status();
  EXPECT_TRUE(Contains(std::string(second.status().message()), "in use")) << second.status();

  o = InProcessOptions();
  o.admin_listen = admin;
  second = gw::Gateway::Start(o);
  ASSERT_FALSE(second.ok()) << "a second gateway bound the admin address " << admin;
  EXPECT_TRUE(Contains(std::string(second.status().message()), admin)) << second.status();
  (*first)->Shutdown();
}

TEST(Listeners, SecondSchedulerOnTheSameListenAddressExitsNonZero) {
  const std::string dir = TestDir() + "/two_schedulers";
  std::filesystem::create_directories(dir);
  Proc a = Spawn("scheduler", {"--listen", "127.0.0.1:0", "--port-file", dir + "/a.port"},
                 dir + "/a.log");
  const int port = std::atoi(WaitFile(dir + "/a.port", a.pid, 20s).c_str());
  ASSERT_GT(port, 0) << ReadFile(a.log);
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  Proc b = Spawn("scheduler", {"--listen", addr}, dir + "/b.log");
  const int rc = WaitExit(b.pid, 20s);
  kill(a.pid, SIGTERM);
  WaitExit(a.pid, 10s);
  EXPECT_NE(rc, 0) << "the second scheduler kept running on " << addr;
  EXPECT_NE(rc, -1) << "the second scheduler kept running on " << addr;
  const std::string log = ReadFile(b.log);
  EXPECT_TRUE(Contains(log, "cannot listen on " + addr)) << log;
  EXPECT_TRUE(Contains(log, "in use")) << log;
}

TEST(Listeners, ServeOnAPortInUseFailsInsteadOfSharingIt) {
  auto holder = gw::Gateway::Start(InProcessOptions());
  ASSERT_TRUE(holder.ok()) << holder.status();
  const int port = (*holder)->port();
  const std::string cmd = kBin + " serve --model " + TinyModel() + " --port " +
                          std::to_string(port) + " --slots 1 --ctx 512 --backend cpu --threads 1 2>&1";
  const CommandResult r = RunCommand("timeout 120 " + cmd);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "serve kept running: " << r.output;
  EXPECT_FALSE(Contains(r.output, "cluster SERVING")) << r.output;
  EXPECT_TRUE(Contains(r.output, "127.0.0.1:" + std::to_string(port))) << r.output;
  (*holder)->Shutdown();
}

// `deltaserve generate` takes the worker's device switches (worker/process/device_tuning.h): a bad
// value exits 1 naming the flag and what it expects; good values run (the CPU backend ignores the
// CUDA-only ones, so the tokens are the default run's).
TEST(Cli, GenerateTakesTheWorkerDeviceSwitches) {
  const std::string base = kBin + " generate --model " + TinyModel() +
                           " --prompt-ids 1,2,3 --max-tokens 3 --backend cpu --threads 1 --json";
  for (const auto& [flags, says] :
       std::vector<std::pair<std::string, std::string>>{
           {"--tiled-f16-formats maybe", "--tiled-f16-formats expects on or off"},
           {"--dense-weights sometimes", "--dense-weights expects on, off or auto"},
           {"--gdn-state f16", "--gdn-state expects f32 or bf16"}}) {
    const CommandResult r = RunCommand(base + " " + flags + " 2>&1");
    EXPECT_EQ(r.exit_code, 1) << flags << ": " << r.output;
    EXPECT_TRUE(Contains(r.output, says)) << flags << ": " << r.output;
  }
  const CommandResult def = RunCommand(base + " 2>/dev/null");
  const CommandResult tuned = RunCommand(
      base + " --tiled-f16-formats off --dense-weights off --early-launch off --coarse-draft-head off"
             " --deferred-drafts off 2>/dev/null");
  ASSERT_EQ(def.exit_code, 0) << def.output;
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  const auto a = nlohmann::json::parse(def.output, nullptr, false);
  const auto b = nlohmann::json::parse(tuned.output, nullptr, false);
  ASSERT_TRUE(a.contains("tokens") && b.contains("tokens")) << def.output << tuned.output;
  EXPECT_EQ(a["tokens"].size(), 3u);
  EXPECT_EQ(a["tokens"], b["tokens"]);
}

// `deltaserve generate --mtp K`: plain greedy decoding's tokens, exactly --max-tokens of them,
// whether the last verifies keep all K drafts past --max-tokens (--mtp-full-tail on, the default:
// the surplus is not printed) or shrink them to what is left (off); a bad value is refused.
TEST(Cli, GenerateWithMtpGivesThePlainTokensUpToMaxTokens) {
  const std::string base =
      kBin +
      " generate --model demo --prompt-ids 5,6,7,8 --max-tokens 21 --backend cpu"
      " --threads 1 --json --ignore-eos";
  const CommandResult plain = RunCommand(base + " --mtp off 2>/dev/null");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto want = nlohmann::json::parse(plain.output, nullptr, false);
  ASSERT_TRUE(want.contains("tokens")) << plain.output;
  ASSERT_EQ(want["tokens"].size(), 21u);
  for (const std::string flags : {"--mtp 3", "--mtp 3 --mtp-full-tail off", "--mtp 4"}) {
    const CommandResult r = RunCommand(base + " " + flags + " 2>/dev/null");
    ASSERT_EQ(r.exit_code, 0) << flags << ": " << r.output;
    const auto got = nlohmann::json::parse(r.output, nullptr, false);
    ASSERT_TRUE(got.contains("tokens")) << flags << ": " << r.output;
    EXPECT_EQ(got["tokens"], want["tokens"]) << flags;
  }
  const CommandResult bad = RunCommand(base + " --mtp 3 --mtp-full-tail sometimes 2>&1");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(Contains(bad.output, "--mtp-full-tail")) << bad.output;
}

// ---- 3. health follows drain ----

v1::ClusterStatus Drain(const std::string& admin_addr, bool resume) {
  auto stub = v1::Admin::NewStub(gw::MakeChannel(admin_addr));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::DrainRequest req;
  req.set_resume(resume);
  v1::ClusterStatus st;
  grpc::Status s = stub->Drain(&ctx, req, &st);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return st;
}

TEST(Health, DrainMakesCheckAndWatchNotServingAndResumeRestoresThem) {
  Cluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  // A Watch stream open before the drain must see it.
  auto stub = hv1::Health::NewStub(gw::MakeChannel(c.addr()));
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + 30s);
  auto watch = stub->Watch(&watch_ctx, hv1::HealthCheckRequest());
  std::mutex mu;
  std::vector<hv1::HealthCheckResponse::ServingStatus> seen;
  std::thread reader([&] {
    hv1::HealthCheckResponse r;
    while (watch->Read(&r)) {
      std::lock_guard<std::mutex> l(mu);
      seen.push_back(r.status());
    }
  });
  auto saw = [&](hv1::HealthCheckResponse::ServingStatus want, std::chrono::milliseconds t) {
    const auto end = Clock::now() + t;
    while (Clock::now() < end) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (!seen.empty() && seen.back() == want) return true;
      }
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };
  EXPECT_TRUE(saw(hv1::HealthCheckResponse::SERVING, 5s));

  EXPECT_TRUE(Drain(c.admin_addr(), false).draining());
  EXPECT_EQ(c.Health(), gw::Health::kNotServing) << "Check right after Drain";
  EXPECT_EQ(c.Health(c.admin_addr()), gw::Health::kNotServing) << "admin listener";
  EXPECT_TRUE(saw(hv1::HealthCheckResponse::NOT_SERVING, 5s)) << "Watch after Drain";
  // Still not serving at later polls (the scheduler is serving, but drained).
  std::this_thread::sleep_for(600ms);
  EXPECT_EQ(c.Health(), gw::Health::kNotServing);
  EXPECT_EQ(c.Generate(IdsRequest(kPrompt, 4)).status.error_code(),
            grpc::StatusCode::UNAVAILABLE);

  EXPECT_FALSE(Drain(c.admin_addr(), true).draining());
  EXPECT_EQ(c.Health(), gw::Health::kServing) << "Check right after resume";
  EXPECT_TRUE(saw(hv1::HealthCheckResponse::SERVING, 5s)) << "Watch after resume";
  EXPECT_TRUE(c.Generate(IdsRequest(kPrompt, 4)).status.ok());
  watch_ctx.TryCancel();
  reader.join();
}

// ---- 2. limits on repeated and free-text fields ----

TEST(Limits, OversizedFieldsAreInvalidArgumentNamingFieldAndLimit) {
  Cluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  struct Case {
    const char* what;
    v1::GenerateRequest req;
    std::vector<std::string> parts;  // the message names the field and the limit
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, std::vector<std::string> parts, auto fill) {
    v1::GenerateRequest r = IdsRequest(kPrompt, 4);
    fill(r);
    cases.push_back({what, r, parts});
  };
  add("3 MB request_id", {"request_id", "128"},
      [](auto& r) { r.set_request_id(std::string(3 << 20, 'x')); });
  add("129-byte request_id", {"request_id", "128"},
      [](auto& r) { r.set_request_id(std::string(129, 'x')); });
  add("request_id with a newline", {"request_id", "printable"},
      [](auto& r) { r.set_request_id("a\nlevel=error"); });
  add("257 stop ids", {"stop_token_ids", "256"}, [](auto& r) {
    for (int i = 0; i < 257; ++i) r.add_stop_token_ids(i % 100);
  });
  add("17 stop strings", {"stop", "16"}, [](auto& r) {
    for (int i = 0; i < 17; ++i) r.add_stop("s" + std::to_string(i));
  });
  add("1025 chat messages", {"chat.messages", "1024"}, [](auto& r) {
    for (int i = 0; i < 1025; ++i) {
      auto* m = r.mutable_chat()->add_messages();
      m->set_role("user");
      m->set_content("hi");
    }
  });
  for (const Case& k : cases) {
    GenResult r = c.Generate(k.req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << k.what;
    for (const std::string& p : k.parts)
      EXPECT_TRUE(Contains(r.status.error_message(), p))
          << k.what << ": '" << r.status.error_message().substr(0, 300) << "' lacks " << p;
    EXPECT_LT(r.status.error_message().size(), 400u) << k.what << ": the message echoes the input";
    EXPECT_FALSE(r.started) << k.what;
  }
  // The probe's 4,000,000 stop ids (4 MB packed): refused at the gateway, never scanned.
  v1::GenerateRequest huge = IdsRequest(kPrompt, 4);
  for (int i = 0; i < 4'000'000; ++i) huge.add_stop_token_ids(100);
  GenResult hr = c.Generate(huge);
  EXPECT_EQ(hr.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(hr.status.error_message(), "stop_token_ids")) << hr.status.error_message();
  // Over the 4 MiB message limit: refused by gRPC before parsing.
  huge = IdsRequest(kPrompt, 4);
  huge.set_request_id(std::string(5 << 20, 'x'));
  EXPECT_EQ(c.Generate(huge).status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // At the limits everything is served.
  v1::GenerateRequest ok = IdsRequest(kPrompt, 4);
  ok.set_request_id(std::string(128, 'r'));
  for (int i = 0; i < 256; ++i) ok.add_stop_token_ids(500 + i % 3);
  GenResult r = c.Generate(ok);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids.size(), 4u);

  // The scheduler's own port bounds stop ids too.
  auto sched = pb::Scheduler::NewStub(gw::MakeChannel(c.scheduler_addr()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  pb::SubmitRequest sub;
  sub.mutable_prompt_ids()->Add(kPrompt.begin(), kPrompt.end());
  sub.set_max_tokens(4);
  for (int i = 0; i < 5000; ++i) sub.add_stop_token_ids(100);
  auto events = sched->Submit(&ctx, sub);
  pb::RequestEvent ev;
  EXPECT_FALSE(events->Read(&ev)) << "the scheduler admitted 5000 stop ids";
  grpc::Status s = events->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(Contains(s.error_message(), "stop_token_ids")) << s.error_message();
}

TEST(Limits, RequestMetadataOver8KiBIsRefused) {
  auto gw = gw::Gateway::Start(InProcessOptions());
  ASSERT_TRUE(gw.ok()) << gw.status();
  auto stub = v1::Generation::NewStub(gw::MakeChannel("127.0.0.1:" + std::to_string((*gw)->port())));
  auto tokenize = [&](size_t pad) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    ctx.AddMetadata("x-pad", std::string(pad, 'p'));
    v1::TokenizeRequest req;
    req.set_text("hello");
    v1::TokenizeResponse resp;
    return stub->Tokenize(&ctx, req, &resp);
  };
  EXPECT_TRUE(tokenize(4 << 10).ok());
  const grpc::Status s = tokenize(12 << 10);
  EXPECT_FALSE(s.ok()) << "12 KiB of metadata accepted";
  (*gw)->Shutdown();
}

// ---- 4. requests that do not parse ----

// Collects the structured log lines of this process while alive.
class LogCapture {
 public:
  LogCapture() {
    log::SetSinkForTesting([this](std::string_view line) {
      std::lock_guard<std::mutex> l(mu_);
      lines_.emplace_back(line);
    });
  }
  ~LogCapture() { log::SetSinkForTesting(nullptr); }
  std::vector<std::string> With(const std::string& part) {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<std::string> out;
    for (const std::string& s : lines_)
      if (Contains(s, part)) out.push_back(s);
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

// Runs `fn` with stderr (fd 2) sent to a file; returns what was written there.
std::string StderrOf(const std::function<void()>& fn) {
  const std::string path = TestDir() + "/stderr.txt";
  std::fflush(stderr);
  const int saved = dup(2);
  FILE* f = std::fopen(path.c_str(), "w");
  dup2(fileno(f), 2);
  fn();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::fclose(f);
  return ReadFile(path);
}

TEST(Malformed, InvalidUtf8AndGarbageAreInvalidArgumentNamingTheFieldWithOneLogLine) {
  auto gw = gw::Gateway::Start(InProcessOptions());
  ASSERT_TRUE(gw.ok()) << gw.status();
  auto channel = gw::MakeChannel("127.0.0.1:" + std::to_string((*gw)->port()));
  auto stub = v1::Generation::NewStub(channel);
  LogCapture logs;
  const std::string bad = "caf\xc3(\xff";
  grpc::Status tokenize, generate, chat, garbage;
  const std::string err = StderrOf([&] {
    {
      grpc::ClientContext ctx;
      v1::TokenizeRequest req;
      req.set_text(bad);  // the C++ client sends it (and logs a complaint of its own)
      v1::TokenizeResponse resp;
      tokenize = stub->Tokenize(&ctx, req, &resp);
    }
    {
      grpc::ClientContext ctx;
      v1::GenerateRequest req = IdsRequest(kPrompt, 4);
      req.set_request_id(bad);
      auto reader = stub->Generate(&ctx, req);
      v1::GenerateResponse m;
      while (reader->Read(&m)) {
      }
      generate = reader->Finish();
    }
    {
      grpc::ClientContext ctx;
      v1::GenerateRequest req;
      auto* m = req.mutable_chat()->add_messages();
      m->set_role("user");
      m->set_content(bad);
      auto reader = stub->Generate(&ctx, req);
      v1::GenerateResponse r;
      while (reader->Read(&r)) {
      }
      chat = reader->Finish();
    }
    {
      // Bytes that are no GenerateRequest at all (a truncated length-delimited field).
      grpc::GenericStub generic(channel);
      grpc::ClientContext ctx;
      const char raw[] = "\x0a\x7f\x01";
      grpc::Slice slice(raw, 3);
      grpc::ByteBuffer req(&slice, 1), resp;
      std::promise<grpc::Status> done;
      generic.UnaryCall(&ctx, "/deltaserve.v1.Generation/Tokenize", grpc::StubOptions(), &req,
                        &resp, [&](grpc::Status s) { done.set_value(s); });
      garbage = done.get_future().get();
    }
  });
  EXPECT_EQ(tokenize.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << tokenize.error_message();
  EXPECT_TRUE(Contains(tokenize.error_message(), "text")) << tokenize.error_message();
  EXPECT_TRUE(Contains(tokenize.error_message(), "UTF-8")) << tokenize.error_message();
  EXPECT_EQ(generate.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << generate.error_message();
  EXPECT_TRUE(Contains(generate.error_message(), "request_id")) << generate.error_message();
  EXPECT_EQ(chat.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << chat.error_message();
  EXPECT_TRUE(Contains(chat.error_message(), "chat.messages[].content")) << chat.error_message();
  EXPECT_EQ(garbage.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << garbage.error_message();
  EXPECT_FALSE(garbage.error_message().empty());
  // One structured line per malformed request, none of libprotobuf's own.
  EXPECT_EQ(logs.With("event=request_finished").size(), 4u);
  EXPECT_EQ(logs.With("outcome=invalid_argument").size(), 4u);
  EXPECT_FALSE(Contains(err, "[libprotobuf")) << err;
  (*gw)->Shutdown();
}

// ---- 5. the internal port under `serve` with keys; priority clamped ----

// Waits (bounded) for `text` in the file `path` while `pid` lives.
bool WaitText(const std::string& path, const std::string& text, pid_t pid,
              std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (Contains(ReadFile(path), text)) return true;
    if (!Alive(pid)) return false;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

// The value after `key` on the banner line of `serve` ("  scheduler   127.0.0.1:P ...").
std::string BannerField(const std::string& out, const std::string& key) {
  const size_t at = out.find("  " + key + " ");
  if (at == std::string::npos) return "";
  std::istringstream in(out.substr(at + key.size() + 2));
  std::string v;
  in >> v;
  return v;
}

TEST(InternalPort, ServeWithApiKeysGuardsTheSchedulerPortWithAGeneratedKey) {
  const std::string dir = TestDir() + "/serve_keys";
  std::filesystem::create_directories(dir);
  const std::string keys = dir + "/api.keys";
  std::ofstream(keys) << "public-0123456789abcdef0123456789\n";
  std::filesystem::permissions(keys, std::filesystem::perms::owner_read |
                                         std::filesystem::perms::owner_write);
  const std::string log = dir + "/serve.log";
  // Serve writes its banner on stdout: run it through the shell to catch both streams.
  const std::string cmd = kBin + " serve --model " + TinyModel() +
                          " --port 0 --slots 1 --ctx 512 --backend cpu --threads 1 --api-key-file " +
                          keys + " >" + log + " 2>&1";
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), nullptr);
    _exit(127);
  }
  ASSERT_TRUE(WaitText(log, "cluster SERVING", pid, 120s)) << ReadFile(log);
  const std::string out = ReadFile(log);
  const std::string sched = BannerField(out, "scheduler");
  ASSERT_FALSE(sched.empty()) << out;
  const std::string key_file = BannerField(out, "internal key");
  ASSERT_FALSE(key_file.empty()) << out;
  struct stat st {};
  ASSERT_EQ(stat(key_file.c_str(), &st), 0) << key_file;
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // Straight to the scheduler without the key: refused, for Submit and for Drain.
  auto stub = pb::Scheduler::NewStub(gw::MakeChannel(sched));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    pb::SubmitRequest sub;
    sub.mutable_prompt_ids()->Add(kPrompt.begin(), kPrompt.end());
    sub.set_max_tokens(2);
    sub.set_priority(1000000);
    auto events = stub->Submit(&ctx, sub);
    pb::RequestEvent ev;
    EXPECT_FALSE(events->Read(&ev));
    EXPECT_EQ(events->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::ClusterStatus cs;
    EXPECT_EQ(stub->Drain(&ctx, v1::DrainRequest(), &cs).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // Through the gateway with the API key everything still works.
  {
    auto gen = v1::Generation::NewStub(gw::MakeChannel(BannerField(out, "generation")));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 60s);
    ctx.AddMetadata("authorization", "Bearer public-0123456789abcdef0123456789");
    auto reader = gen->Generate(&ctx, IdsRequest(kPrompt, 3));
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  kill(pid, SIGTERM);
  EXPECT_EQ(WaitExit(pid, 30s), 0) << ReadFile(log);
}

TEST(InternalPort, SchedulerClampsPriorityToThePublicRange) {
  // One slot: a long request holds it while two wait; the one sent first at priority 10 must be
  // admitted before a later one at priority 1000000 (clamped to 10: first come, first served).
  Cluster c({.slots = 1});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  auto stub = pb::Scheduler::NewStub(gw::MakeChannel(c.scheduler_addr()));
  std::atomic<int> order{0};
  auto submit = [&](int priority, uint32_t max_tokens, grpc::ClientContext* ctx) {
    pb::SubmitRequest sub;
    sub.mutable_prompt_ids()->Add(kPrompt.begin(), kPrompt.end());
    sub.set_max_tokens(max_tokens);
    sub.set_priority(priority);
    sub.set_ignore_eos(true);
    auto events = stub->Submit(ctx, sub);
    pb::RequestEvent ev;
    int admitted_as = -1;
    while (events->Read(&ev))
      if (ev.has_admitted() && admitted_as < 0) admitted_as = order.fetch_add(1);
    events->Finish().IgnoreError();
    return admitted_as;
  };
  grpc::ClientContext long_ctx, a_ctx, b_ctx;
  auto hold = std::async(std::launch::async, [&] { return submit(0, 3000, &long_ctx); });
  auto waiting = [&](uint32_t n) {
    const auto end = Clock::now() + 10s;
    while (Clock::now() < end) {
      const v1::ClusterStatus st = c.Status();
      if (st.running_requests() == 1 && st.waiting_requests() == n) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };
  ASSERT_TRUE(waiting(0));
  // The order is read on the client, one thread per stream, so the first request generates long
  // enough (hundreds of steps) that its admission event is read well before the second one's is
  // sent; with 4 tokens the two were a millisecond apart and a busy CI machine read them swapped.
  auto a = std::async(std::launch::async, [&] { return submit(10, 256, &a_ctx); });
  ASSERT_TRUE(waiting(1));
  auto b = std::async(std::launch::async, [&] { return submit(1000000, 4, &b_ctx); });
  ASSERT_TRUE(waiting(2));
  long_ctx.TryCancel();
  EXPECT_EQ(hold.get(), 0);
  const int a_at = a.get(), b_at = b.get();
  EXPECT_EQ(a_at, 1);
  EXPECT_EQ(b_at, 2) << "priority 1000000 jumped the queue";
}

// ---- 6. deltactl ----

const std::string kCtl = DS_DELTACTL_BIN;

CommandResult Ctl(const std::string& args) {
  return RunCommand("timeout 60 " + kCtl + " " + args + " 2>&1");
}

TEST(Deltactl, NumbersAreParsedStrictlyAndHelpExitsZero) {
  struct Bad {
    std::string args, says;
  };
  for (const Bad& b : std::vector<Bad>{
           {"set-slots 4294967297 --admin-addr 127.0.0.1:1", "4294967295"},
           {"set-slots 0 --admin-addr 127.0.0.1:1", "[1, "},
           {"set-slots -1 --admin-addr 127.0.0.1:1", "[1, "},
           {"generate --prompt hi --max-tokens 4294967297 --addr 127.0.0.1:1", "--max-tokens"},
           {"generate --prompt hi --timeout -5 --addr 127.0.0.1:1", "--timeout"},
           {"generate --prompt hi --priority 2147483648 --addr 127.0.0.1:1", "--priority"},
           {"generate --prompt hi --temperature nan --addr 127.0.0.1:1", "--temperature"},
           {"load --max-tokens 4294967297 --addr 127.0.0.1:1", "--max-tokens"},
           {"set-context --split pool --total 4294967296 --admin-addr 127.0.0.1:1", "--total"}}) {
    const CommandResult r = Ctl(b.args);
    EXPECT_EQ(r.exit_code, 1) << b.args << ": " << r.output;
    EXPECT_TRUE(Contains(r.output, b.says)) << b.args << ": " << r.output;
  }
  for (const std::string cmd : {"generate", "tokenize", "health", "status", "set-slots",
                                "set-context", "drain", "load"}) {
    const CommandResult r = Ctl(cmd + " --help");
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
    EXPECT_TRUE(Contains(r.output, "usage: deltactl")) << cmd << ": " << r.output;
  }
  for (const std::string role : {"serve", "gateway", "scheduler"}) {
    const CommandResult r = RunCommand(kBin + " " + role + " --help 2>&1");
    EXPECT_EQ(r.exit_code, 0) << role << ": " << r.output;
    EXPECT_TRUE(Contains(r.output, "usage: deltaserve " + role)) << role << ": " << r.output;
  }
}

TEST(Deltactl, ErrorsNameTheCodeAndTalkTls) {
  const std::string dir = TestDir() + "/ctl_tls";
  std::filesystem::create_directories(dir);
  const std::string cmd =
      "cd " + dir +
      " && openssl req -x509 -newkey rsa:2048 -nodes -keyout key.pem -out cert.pem -days 2 "
      "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl is required (tools/setup.sh)";
  gw::GatewayOptions o = InProcessOptions();
  o.tls_cert = dir + "/cert.pem";
  o.tls_key = dir + "/key.pem";
  auto gw = gw::Gateway::Start(o);
  ASSERT_TRUE(gw.ok()) << gw.status();
  const std::string pub = "localhost:" + std::to_string((*gw)->port());
  const std::string admin = "127.0.0.1:" + std::to_string((*gw)->admin_port());

  CommandResult r = Ctl("tokenize --prompt hello --addr " + pub + " --ca-file " + dir + "/cert.pem");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.output.empty());
  r = Ctl("tokenize --prompt hello --addr 127.0.0.1:" + std::to_string((*gw)->port()) +
          " --ca-file " + dir + "/cert.pem --server-name localhost");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // load over TLS reaches the gateway (its answer: no scheduler behind it); plaintext does not.
  r = Ctl("load --requests 1 --prompt-len 3 --max-tokens 2 --addr " + pub + " --ca-file " + dir +
          "/cert.pem");
  EXPECT_TRUE(Contains(r.output, "first UNAVAILABLE: ")) << r.output;
  EXPECT_FALSE(Contains(r.output, "failed to connect")) << r.output;
  CommandResult plain = Ctl("load --requests 1 --prompt-len 3 --max-tokens 2 --addr " + pub);
  EXPECT_TRUE(Contains(plain.output, "first UNAVAILABLE: failed to connect")) << plain.output;
  r = Ctl("tokenize --prompt hello --addr " + pub);  // plaintext to a TLS listener
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "deltactl: UNAVAILABLE: ")) << r.output;
  // Admin rpcs against the public port: the code by name and a hint, not "(gRPC code 12)".
  r = Ctl("status --admin-addr 127.0.0.1:" + std::to_string((*gw)->port()));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(Contains(r.output, "gRPC code")) << r.output;
  EXPECT_TRUE(Contains(r.output, "deltactl: ")) << r.output;
  // The admin listener with no scheduler behind it: UNAVAILABLE naming the scheduler.
  r = Ctl("status --admin-addr " + admin);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "UNAVAILABLE: scheduler unreachable at 127.0.0.1:1")) << r.output;
  (*gw)->Shutdown();
}

TEST(Deltactl, ErrorsCarryThePublicIdAndLoadSaysWhy) {
  Cluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  // The scheduler's refusal names its own numeric id; the client sees its public one.
  Drain(c.admin_addr(), false);
  CommandResult r = Ctl("generate --prompt-ids 1,2,3 --max-tokens 2 --addr " + c.addr());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "[gw-")) << r.output;
  EXPECT_TRUE(Contains(r.output, "UNAVAILABLE: request gw-")) << r.output;
  r = Ctl("generate --prompt-ids 1,2,3 --max-tokens 2 --request-id mine-1 --addr " + c.addr());
  EXPECT_TRUE(Contains(r.output, "request mine-1: ")) << r.output;
  Drain(c.admin_addr(), true);
  // load: the failures' reason, not just their count.
  r = Ctl("load --requests 2 --concurrency 1 --prompt-len 5000 --max-tokens 8 --addr " + c.addr());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "INVALID_ARGUMENT: prompt")) << r.output;
}

TEST(Deltactl, AKilledSchedulerIsAClearUnavailable) {
  Cluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  ASSERT_EQ(kill(c.Pid("scheduler"), SIGKILL), 0);
  WaitExit(c.Pid("scheduler"), 5s);
  GenResult g = c.Generate(IdsRequest(kPrompt, 4));
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(Contains(g.status.error_message(), "scheduler unreachable at " + c.scheduler_addr()))
      << g.status.error_message();
  const CommandResult r = Ctl("status --admin-addr " + c.admin_addr());
  EXPECT_TRUE(Contains(r.output, "UNAVAILABLE: scheduler unreachable")) << r.output;
}

// ---- 7. small lies ----

TEST(SmallLies, SixteenSlotsOnCpuAreSixteenAndFailoverLogsStructured) {
  Cluster c({.slots = 16, .scheduler_args = {"--failover-wait", "30"}});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  int active = 0;
  const v1::ClusterStatus st = c.Status();
  for (const auto& sl : st.slots()) active += !sl.retiring();
  EXPECT_EQ(active, 16) << "--slots 16 on a CPU worker";
  // A held request (failover) is logged through common/log, not a bare stderr line.
  auto inflight = std::async(std::launch::async, [&] {
    return c.Generate(IdsRequest(kPrompt, 3000), 4s);
  });
  const auto end = Clock::now() + 10s;
  while (Clock::now() < end && c.Status().running_requests() == 0)
    std::this_thread::sleep_for(10ms);
  ASSERT_EQ(kill(c.worker_pid(), SIGKILL), 0);
  inflight.get();
  const std::string log = c.Log("scheduler");
  EXPECT_TRUE(Contains(log, "event=holding_for_replacement")) << log;
  EXPECT_FALSE(Contains(log, "[scheduler]")) << log;
}

// ---- 8. server reflection ----

// grpc.reflection.v1alpha list_services over a generic bidi call (no reflection client library
// ships with Debian's grpc++); returns the raw response bytes (service names appear verbatim).
std::string ListServicesRaw(const std::string& addr) {
  grpc::GenericStub stub(gw::MakeChannel(addr));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  auto wait = [&](intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok && reinterpret_cast<intptr_t>(tag) == want;
  };
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  if (!wait(1)) return "";
  // ServerReflectionRequest { list_services = "" } : field 7, length-delimited, empty.
  const char req[] = {0x3a, 0x00};
  grpc::Slice slice(req, sizeof req);
  grpc::ByteBuffer out(&slice, 1), in;
  call->Write(out, reinterpret_cast<void*>(2));
  if (!wait(2)) return "";
  call->Read(&in, reinterpret_cast<void*>(3));
  if (!wait(3)) return "";
  call->WritesDone(reinterpret_cast<void*>(4));
  wait(4);
  grpc::Status s;
  call->Finish(&s, reinterpret_cast<void*>(5));
  wait(5);
  std::vector<grpc::Slice> slices;
  if (!in.Dump(&slices).ok()) return "";
  std::string raw;
  for (const grpc::Slice& sl : slices)
    raw.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  return raw;
}

TEST(Reflection, PublicAndAdminListenersListTheirServices) {
  auto gw = gw::Gateway::Start(InProcessOptions());
  ASSERT_TRUE(gw.ok()) << gw.status();
  const std::string pub = ListServicesRaw("127.0.0.1:" + std::to_string((*gw)->port()));
  EXPECT_TRUE(Contains(pub, "deltaserve.v1.Generation")) << pub;
  EXPECT_TRUE(Contains(pub, "grpc.health.v1.Health")) << pub;
  const std::string admin = ListServicesRaw("127.0.0.1:" + std::to_string((*gw)->admin_port()));
  EXPECT_TRUE(Contains(admin, "deltaserve.v1.Admin")) << admin;
  (*gw)->Shutdown();
}

}  // namespace
}  // namespace ds
