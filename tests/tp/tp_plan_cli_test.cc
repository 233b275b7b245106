// `deltaserve tp-plan` (tools/cli/tp_plan.h, issue #19): the 27B described without a file, and the
// per-rank report for uneven cards. The figures come from the workers' own planning code
// (tp::Plan, tp::PlanMemory, PlanMemory); this checks the description and the report's verdicts.
#include "tools/cli/tp_plan.h"

#include <gtest/gtest.h>

#include <string>

namespace ds::cli {
namespace {

constexpr double kGiB = 1 << 30;

const gguf::TensorInfo* Find(const DescribedModel& m, const std::string& name) {
  for (const gguf::TensorInfo& t : m.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(TpPlanCli, Describes27BQ6KAsTheSynthWritesIt) {
  auto m = Describe27B("Q6_K");
  ASSERT_TRUE(m.ok()) << m.status();
  // tools/synth/synth.h: the all-Q6_K 27B file (MTP included) holds 20.95 GiB of tensors.
  EXPECT_NEAR(m->bytes / kGiB, 20.95, 0.05);
  EXPECT_EQ(m->config.n_layer, 64);
  EXPECT_EQ(m->config.n_attention(), 16);
}

TEST(TpPlanCli, Q4KMMixFollowsLlamaCppRules) {
  auto m = Describe27B("q4_k_m");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_NE(Find(*m, "output.weight"), nullptr);
  EXPECT_EQ(Find(*m, "output.weight")->type, GgmlType::Q6_K);
  EXPECT_EQ(Find(*m, "token_embd.weight")->type, GgmlType::Q4_K);
  EXPECT_EQ(Find(*m, "blk.0.attn_qkv.weight")->type, GgmlType::Q5_K);
  EXPECT_EQ(Find(*m, "blk.0.ffn_up.weight")->type, GgmlType::Q4_K);
  // use_more_bits over 65 ffn_down (64 layers + MTP): i < 8, i >= 56, (i - 8) % 3 == 2.
  EXPECT_EQ(Find(*m, "blk.0.ffn_down.weight")->type, GgmlType::Q6_K);
  EXPECT_EQ(Find(*m, "blk.8.ffn_down.weight")->type, GgmlType::Q4_K);
  EXPECT_EQ(Find(*m, "blk.10.ffn_down.weight")->type, GgmlType::Q6_K);
  EXPECT_EQ(Find(*m, "blk.60.ffn_down.weight")->type, GgmlType::Q6_K);
  EXPECT_EQ(Find(*m, "blk.0.ssm_alpha.weight")->type, GgmlType::F32);
  // ~4.9 bits per weight over ~27B weights.
  EXPECT_GT(m->bytes / kGiB, 14.0);
  EXPECT_LT(m->bytes / kGiB, 17.5);
  EXPECT_FALSE(Describe27B("q9_x").ok());
}

TEST(TpPlanCli, SixteenPlusThirtyTwoHoldsA200kQ40Context) {
  auto m = Describe27B("q4_k_m");
  ASSERT_TRUE(m.ok()) << m.status();
  TpPlanOptions o;
  o.card_mib = {16160, 32510};  // V100 16 GB and 32 GB as nvidia-smi reports them
  o.kv_type = GgmlType::Q4_0;
  o.ctx = 204800;
  o.slots = 1;
  o.max_step_tokens = 1024;
  auto r = TpPlanReport(m->config, m->tensors, o);
  ASSERT_TRUE(r.ok()) << r.status();
  std::printf("%s", r->c_str());
  EXPECT_NE(r->find("by free memory"), std::string::npos);
  EXPECT_EQ(Count(*r, "  fits: "), 2) << *r;
  // The planner picks the slots (each with the full 200k context): both ranks still fit.
  o.slots = 0;
  auto most = TpPlanReport(m->config, m->tensors, o);
  ASSERT_TRUE(most.ok()) << most.status();
  std::printf("%s", most->c_str());
  EXPECT_EQ(Count(*most, "  fits: "), 2) << *most;
  o.slots = 1;
  // One 16 GB card alone cannot hold the weights.
  o.card_mib = {16160};
  auto one = TpPlanReport(m->config, m->tensors, o);
  ASSERT_TRUE(one.ok()) << one.status();
  std::printf("%s", one->c_str());
  EXPECT_EQ(Count(*one, "does not fit"), 1) << *one;
  // Bad input: a split of the wrong length is refused, naming it.
  o.card_mib = {16160, 32510};
  o.split = {1, 2, 3};
  auto bad = TpPlanReport(m->config, m->tensors, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("--split"), std::string::npos);
}

// The recurrent state per sequence each rank reports, in MiB.
std::vector<double> RecurrentMiB(const std::string& report) {
  std::vector<double> out;
  const std::string key = "recurrent state ";
  for (size_t at = report.find(key); at != std::string::npos; at = report.find(key, at + 1)) {
    size_t used = 0;
    const double v = std::stod(report.substr(at + key.size()), &used);
    if (report.compare(at + key.size() + used, 17, " MiB per sequence") == 0) out.push_back(v);
  }
  return out;
}

// --gdn-state bf16: each rank's delta-rule state takes half the bytes (its conv ring stays f32),
// and the planner then fits at least as many slots.
TEST(TpPlanCli, Bf16GdnStateHalvesTheDeltaRuleState) {
  auto m = Describe27B("q4_k_m");
  ASSERT_TRUE(m.ok()) << m.status();
  TpPlanOptions o;
  o.card_mib = {16160, 32510};
  o.ctx = 32768;
  o.slots = 0;
  auto f32 = TpPlanReport(m->config, m->tensors, o);
  o.gdn_state_bf16 = true;
  auto bf16 = TpPlanReport(m->config, m->tensors, o);
  ASSERT_TRUE(f32.ok() && bf16.ok());
  const auto a = RecurrentMiB(*f32), b = RecurrentMiB(*bf16);
  ASSERT_EQ(a.size(), 2u) << *f32;
  ASSERT_EQ(b.size(), 2u) << *bf16;
  // The 27B: 48 GDN layers x 48 x 128 x 128 state (151 MB in f32 on one card) and a 3-row conv
  // ring; split over the ranks by their value heads.
  const double state_f32 = 48.0 * 48 * 128 * 128 * 4 / 1048576.0;
  EXPECT_NEAR((a[0] - b[0]) + (a[1] - b[1]), state_f32 / 2, 0.2) << *f32 << *bf16;
  for (int r = 0; r < 2; ++r) EXPECT_LT(b[r], a[r]);
  std::printf("%s%s", f32->c_str(), bf16->c_str());
}

}  // namespace
}  // namespace ds::cli
