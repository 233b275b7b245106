// Gateway end to end: real `deltaserve scheduler`, `worker` and `gateway` processes on loopback
// with a tiny synthesized model, driven through the public API (deltaserve.v1) and grpc.health.v1.
// Every test starts its own cluster on free ports (port files) and kills it in TearDown.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "deltaserve/v1/deltaserve.grpc.pb.h"
#include "gateway/client.h"
#include "tests/cluster/gateway_cluster.h"
#include "tools/synth/synth.h"

namespace ds {
namespace {

namespace v1 = deltaserve::v1;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using namespace cluster_test;

// Single-process reference: `deltaserve generate --json` (greedy).
nlohmann::json ReferenceGenerate(const std::string& prompt_flag, const std::string& prompt,
                                 int max_tokens, bool ignore_eos) {
  std::string cmd = kBin + " generate --model " + TinyModel() + " " + prompt_flag + " '" + prompt +
                    "' --max-tokens " + std::to_string(max_tokens) +
                    " --backend cpu --threads 1 --json" + (ignore_eos ? " --ignore-eos" : "") +
                    " 2>/dev/null";
  const CommandResult r = RunCommand(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd;
  return nlohmann::json::parse(r.output, nullptr, false);
}

TEST(Gateway, HealthServingOnlyAfterWarmup) {
  Cluster c({.start_worker = false});
  // No worker: the scheduler answers but is not serving; several polls must agree.
  std::this_thread::sleep_for(700ms);
  EXPECT_EQ(c.Health(), gw::Health::kNotServing);
  GenResult r = c.Generate(IdsRequest(kPrompt, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_FALSE(r.started);
  c.StartWorker();
  EXPECT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  const v1::ClusterStatus st = c.Status();
  EXPECT_TRUE(st.serving());
  ASSERT_EQ(st.workers_size(), 1);
  EXPECT_TRUE(st.workers(0).ready());
  EXPECT_GT(st.workers(0).warmup_decode_tokens_per_second(), 0);
  r = c.Generate(IdsRequest(kPrompt, 4));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
}

TEST(Gateway, ConcurrentIdenticalGreedyRequestsMatchSingleProcessGenerate) {
  Cluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  constexpr int kMax = 24;
  const nlohmann::json ref = ReferenceGenerate("--prompt-ids", Join(kPrompt), kMax, true);
  ASSERT_TRUE(ref.is_object());
  const std::vector<int32_t> want = ref["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(want.size(), static_cast<size_t>(kMax));

  constexpr int kN = 4;
  std::vector<std::future<GenResult>> fs;
  for (int i = 0; i < kN; ++i)
    fs.push_back(std::async(std::launch::async, [&] {
      v1::GenerateRequest req = IdsRequest(kPrompt, kMax);
      req.set_logprobs(3);
      return c.Generate(req);
    }));
  for (auto& f : fs) {
    GenResult r = f.get();
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_TRUE(r.started);
    EXPECT_EQ(r.ids, want);
    EXPECT_EQ(r.text, ref["text"].get<std::string>());
    EXPECT_EQ(r.n_logprobs, kMax);
    EXPECT_EQ(r.fin.reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(r.fin.usage().prompt_tokens(), kPrompt.size());
    EXPECT_EQ(r.fin.usage().completion_tokens(), static_cast<uint32_t>(kMax));
    EXPECT_GT(r.fin.timings().total_seconds(), 0);
    EXPECT_GT(r.fin.timings().time_to_first_token_seconds(), 0);
  }

  // Text prompt: tokenized at the gateway exactly like `generate --prompt` (EOS honoured).
  const nlohmann::json ref_text = ReferenceGenerate("--prompt", "Hello, deltaserve!", 16, false);
  v1::GenerateRequest req;
  req.set_text("Hello, deltaserve!");
  req.set_max_tokens(16);
  GenResult r = c.Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids, ref_text["tokens"].get<std::vector<int32_t>>());
  EXPECT_EQ(r.text, ref_text["text"].get<std::string>());
}

// Polls admin status until `pred` holds (or the timeout).
bool WaitStatus(Cluster& c, const std::function<bool(const v1::ClusterStatus&)>& pred,
                std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (pred(c.Status())) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

int BusySlots(const v1::ClusterStatus& st) {
  int n = 0;
  for (const auto& s : st.slots()) n += s.request_id() != 0;
  return n;
}

TEST(Gateway, ClientCancelAndDeadlineFreeTheSlotWhileOthersComplete) {
  Cluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  // A long request that must finish normally while the others are cancelled around it.
  auto other =
      std::async(std::launch::async, [&] { return c.Generate(IdsRequest(kPrompt, 3000)); });
  ASSERT_TRUE(WaitStatus(
      c, [](const auto& st) { return st.running_requests() == 1; }, 10s));

  // Client cancel after a few chunks.
  GenResult cancelled = Cluster::Generate(c.addr(), IdsRequest(kPrompt, 3000), 60s,
                                          [](const GenResult& r) { return r.n_chunks >= 5; });
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  const auto t_cancel = Clock::now();
  EXPECT_TRUE(WaitStatus(
      c, [](const auto& st) { return st.running_requests() <= 1; }, 2s))
      << "the cancelled request still holds a slot";
  const double free_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_cancel).count();
  std::fprintf(stderr, "slot freed %.1f ms after the client cancelled\n", free_ms);

  // Deadline expiry mid-stream.
  GenResult expired = Cluster::Generate(c.addr(), IdsRequest(kPrompt, 3000), 300ms);
  EXPECT_EQ(expired.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << expired.status.error_message();
  EXPECT_TRUE(WaitStatus(
      c, [](const auto& st) { return st.running_requests() <= 1; }, 2s))
      << "the expired request still holds a slot";

  GenResult o = other.get();
  EXPECT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.fin.reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(o.ids.size(), 3000u);
  EXPECT_TRUE(WaitStatus(
      c, [](const auto& st) { return BusySlots(st) == 0; }, 2s));
}

TEST(Gateway, OverloadIsRejectedAtOnceWhileAdmittedRequestsComplete) {
  Cluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  // A second gateway on the same scheduler with two permits.
  const auto [addr, admin] = c.StartGateway(2);
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 10s, addr));
  std::vector<std::future<GenResult>> admitted;
  for (int i = 0; i < 2; ++i)
    admitted.push_back(std::async(std::launch::async, [&, addr = addr] {
      return Cluster::Generate(addr, IdsRequest(kPrompt, 1500));
    }));
  ASSERT_TRUE(WaitStatus(
      c, [](const auto& st) { return st.running_requests() == 2; }, 10s));
  for (int i = 0; i < 3; ++i) {
    GenResult r = Cluster::Generate(addr, IdsRequest(kPrompt, 8));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(r.status.error_message().find("server overloaded: 2 requests in flight"),
              std::string::npos)
        << r.status.error_message();
    EXPECT_LT(r.seconds, 0.5) << "rejection must not wait";
    EXPECT_FALSE(r.started);
  }
  for (auto& f : admitted) {
    GenResult r = f.get();
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids.size(), 1500u);
  }
  // Permits come back when requests end.
  EXPECT_TRUE(Cluster::Generate(addr, IdsRequest(kPrompt, 4)).status.ok());
}

TEST(Gateway, SetSlotsAndContextPolicyAtRunTimeUnderLoad) {
  Cluster c({.slots = 4, .ctx = 4096});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  std::vector<std::future<GenResult>> load;
  for (int i = 0; i < 4; ++i)
    load.push_back(
        std::async(std::launch::async, [&] { return c.Generate(IdsRequest(kPrompt, 400)); }));
  ASSERT_TRUE(WaitStatus(
      c, [](const auto& st) { return st.running_requests() >= 2; }, 10s));

  auto admin = v1::Admin::NewStub(gw::MakeChannel(c.admin_addr()));
  {
    grpc::ClientContext ctx;
    v1::SetSlotsRequest req;
    req.set_slots(2);
    v1::ClusterStatus st;
    grpc::Status s = admin->SetSlots(&ctx, req, &st);
    ASSERT_TRUE(s.ok()) << s.error_message();
    int active = 0;
    for (const auto& sl : st.slots()) active += !sl.retiring();
    EXPECT_EQ(active, 2);
  }
  {
    grpc::ClientContext ctx;
    v1::SetContextPolicyRequest req;
    req.mutable_policy()->set_split(v1::CONTEXT_SPLIT_POOL);
    req.mutable_policy()->set_total_context(4096);
    req.mutable_policy()->set_slot_cap(512);
    v1::ClusterStatus st;
    grpc::Status s = admin->SetContextPolicy(&ctx, req, &st);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(st.context_policy().split(), v1::CONTEXT_SPLIT_POOL);
    EXPECT_EQ(st.context_policy().slot_cap(), 512u);
  }
  {
    grpc::ClientContext ctx;
    v1::SetSlotsRequest req;
    req.set_slots(0);
    v1::ClusterStatus st;
    EXPECT_FALSE(admin->SetSlots(&ctx, req, &st).ok()) << "0 slots must be refused";
  }
  // Shrinking never kills running requests.
  for (auto& f : load) {
    GenResult r = f.get();
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids.size(), 400u);
  }
  // The new per-slot cap (512) applies to new admissions, checked at the gateway once polled.
  std::this_thread::sleep_for(500ms);
  GenResult big = c.Generate(IdsRequest(kPrompt, 600));
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(big.status.error_message().find("max_tokens"), std::string::npos)
      << big.status.error_message();
  GenResult fits = c.Generate(IdsRequest(kPrompt, 400));
  EXPECT_TRUE(fits.status.ok()) << fits.status.error_message();
  const v1::ClusterStatus st = c.Status();
  int active = 0;
  for (const auto& sl : st.slots()) active += !sl.retiring();
  EXPECT_EQ(active, 2);
}

TEST(Gateway, BadRequestsAreInvalidArgumentAndDoNotDisturbAGoodOne) {
  Cluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  const nlohmann::json ref = ReferenceGenerate("--prompt-ids", Join(kPrompt), 200, true);
  auto good = std::async(std::launch::async, [&] { return c.Generate(IdsRequest(kPrompt, 200)); });

  struct Bad {
    const char* what;
    v1::GenerateRequest req;
    const char* field;
  };
  std::vector<Bad> bad;
  auto add = [&](const char* what, const char* field, auto fill) {
    v1::GenerateRequest r = IdsRequest(kPrompt, 8);
    fill(r);
    bad.push_back({what, r, field});
  };
  add("no prompt", "prompt", [](auto& r) { r.clear_token_ids(); });
  add("empty text", "text", [](auto& r) { r.set_text(""); });
  add("empty ids", "token_ids", [](auto& r) { r.mutable_token_ids()->clear_ids(); });
  add("unknown id", "token_ids.ids[1]", [](auto& r) { r.mutable_token_ids()->set_ids(1, 100000); });
  add("max_tokens", "max_tokens", [](auto& r) { r.set_max_tokens(5000); });
  add("temperature", "temperature", [](auto& r) { r.mutable_sampling()->set_temperature(-0.5f); });
  add("top_p", "top_p", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); });
  add("presence", "presence_penalty",
      [](auto& r) { r.mutable_sampling()->set_presence_penalty(2.5f); });
  add("role", "chat.messages[0].role", [](auto& r) {
    auto* m = r.mutable_chat()->add_messages();
    m->set_role("wizard");
    m->set_content("hi");
  });
  add("logprobs", "logprobs", [](auto& r) { r.set_logprobs(21); });
  add("priority", "priority", [](auto& r) { r.set_priority(11); });
  add("many stops", "stop", [](auto& r) {
    for (int i = 0; i < 17; ++i) r.add_stop("s" + std::to_string(i));
  });
  add("long stop", "stop[0]", [](auto& r) { r.add_stop(std::string(300, 'x')); });
  add("stop id", "stop_token_ids[0]", [](auto& r) { r.add_stop_token_ids(-4); });
  for (const Bad& b : bad) {
    GenResult r = c.Generate(b.req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.what;
    EXPECT_NE(r.status.error_message().find(b.field), std::string::npos)
        << b.what << ": '" << r.status.error_message() << "' does not name " << b.field;
    EXPECT_FALSE(r.started) << b.what;
  }
  GenResult g = good.get();
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.ids, ref["tokens"].get<std::vector<int32_t>>());
}

TEST(Gateway, StopStringsAndStopIdsEndWithReasonStop) {
  Cluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  GenResult base = c.Generate(IdsRequest(kPrompt, 64));
  ASSERT_TRUE(base.status.ok()) << base.status.error_message();
  ASSERT_EQ(base.ids.size(), 64u);

  // Stop id: the 10th generated token; generation ends at its first occurrence, id included.
  const int32_t stop_id = base.ids[9];
  v1::GenerateRequest req = IdsRequest(kPrompt, 64);
  req.add_stop_token_ids(stop_id);
  GenResult r = c.Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.fin.reason(), v1::FINISH_REASON_STOP);
  const size_t first = std::find(base.ids.begin(), base.ids.end(), stop_id) - base.ids.begin();
  EXPECT_EQ(r.ids, std::vector<int32_t>(base.ids.begin(), base.ids.begin() + first + 1));
  EXPECT_EQ(r.fin.usage().completion_tokens(), first + 1);

  // Stop string: two ASCII letters from the middle of the greedy text.
  size_t pos = std::string::npos;
  for (size_t i = base.text.size() / 3; i + 1 < base.text.size(); ++i)
    if (std::isalpha(static_cast<unsigned char>(base.text[i])) &&
        std::isalpha(static_cast<unsigned char>(base.text[i + 1]))) {
      pos = i;
      break;
    }
  ASSERT_NE(pos, std::string::npos) << "no ASCII letters in: " << base.text;
  const std::string stop = base.text.substr(pos, 2);
  req = IdsRequest(kPrompt, 64);
  req.add_stop("never-there");
  req.add_stop(stop);
  r = c.Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.fin.reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(r.fin.stop_string(), stop);
  EXPECT_EQ(r.text, base.text.substr(0, base.text.find(stop)));
  EXPECT_LT(r.ids.size(), base.ids.size());
  EXPECT_EQ(r.fin.usage().completion_tokens(), r.ids.size());
  // The scheduler was told to finish: the slot is free again.
  EXPECT_TRUE(WaitStatus(
      c, [](const auto& st) { return BusySlots(st) == 0; }, 2s));
}

TEST(Gateway, WorkerExitMakesHealthNotServingAndRequestsUnavailable) {
  Cluster c({});
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  auto inflight =
      std::async(std::launch::async, [&] { return c.Generate(IdsRequest(kPrompt, 3000)); });
  ASSERT_TRUE(WaitStatus(
      c, [](const auto& st) { return st.running_requests() == 1; }, 10s));
  ASSERT_EQ(kill(c.worker_pid(), SIGKILL), 0);
  GenResult r = inflight.get();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_TRUE(c.WaitHealth(gw::Health::kNotServing, 3s));
  GenResult after = c.Generate(IdsRequest(kPrompt, 4));
  EXPECT_EQ(after.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << after.status.error_message();
  // A replacement worker brings the cluster back.
  c.StartWorker();
  EXPECT_TRUE(c.WaitHealth(gw::Health::kServing, 30s));
  EXPECT_TRUE(c.Generate(IdsRequest(kPrompt, 4)).status.ok());
}

TEST(Gateway, TokenizeMatchesTheModelTokenizer) {
  Cluster c({.start_worker = false});
  auto stub = v1::Generation::NewStub(gw::MakeChannel(c.addr()));
  grpc::ClientContext ctx;
  v1::TokenizeRequest req;
  req.set_text("Hello");
  v1::TokenizeResponse resp;
  ASSERT_TRUE(stub->Tokenize(&ctx, req, &resp).ok());
  EXPECT_GT(resp.ids_size(), 0);
  grpc::ClientContext ctx2;
  v1::TokenizeRequest bad;
  v1::TokenizeResponse resp2;
  EXPECT_EQ(stub->Tokenize(&ctx2, bad, &resp2).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(Serve, DemoRunsOneStreamedGenerationAndExitsCleanly) {
  const std::string cmd = kBin + " serve --model " + TinyModel() +
                          " --port 0 --slots 2 --ctx 1024 --backend cpu --threads 1 --demo "
                          "'Hello, deltaserve!' --demo-max-tokens 16 2>&1";
  const auto [rc, out] = RunCommand(cmd);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("cluster SERVING"), std::string::npos) << out;
  EXPECT_NE(out.find("prompt: Hello, deltaserve!"), std::string::npos) << out;
  EXPECT_NE(out.find("generated 16 tok"), std::string::npos) << out;
  // The worker's structured log line (common/log): a clean exit after the scheduler's Shutdown.
  EXPECT_NE(out.find("component=worker event=exiting"), std::string::npos) << out;
  EXPECT_NE(out.find("reason=shutdown"), std::string::npos) << out;
}

// The quick start (tools/quickstart.sh) on the committed demo model: a continuation and a chat
// answer come back through the cluster, and both read as English words, not the byte noise of
// random weights.
TEST(Serve, QuickStartDemoModelAnswersInEnglish) {
  const std::string cmd = kBin +
                          " serve --model demo --port 0 --slots 2 --ctx 1024 --backend cpu --threads 1 "
                          "--demo 'The old man looked at the sea and' --demo-chat 'Tell me about the "
                          "house by the river.' --demo-max-tokens 32 2>/dev/null";
  const auto [rc, out] = RunCommand(cmd);
  ASSERT_EQ(rc, 0) << out;
  const std::string pm = "prompt: The old man looked at the sea and\n";
  const std::string cm = "chat, user: Tell me about the house by the river.\nassistant: ";
  const size_t p = out.find(pm);
  const size_t c = out.find(cm);
  ASSERT_NE(p, std::string::npos) << out;
  ASSERT_NE(c, std::string::npos) << out;
  auto english = [](const std::string& text) {
    int letters = 0, words = 0, in_word = 0;
    for (char ch : text) {
      const bool alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
      letters += alpha || ch == ' ' || ch == ',' || ch == '.' || ch == '\'' || ch == '"' || ch == '\n';
      if (alpha) {
        ++in_word;
      } else {
        words += in_word >= 2;
        in_word = 0;
      }
    }
    return text.size() > 40 && letters >= 0.9 * text.size() && words >= 8;
  };
  ASSERT_LT(p, c);
  const std::string cont = out.substr(p + pm.size(), c - p - pm.size());
  const std::string answer = out.substr(c + cm.size());
  EXPECT_TRUE(english(cont)) << cont;
  EXPECT_TRUE(english(answer)) << answer;
}

}  // namespace
}  // namespace ds
