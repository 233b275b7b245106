// The memory planner (worker/runner/memory_planner.h): tables for the 27B shape on 16 / 32 / 80 /
// 141 GB cards with f16, q8_0 and q4_0 KV (printed: docs/memory.md quotes them), and its rules:
// a plan never exceeds the budget, operator numbers are honoured when they fit, a refusal names
// a nearest setting that does fit, and two replicas sharing a card each plan their share; and
// when the 16-bit weight copies are made (worker/runner/dense_weights_plan.h).
#include "worker/runner/memory_planner.h"

#include <cstdio>
#include <regex>

#include "gtest/gtest.h"
#include "worker/runner/dense_weights_plan.h"
#include "worker/model/kv_type.h"

namespace ds {
namespace {

constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kGB = 1000ull * 1000 * 1000;

// The 27B (spec/model.md §1): 64 layers, every 4th attention (16) with 4 KV heads of 256, 48 GDN
// layers with 16 key / 48 value heads of 128 and a conv ring of 4 rows x 10240 channels.
// Weights and workspace as the CUDA plan reported them on the H200 for the Q6_K file at
// --max-step-tokens 4096: 20.63 GiB, and 1.84 GiB of workspace at slot_ctx 640 (bench,
// 2026-12-01 ~14:45 UTC, decode attention partials sized by 256 decode rows; it was 8.46 GiB at
// slot_ctx 32768 with partials for all 4096 rows), of which 13,312 B per context token (prefill
// attention scratch). step_tokens: --max-step-tokens; the rest of the workspace is nearly all
// [step_tokens, width] buffers, so it scales with it.
MemoryPlanInput Qwen27B(GgmlType kv, double card_gb, double share = 1.0, int step_tokens = 4096) {
  MemoryPlanInput in;
  in.device_total = static_cast<uint64_t>(card_gb * kGB);
  in.device_free = in.device_total - (in.device_total / 100 + (300ull << 20));  // context + driver
  in.margin = (512ull << 20) + in.device_total / 100;  // as the CUDA device keeps free
  in.weights = static_cast<uint64_t>(20.63 * kGiB * share);
  in.workspace_per_ctx = 13312;
  in.workspace_fixed =
      static_cast<uint64_t>((1.84 * kGiB - 13312.0 * 640) * share * step_tokens / 4096.0);
  in.recurrent_per_slot =
      static_cast<uint64_t>(48 * (4ull * 10240 * 4 + 48ull * 128 * 128 * 4) * share);
  in.kv_per_token = static_cast<uint64_t>(16 * 2 * 4 * KvRowBytes(kv, 256) * share);
  in.page_size = 64;
  return in;
}

void ExpectWithinBudget(const MemoryPlan& p) {
  EXPECT_LE(p.total(), p.budget) << p.ToString();
  EXPECT_GE(p.pool_tokens(), p.slot_ctx) << p.ToString();  // one full context always fits
}

TEST(MemoryPlanner, Tables27B) {
  const GgmlType kvs[] = {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0};
  std::printf("%-6s %-6s %8s | %5s %12s %9s\n", "card", "kv", "ctx", "slots", "pool tokens",
              "GiB KV");
  for (double card : {16.0, 32.0, 80.0, 141.0}) {
    for (int64_t ctx : {4096, 32768, 131072}) {
      int64_t prev_pool = 0;
      int prev_slots = 0;
      for (GgmlType kv : kvs) {
        MemoryPlanInput in = Qwen27B(kv, card);
        in.slot_ctx = ctx;
        auto p = PlanMemory(in);
        if (card < 24) {
          // 20.6 GiB of weights: the 27B Q6_K never fits one 16 GB card (TP below).
          ASSERT_FALSE(p.ok());
          EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
          EXPECT_NE(p.status().message().find("weights and workspace alone"), std::string::npos)
              << p.status();
          continue;
        }
        if (!p.ok()) {
          std::printf("%-6.0f %-6s %8lld | does not fit: %s\n", card, KvTypeName(kv),
                      static_cast<long long>(ctx), std::string(p.status().message()).c_str());
          continue;
        }
        ExpectWithinBudget(*p);
        EXPECT_GE(p->slots, 1);
        EXPECT_LE(p->slots, 64);
        // A smaller KV type is never worse on both counts: it holds more tokens, or it buys
        // more slots (each slot's recurrent state then takes some of the memory).
        EXPECT_TRUE(p->pool_tokens() >= prev_pool || p->slots > prev_slots)
            << card << " GB " << KvTypeName(kv) << ": " << p->slots << " slots / "
            << p->pool_tokens() << " tokens after " << prev_slots << " / " << prev_pool;
        prev_pool = p->pool_tokens();
        prev_slots = p->slots;
        std::printf("%-6.0f %-6s %8lld | %5d %12lld %9.2f\n", card, KvTypeName(kv),
                    static_cast<long long>(ctx), p->slots,
                    static_cast<long long>(p->pool_tokens()), static_cast<double>(p->kv) / kGiB);
      }
    }
  }
  // 32 GB cards need shorter micro-steps (--max-step-tokens 1024: a quarter of the workspace).
  for (GgmlType kv : kvs) {
    MemoryPlanInput in = Qwen27B(kv, 32, 1.0, 1024);
    in.slot_ctx = 32768;
    auto p = PlanMemory(in);
    ASSERT_TRUE(p.ok()) << p.status();
    ExpectWithinBudget(*p);
    std::printf("32 GB, --max-step-tokens 1024, %-5s 32k ctx: %d slots, %lld pool tokens\n",
                KvTypeName(kv), p->slots, static_cast<long long>(p->pool_tokens()));
  }
  // The H200 cases: 4 slots x 32768 f16 and 131072 q4_0 now fit (the pool is shared).
  for (auto [ctx, kv] : {std::pair<int64_t, GgmlType>{32768, GgmlType::F16}, {131072, GgmlType::Q4_0}}) {
    MemoryPlanInput in = Qwen27B(kv, 141);
    in.slots = 64;  // the scheduler's default CUDA slot count
    in.slot_ctx = ctx;
    auto p = PlanMemory(in);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->slots, 64);
    ExpectWithinBudget(*p);
  }
  // The 2M-token q8_0 pool for 64 slots fits an H200.
  MemoryPlanInput big = Qwen27B(GgmlType::Q8_0, 141);
  big.slots = 64;
  big.slot_ctx = 131072;
  big.pool_tokens = 2000000;
  auto p = PlanMemory(big);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GE(p->pool_tokens(), 2000000);
}

TEST(MemoryPlanner, TensorParallelSeedCards) {
  // 2 x V100 32 GB, TP 2 (even split): each rank holds half of everything.
  for (GgmlType kv : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0}) {
    MemoryPlanInput in = Qwen27B(kv, 32, 0.5);
    in.slot_ctx = 200000;
    in.slots = 16;
    auto p = PlanMemory(in);
    ASSERT_TRUE(p.ok()) << KvTypeName(kv) << ": " << p.status();
    ExpectWithinBudget(*p);
    std::printf("2 x 32 GB TP2 %-5s: 16 slots x 200k: %lld pool tokens per rank\n", KvTypeName(kv),
                static_cast<long long>(p->pool_tokens()));
  }
  // 16 GB + 32 GB, TP split 1:2: the 16 GB rank holds a third.
  for (GgmlType kv : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0}) {
    MemoryPlanInput small = Qwen27B(kv, 16, 1.0 / 3), large = Qwen27B(kv, 32, 2.0 / 3);
    small.slot_ctx = large.slot_ctx = 65536;
    auto ps = PlanMemory(small), pl = PlanMemory(large);
    ASSERT_TRUE(ps.ok() && pl.ok()) << KvTypeName(kv) << ": " << ps.status() << " / " << pl.status();
    // Every rank holds the same tokens (its heads of each): the group's pool is the smaller one.
    std::printf("16 GB + 32 GB TP 1:2 %-5s: 64k ctx: %d / %d slots, %lld / %lld pool tokens\n",
                KvTypeName(kv), ps->slots, pl->slots, static_cast<long long>(ps->pool_tokens()),
                static_cast<long long>(pl->pool_tokens()));
  }
}

TEST(MemoryPlanner, HonoursOperatorNumbersOrNamesTheNearestThatFits) {
  MemoryPlanInput in = Qwen27B(GgmlType::F16, 80);
  in.slots = 8;
  in.slot_ctx = 32768;
  in.pool_tokens = 100000;
  auto p = PlanMemory(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->slots, 8);
  EXPECT_EQ(p->slot_ctx, 32768);
  EXPECT_EQ(p->pool_tokens(), 100032);  // whole pages
  ExpectWithinBudget(*p);

  in.pool_tokens = 2000000;  // 122 GiB of f16 KV on an 80 GB card
  auto no = PlanMemory(in);
  ASSERT_FALSE(no.ok());
  EXPECT_EQ(no.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(no.status().message());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(msg, m, std::regex("a KV pool of ([0-9]+) tokens"))) << msg;
  in.pool_tokens = std::stoll(m[1]);
  auto nearest = PlanMemory(in);
  ASSERT_TRUE(nearest.ok()) << nearest.status();  // the suggestion fits
  ExpectWithinBudget(*nearest);
  in.pool_tokens += 64;
  EXPECT_FALSE(PlanMemory(in).ok());  // and is the largest that does

  // A million-token context for 64 slots on 80 GB: the named --ctx (and --slots, if any) fit.
  MemoryPlanInput t = Qwen27B(GgmlType::F16, 80);
  t.slots = 64;
  t.slot_ctx = 1 << 20;
  auto r = PlanMemory(t);
  ASSERT_FALSE(r.ok());
  const std::string rm(r.status().message());
  if (std::regex_search(rm, m, std::regex("--slots ([0-9]+) at this context"))) {
    MemoryPlanInput u = t;
    u.slots = std::stoi(m[1]);
    EXPECT_TRUE(PlanMemory(u).ok()) << rm;
    ++u.slots;
    EXPECT_FALSE(PlanMemory(u).ok()) << rm;
  }
  ASSERT_TRUE(std::regex_search(rm, m, std::regex("--ctx ([0-9]+) with"))) << rm;
  MemoryPlanInput u = t;
  u.slot_ctx = std::stoll(m[1]);
  EXPECT_TRUE(PlanMemory(u).ok()) << rm;
  u.slot_ctx += 64;
  EXPECT_FALSE(PlanMemory(u).ok()) << rm;
}

TEST(MemoryPlanner, TwoReplicasOnOneCardEachPlanTheirShare) {
  MemoryPlanInput whole = Qwen27B(GgmlType::Q8_0, 141);
  whole.slot_ctx = 32768;
  MemoryPlanInput half = whole;
  half.memory_fraction = 0.5;
  auto a = PlanMemory(whole), b = PlanMemory(half);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_LE(2 * b->total(), whole.device_total);  // both replicas fit together
  EXPECT_LT(b->pool_tokens(), a->pool_tokens());
  // The second replica starts after the first took its half: what is free still bounds it.
  MemoryPlanInput second = half;
  second.device_free = whole.device_free - b->total();
  auto c = PlanMemory(second);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_LE(b->total() + c->total(), whole.device_free);
  EXPECT_FALSE(PlanMemory([&] { auto x = half; x.memory_fraction = 0; return x; }()).ok());
}

}  // namespace
}  // namespace ds

namespace ds {
namespace {

// Speculative entries (CudaBackendOptions::spec_tokens x spec_seqs) are recurrent state that does
// not scale with the slots: the 27B's 4 tokens x 8 sequences (32 x 150 MiB = 4.7 GiB) come out of
// the KV pool and count in the plan's recurrent figure; where they do not fit, a refusal.
TEST(MemoryPlanner, SpeculativeEntriesComeOutOfThePool) {
  MemoryPlanInput in = Qwen27B(GgmlType::F16, 141.0);
  in.slot_ctx = 131072;  // the pool is what fits, not capped by slots x context
  in.slots = 16;
  auto base = PlanMemory(in);
  ASSERT_TRUE(base.ok()) << base.status();
  const uint64_t entries = 32 * in.recurrent_per_slot;
  in.recurrent_fixed = entries;
  auto spec = PlanMemory(in);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ExpectWithinBudget(*spec);
  EXPECT_EQ(spec->recurrent, base->recurrent + entries);
  const double page_bytes = static_cast<double>(in.kv_per_token) * in.page_size;
  EXPECT_NEAR(static_cast<double>(base->pool_pages - spec->pool_pages), entries / page_bytes, 1.0);
  // A 32 GB card holds one 32k context, but not beside 64 entries (9.4 GiB).
  MemoryPlanInput small = Qwen27B(GgmlType::F16, 32.0);
  small.slot_ctx = 32768;
  small.slots = 1;
  ASSERT_TRUE(PlanMemory(small).ok());
  small.recurrent_fixed = 64 * small.recurrent_per_slot;
  EXPECT_EQ(PlanMemory(small).status().code(), absl::StatusCode::kResourceExhausted);
}

// Prefix-cache checkpoints in device memory (issue #17): a required budget comes out of the KV
// pool whole, or the plan is refused naming the flags; the auto tier takes at most a quarter of
// what the smallest plan leaves, so a small card keeps its pool.
TEST(MemoryPlanner, PrefixCacheBudgetComesOutOfThePool) {
  MemoryPlanInput in = Qwen27B(GgmlType::F16, 141.0);
  in.slot_ctx = 131072;
  in.slots = 16;
  auto base = PlanMemory(in);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->cache, 0u);
  const double page_bytes = static_cast<double>(in.kv_per_token) * in.page_size;

  MemoryPlanInput dev = in;
  dev.cache_bytes = 40 * kGiB;
  dev.cache_required = true;
  auto with = PlanMemory(dev);
  ASSERT_TRUE(with.ok()) << with.status();
  ExpectWithinBudget(*with);
  EXPECT_EQ(with->cache, 40 * kGiB);
  EXPECT_EQ(with->budget, base->budget);
  EXPECT_NEAR(static_cast<double>(base->pool_pages - with->pool_pages), 40.0 * kGiB / page_bytes, 1.0);
  EXPECT_NE(with->ToString().find("prefix cache 40.00"), std::string::npos) << with->ToString();

  // Auto: capped at a quarter of budget - (weights + workspace + 2 slots' state).
  MemoryPlanInput aut = dev;
  aut.cache_required = false;
  aut.cache_bytes = 100 * kGiB;
  auto a = PlanMemory(aut);
  ASSERT_TRUE(a.ok()) << a.status();
  ExpectWithinBudget(*a);
  const uint64_t left = base->budget - (in.weights + in.workspace_fixed + in.workspace_per_ctx * in.slot_ctx +
                                        2 * in.recurrent_per_slot);
  EXPECT_EQ(a->cache, left / 4);
  EXPECT_GT(a->pool_tokens(), a->slot_ctx);
  aut.cache_bytes = 4 * kGiB;  // smaller than the quarter: all of it
  EXPECT_EQ(PlanMemory(aut)->cache, 4 * kGiB);

  // A 32 GB card with one 32k context: 20 GiB required does not fit (the error names the
  // prefix-cache flags); auto leaves the context its pool.
  MemoryPlanInput small = Qwen27B(GgmlType::F16, 32.0);
  small.slot_ctx = 32768;
  small.slots = 1;
  small.cache_bytes = 20 * kGiB;
  small.cache_required = true;
  auto refused = PlanMemory(small);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("--prefix-cache-mb"), std::string::npos) << refused.status();
  small.cache_required = false;
  auto fits = PlanMemory(small);
  ASSERT_TRUE(fits.ok()) << fits.status();
  ExpectWithinBudget(*fits);
  EXPECT_GT(fits->cache, 0u);
  EXPECT_LT(fits->cache, 20 * kGiB);
}

// Dense weights (worker/runner/dense_weights_plan.h): the 27B's 16-bit copies are 45 GiB (every
// layer matrix, 2 bytes per weight). auto keeps them only where the plan without them would not
// give the KV pool or the prefix cache any of that memory; on charges them; off never does.
constexpr uint64_t kDense27B = 45ull * kGiB;

TEST(DenseWeightsPlan, AutoTakesOnlyMemoryTheSlotsCouldNeverUse) {
  // 141 GB, 16 slots of 32k: every context fits with the copies, so auto makes them and the
  // pool is exactly the pool without them (all 16 x 32k tokens).
  MemoryPlanInput in = Qwen27B(GgmlType::F16, 141.0);
  in.slots = 16;
  in.slot_ctx = 32768;
  auto plain = PlanMemory(in);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto a = PlanDenseWeights(in, kDense27B, DenseWeights::kAuto);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->dense) << a->reason;
  EXPECT_EQ(a->plan.pool_pages, plain->pool_pages);
  EXPECT_GE(a->plan.pool_tokens(), 16 * 32768);
  EXPECT_EQ(a->plan.weights, in.weights + kDense27B);
  ExpectWithinBudget(a->plan);
  EXPECT_NE(a->reason.find("auto: on"), std::string::npos) << a->reason;

  // 64 slots of 128k: without the copies the pool takes all it can get (less than every
  // context), so the copies would come out of it: auto leaves them out and plans as `off`.
  in.slots = 64;
  in.slot_ctx = 131072;
  plain = PlanMemory(in);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_LT(plain->pool_tokens(), int64_t{64} * 131072);
  a = PlanDenseWeights(in, kDense27B, DenseWeights::kAuto);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->dense);
  EXPECT_EQ(a->plan.pool_pages, plain->pool_pages);
  EXPECT_EQ(a->plan.weights, in.weights);
  EXPECT_NE(a->reason.find("shrink the KV pool"), std::string::npos) << a->reason;
  // on: the operator's choice, at the pool's expense.
  auto on = PlanDenseWeights(in, kDense27B, DenseWeights::kOn);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->dense);
  EXPECT_LT(on->plan.pool_pages, plain->pool_pages);
  EXPECT_EQ(on->plan.weights, in.weights + kDense27B);
  ExpectWithinBudget(on->plan);
  // off: never.
  in.slots = 16;
  in.slot_ctx = 32768;
  auto off = PlanDenseWeights(in, kDense27B, DenseWeights::kOff);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->dense);
  EXPECT_EQ(off->plan.weights, in.weights);
  // Nothing to copy (an F32 model): no copies whatever the mode.
  a = PlanDenseWeights(in, 0, DenseWeights::kAuto);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->dense);
}

TEST(DenseWeightsPlan, SmallCardsAndThePrefixCacheKeepTheirMemory) {
  // 32 GB: the copies do not fit beside the 27B at all. auto says so and plans without them;
  // on is refused with the planner's error.
  MemoryPlanInput in = Qwen27B(GgmlType::F16, 32.0);
  in.slots = 1;
  in.slot_ctx = 4096;
  auto a = PlanDenseWeights(in, kDense27B, DenseWeights::kAuto);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->dense);
  EXPECT_NE(a->reason.find("do not fit"), std::string::npos) << a->reason;
  auto on = PlanDenseWeights(in, kDense27B, DenseWeights::kOn);
  EXPECT_EQ(on.status().code(), absl::StatusCode::kResourceExhausted) << on.status();

  // 141 GB, 16 x 32k, and a device prefix cache of 40 GiB in the auto tier (it gets at most a
  // quarter of what one slot's plan leaves): the copies would shrink that share, so auto
  // leaves them out although the pool itself would keep every context.
  in = Qwen27B(GgmlType::F16, 141.0);
  in.slots = 16;
  in.slot_ctx = 32768;
  in.cache_bytes = 40 * kGiB;
  auto plain = PlanMemory(in);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_LT(plain->cache, 40 * kGiB);
  a = PlanDenseWeights(in, kDense27B, DenseWeights::kAuto);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->dense) << a->reason;
  EXPECT_EQ(a->plan.cache, plain->cache);
  // A small cache that fits either way does not stand in the way.
  in.cache_bytes = 4 * kGiB;
  a = PlanDenseWeights(in, kDense27B, DenseWeights::kAuto);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->dense) << a->reason;
  EXPECT_EQ(a->plan.cache, 4 * kGiB);
}

}  // namespace
}  // namespace ds
