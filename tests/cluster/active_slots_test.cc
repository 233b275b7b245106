// Issue #23, recurrent state per active slot, through the cluster: a worker with --max-active 2
// holds state for two sequences; the scheduler runs its replica with two slots (the status shows
// two), and four concurrent requests all complete with the tokens of single-process generate.
#include <gtest/gtest.h>

#include <cstdio>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/cluster/gateway_cluster.h"

namespace ds::cluster_test {
namespace {

std::vector<int32_t> PlainGreedy(const std::string& model, const std::vector<int32_t>& prompt,
                                 int max_tokens) {
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

TEST(ActiveSlots, TwoSequencesOfStateServeFourRequests) {
  ClusterOptions o;
  o.slots = 4;
  o.ctx = 2048;
  o.worker_args = {"--max-active", "2"};
  Cluster c(o);
  ASSERT_TRUE(c.WaitHealth(gw::Health::kServing, 60s));
  EXPECT_EQ(c.Status().slots_size(), 2) << "the replica runs as many slots as the worker holds state for";
  constexpr int kMax = 12;
  const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7}, {9, 10}, {11, 12, 13, 14}, {3}};
  std::vector<std::future<GenResult>> fs;
  for (const auto& p : prompts)
    fs.push_back(std::async(std::launch::async, [&c, p] { return c.Generate(IdsRequest(p, kMax)); }));
  for (size_t i = 0; i < fs.size(); ++i) {
    GenResult r = fs[i].get();
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids, PlainGreedy(c.model(), prompts[i], kMax)) << "prompt " << i;
  }
}

}  // namespace
}  // namespace ds::cluster_test
