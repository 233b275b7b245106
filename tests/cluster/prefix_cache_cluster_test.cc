// Prefix cache (issue #17) through the cluster (scheduler + worker + gateway processes, the tiny
// model on the CPU, the cache on by default): a chat's second turn resumes from the state its
// first turn ended with — the status shows the hit and the tokens it did not prefill — and both
// turns give the tokens of single-process generate; with --prefix-cache off nothing is cached
// and the tokens are the same.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/cluster/gateway_cluster.h"

namespace ds::cluster_test {
namespace {

std::vector<int32_t> Ids(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 29 + salt * 13) % 200 + 5);
  return p;
}

// Two turns; returns the second turn's status of replica 0.
v1::PrefixCacheStatus Chat(const std::vector<std::string>& worker_args) {
  ClusterOptions o;
  o.slots = 2;
  o.ctx = 2048;
  o.worker_args = worker_args;
  Cluster c(o);
  EXPECT_TRUE(c.WaitHealth(gw::Health::kServing, 60s));
  constexpr int kMax = 8;
  const std::vector<int32_t> p1 = Ids(120, 1);
  GenResult r1 = c.Generate(IdsRequest(p1, kMax));
  EXPECT_TRUE(r1.status.ok()) << r1.status.error_message();
  EXPECT_EQ(r1.ids, GenerateTokens(c.model(), p1, kMax));
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), r1.ids.begin(), r1.ids.end());
  const std::vector<int32_t> user = Ids(15, 2);
  p2.insert(p2.end(), user.begin(), user.end());
  GenResult r2 = c.Generate(IdsRequest(p2, kMax));
  EXPECT_TRUE(r2.status.ok()) << r2.status.error_message();
  EXPECT_EQ(r2.ids, GenerateTokens(c.model(), p2, kMax));
  const v1::ClusterStatus st = c.Status();
  EXPECT_EQ(st.workers_size(), 1);
  return st.workers_size() ? st.workers(0).prefix_cache() : v1::PrefixCacheStatus{};
}

TEST(PrefixCacheCluster, SecondChatTurnResumesAndMatchesGenerate) {
  const v1::PrefixCacheStatus pc = Chat({});
  EXPECT_TRUE(pc.enabled());
  EXPECT_EQ(pc.tier(), "host");
  EXPECT_EQ(pc.lookups(), 2u);
  EXPECT_EQ(pc.hits(), 1u);
  // Turn 1's prompt and all of its answer but the last token (sampled, never computed).
  EXPECT_EQ(pc.tokens_saved(), 120u + 8u - 1u);
  EXPECT_GT(pc.bytes(), 0u);
  EXPECT_GT(pc.checkpoints(), 0u);
  EXPECT_EQ(pc.failures(), 0u);
}

TEST(PrefixCacheCluster, OffCachesNothingAndGivesTheSameTokens) {
  const v1::PrefixCacheStatus pc = Chat({"--prefix-cache", "off"});
  EXPECT_FALSE(pc.enabled());
  EXPECT_EQ(pc.hits(), 0u);
  EXPECT_EQ(pc.checkpoints(), 0u);
}

}  // namespace
}  // namespace ds::cluster_test
