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
    EXPECT_EQ(r.ids, GenerateTokens(c.model(), prompts[i], kMax)) << "prompt " << i;
  }
}

}  // namespace
}  // namespace ds::cluster_test
