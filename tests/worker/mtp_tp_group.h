// A TP group of in-process ranks (threads meeting through Gloo, tests/tp/gloo_ranks.h), each a
// backend of `kind` over its shard of the demo model with a StepExecutor running MTP, driven
// through the schedule of tests/worker/mtp_drive.h. Shared by the CPU test (CI) and the CUDA one
// (label gpu: the ranks share GPU 0 through a host-staged collective).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/util/model_alias.h"
#include "tests/tp/gloo_ranks.h"
#include "tests/worker/mtp_drive.h"
#include "worker/backend_factory.h"

namespace ds::worker::mtp_test {

inline BackendOptions TpOptions(int rank, int world, Collective* coll) {
  BackendOptions bo;
  bo.n_slots = 3;
  bo.slot_ctx = 256;
  bo.n_threads = 1;
  bo.tp_rank = rank;
  bo.tp_world = world;
  bo.collective = coll;
  bo.tp_align_heads = false;  // world 3: a rank without attention heads, one without GDN heads
  return bo;
}

// The collective a rank's backend takes, made from its Gloo group (CPU: the group itself).
using WrapCollective = std::function<std::unique_ptr<Collective>(int, std::unique_ptr<GlooCollective>)>;

// Every rank's outcome; k = 0: no MTP (the same group, plain steps).
inline std::vector<Outcome> RunTpGroup(const std::string& kind, int world, int k,
                                       float temperature, const std::string& name,
                                       const WrapCollective& wrap, bool follows = false) {
  std::vector<Outcome> out(world);
  RunRanks<Collective>(world, name, wrap, [&](int rank, Collective& g) {
    auto be = CreateBackend(kind, ResolveModelAlias("demo"), TpOptions(rank, world, &g),
                            SpeculativeRoom{k > 0 ? k + 1 : 0, 3});
    ASSERT_TRUE(be.ok()) << be.status();
    StepExecutor ex(be->get(), 3);
    ex.SetGroup(&g);
    ASSERT_TRUE(ex.SetMtp(spec::MtpSetting{k, false}).ok());
    out[rank] = DriveSteps(ex, (*be)->config().n_vocab, temperature, follows);
    EXPECT_FALSE(ex.group_broken()) << "rank " << rank;
  });
  return out;
}

}  // namespace ds::worker::mtp_test
