// The MTP cost benchmark's shapes (tools/bench/mtp_cost.h, `deltaserve bench --mtp`) run on any
// backend with MTP: on the CPU backend over the tiny model, every shape is timed — the draft-chain
// cycle and its deferred form (Backend::MtpDraftDeferred) included — and the slots end with no
// speculative step or deferred drafts pending, so the caller's next plain step runs.
#include "tools/bench/mtp_cost.h"

#include <gtest/gtest.h>

#include "tests/model/test_util.h"
#include "worker/model/cpu_backend.h"

namespace ds {
namespace {

TEST(MtpCost, EveryShapeIsTimedOnTheCpuBackend) {
  MtpCostOptions o;
  o.streams = 2;
  o.k = 2;
  o.depth = 16;
  o.iters = 2;
  BackendOptions bo;
  bo.n_slots = o.streams;
  bo.slot_ctx = MtpCostSlotCtx(o);
  bo.n_threads = 2;
  auto be = CpuBackend::Create(testing::TinyModelPath(), bo);
  ASSERT_TRUE(be.ok()) << be.status();
  ASSERT_TRUE((*be)->SupportsDraftChain());
  auto c = MeasureMtpCost(**be, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_GT(c->decode_ms, 0);
  EXPECT_GT(c->verify_dev_ms, 0);
  EXPECT_GT(c->verify_host_ms, 0);
  EXPECT_GT(c->cycle_ms, 0);
  EXPECT_GT(c->cycle_deferred_ms, 0);
  EXPECT_GT(c->rows1_ms, 0);
  EXPECT_GT(c->step_ms, 0);
  for (int i = 0; i < o.streams; ++i) {
    SeqStep s;
    s.slot = i;
    s.pos0 = (*be)->SlotLength(i);
    s.tokens = {5};
    StepOutput out;
    const absl::Status st = (*be)->Forward({&s, 1}, {}, &out);
    EXPECT_TRUE(st.ok()) << "slot " << i << ": " << st;
  }
}

}  // namespace
}  // namespace ds
