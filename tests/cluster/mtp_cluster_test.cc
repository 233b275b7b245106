// MTP speculative decoding through the whole cluster (issue #15): a worker with --mtp 3 on the
// trained demo model behind the scheduler and the gateway. Greedy requests, alone and four at
// once (verifies beside other slots' prefills and decodes), stream exactly the tokens of
// single-process `generate` without MTP; the worker's drafts are accepted often enough that
// answers of several tokens cross the scheduler (the demo model's MTP head accepts ~60%).
#include <gtest/gtest.h>

#include <cstdio>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/util/model_alias.h"
#include "tests/cluster/gateway_cluster.h"

namespace ds::cluster_test {
namespace {


// The demo model behind one worker with --mtp 3, four slots; deferred: --deferred-drafts on
// (each slot's drafts left on the backend for its next verify, StepExecutor::SetDeferredDrafts;
// the default), else off.
ClusterOptions DemoMtp(bool deferred = false) {
  ClusterOptions o;
  o.model = ResolveModelAlias("demo");
  o.slots = 4;
  o.ctx = 1024;
  o.worker_args = {"--mtp", "3"};
  o.worker_args.insert(o.worker_args.end(), {"--deferred-drafts", deferred ? "on" : "off"});
  return o;
}

// The tests below run with the drafts waited for and deferred: the same tokens either way.
class MtpCluster : public ::testing::TestWithParam<bool> {};

TEST_P(MtpCluster, GreedyTokensEqualPlainGenerate) {
  const std::string model = ResolveModelAlias("demo");
  Cluster c(DemoMtp(GetParam()));
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 60s));
  constexpr int kMax = 48;
  const std::vector<std::vector<int32_t>> prompts = {
      {260, 1605, 479, 386}, {72, 101, 108, 108, 111, 44, 32}, {300, 301, 302}, {999, 5, 1200}};
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) {
    want.push_back(GenerateTokens(model, p, kMax));
    ASSERT_EQ(want.back().size(), static_cast<size_t>(kMax));
  }
  // One alone, then all four at once.
  GenResult one = c.Generate(IdsRequest(prompts[0], kMax));
  ASSERT_TRUE(one.status.ok()) << one.status.error_message();
  EXPECT_EQ(one.ids, want[0]);
  EXPECT_EQ(one.fin.usage().completion_tokens(), static_cast<uint32_t>(kMax));
  // Answers of several tokens crossed the scheduler: more than one token per decode step.
  EXPECT_GT(one.fin.timings().tokens_per_step(), 1.3);
  // Acceptance by draft position: each position judged at most as often as the one before it
  // kept its draft, and every kept draft is a token beyond one per answer (the length cut no
  // answer: the worker drafts within max_new_tokens).
  const v1::Timings& tm = one.fin.timings();
  ASSERT_GE(tm.drafts_judged_size(), 1);
  ASSERT_LE(tm.drafts_judged_size(), 3);
  ASSERT_EQ(tm.drafts_accepted_size(), tm.drafts_judged_size());
  uint32_t kept = 0;
  for (int j = 0; j < tm.drafts_judged_size(); ++j) {
    EXPECT_LE(tm.drafts_accepted(j), tm.drafts_judged(j)) << "position " << j;
    if (j > 0) EXPECT_LE(tm.drafts_judged(j), tm.drafts_accepted(j - 1)) << "position " << j;
    kept += tm.drafts_accepted(j);
  }
  const double answers = kMax / tm.tokens_per_step();
  EXPECT_NEAR(kMax - answers, kept, 1e-6);
  std::vector<std::future<GenResult>> fs;
  for (const auto& p : prompts)
    fs.push_back(std::async(std::launch::async, [&c, p] { return c.Generate(IdsRequest(p, kMax)); }));
  for (size_t i = 0; i < fs.size(); ++i) {
    GenResult r = fs[i].get();
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids, want[i]) << "prompt " << i;
    EXPECT_EQ(r.fin.reason(), v1::FINISH_REASON_LENGTH);
  }
  // The request's own switch: off (0) or at most one draft give the same tokens; 16 is refused.
  for (uint32_t k : {0u, 1u}) {
    v1::GenerateRequest req = IdsRequest(prompts[1], kMax);
    req.mutable_sampling()->set_mtp(k);
    GenResult r = c.Generate(req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids, want[1]) << "mtp " << k;
    if (k == 0) EXPECT_DOUBLE_EQ(r.fin.timings().tokens_per_step(), 1.0);
    if (k == 0) EXPECT_EQ(r.fin.timings().drafts_judged_size(), 0);
    if (k == 1) EXPECT_LE(r.fin.timings().drafts_judged_size(), 1);
  }
  v1::GenerateRequest bad = IdsRequest(prompts[1], kMax);
  bad.mutable_sampling()->set_mtp(16);
  GenResult r = c.Generate(bad);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("mtp"), std::string::npos) << r.status.error_message();
}

// Cancellation mid-draft: two greedy requests and one seeded, with MTP drafts pending at every
// step, are cancelled after a few tokens; the worker releases their slots with their drafts and
// the MTP rows, and the requests that follow (one per slot) stream exactly the tokens of
// single-process generate, while a request that ran beside the cancelled ones is unaffected.
TEST_P(MtpCluster, CancellingMidDraftLosesNothingForTheOthers) {
  const std::string model = ResolveModelAlias("demo");
  Cluster c(DemoMtp(GetParam()));
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 60s));
  constexpr int kMax = 40;
  const std::vector<int32_t> keep = {72, 101, 108, 108, 111, 44, 32};
  const std::vector<int32_t> after = {260, 1605, 479, 386};
  const std::vector<int32_t> want_keep = GenerateTokens(model, keep, kMax);
  const std::vector<int32_t> want_after = GenerateTokens(model, after, kMax);
  std::vector<std::future<GenResult>> cancelled;
  for (int i = 0; i < 3; ++i)
    cancelled.push_back(std::async(std::launch::async, [&c, i] {
      v1::GenerateRequest req = IdsRequest({300, 301, static_cast<int32_t>(302 + i)}, 800);
      if (i == 2) {
        req.mutable_sampling()->set_temperature(0.8f);
        req.mutable_sampling()->set_seed(11);
      }
      return Cluster::Generate(c.addr(), req, 60s,
                               [](const GenResult& r) { return r.ids.size() >= 9; });
    }));
  GenResult beside = c.Generate(IdsRequest(keep, kMax));
  for (auto& f : cancelled) {
    GenResult r = f.get();
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED) << r.status.error_message();
    EXPECT_GE(r.ids.size(), 9u);
    EXPECT_LT(r.ids.size(), 800u);
  }
  ASSERT_TRUE(beside.status.ok()) << beside.status.error_message();
  EXPECT_EQ(beside.ids, want_keep);
  std::vector<std::future<GenResult>> next;
  for (int i = 0; i < 4; ++i)
    next.push_back(std::async(std::launch::async,
                              [&c, &after] { return c.Generate(IdsRequest(after, kMax)); }));
  for (auto& f : next) {
    GenResult r = f.get();
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids, want_after);
  }
}

INSTANTIATE_TEST_SUITE_P(Drafts, MtpCluster, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "Deferred" : "Waited");
                         });

TEST(MtpWorker, RefusesAnMtpItCannotRun) {
  // 99 drafts is past what the CPU device verifies: the worker exits with a clear error instead
  // of serving.
  const std::string cmd = kBin + " worker --scheduler 127.0.0.1:1 --model demo --mtp 99 2>&1";
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), f)) out.append(buf, n);
  EXPECT_NE(pclose(f), 0);
  EXPECT_NE(out.find("--mtp"), std::string::npos) << out;
}

}  // namespace
}  // namespace ds::cluster_test
