// Synthetic GGUF generator: plan (27B dry run), determinism, weight scales.
#include "tools/synth/synth.h"

#include <cmath>
#include <fstream>
#include <iterator>

#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "kernels/cpu/quant.h"
#include "tests/model/test_util.h"

namespace ds {
namespace {

std::vector<char> ReadAll(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(Synth, Qwen27BPlanMatchesSpecInventoryAndSize) {
  auto plan = DescribeGguf(SynthOptions::Qwen27B());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tensors.size(), 866u);  // §9.4: 3 + 48·14 + 16·11 + 15
  EXPECT_EQ(plan->n_vocab, 248320);
  const double gib = plan->data_bytes / 1073741824.0;
  EXPECT_NEAR(gib, 20.95, 0.05) << gib;
  int64_t params = 0;
  for (const auto& t : plan->tensors) {
    int64_t n = 1;
    for (int64_t e : t.ne) n *= e;
    params += n;
    if (t.ne.size() == 1 || t.name.find("ssm_conv1d") != std::string::npos ||
        t.name.find("ssm_alpha") != std::string::npos || t.name.find("ssm_beta") != std::string::npos)
      EXPECT_EQ(t.type, GgmlType::F32) << t.name;
    else
      EXPECT_EQ(t.type, GgmlType::Q6_K) << t.name;
  }
  EXPECT_NEAR(params / 1e9, 27.32, 0.01);  // §1 parameter count incl. MTP
  const auto find = [&](const std::string& n) -> const SynthTensor* {
    for (const auto& t : plan->tensors)
      if (t.name == n) return &t;
    return nullptr;
  };
  ASSERT_NE(find("blk.0.attn_qkv.weight"), nullptr);
  EXPECT_EQ(find("blk.0.attn_qkv.weight")->ne, (std::vector<int64_t>{5120, 10240}));
  EXPECT_EQ(find("blk.3.attn_q.weight")->ne, (std::vector<int64_t>{5120, 12288}));
  EXPECT_EQ(find("blk.64.nextn.eh_proj.weight")->ne, (std::vector<int64_t>{10240, 5120}));
  EXPECT_EQ(find("blk.1.ssm_conv1d.weight")->ne, (std::vector<int64_t>{4, 10240}));
  EXPECT_EQ(find("blk.3.attn_qkv.weight"), nullptr);
  SynthOptions no_mtp = SynthOptions::Qwen27B();
  no_mtp.with_mtp = false;
  EXPECT_EQ(DescribeGguf(no_mtp)->tensors.size(), 851u);
  // With ssm_alpha/ssm_beta quantized too, 96 tensors shrink from F32 to Q6_K.
  SynthOptions all_q = SynthOptions::Qwen27B();
  all_q.alpha_beta_f32 = false;
  EXPECT_EQ(plan->data_bytes - DescribeGguf(all_q)->data_bytes,
            96ull * (5120 * 48 * 4 - 5120 / 256 * 210 * 48));
}

TEST(Synth, DeterministicFromSeedAndThreadCount) {
  SynthOptions o = SynthOptions::Tiny();
  o.n_threads = 1;
  const std::string a = testing::TempPath("det_a.gguf"), b = testing::TempPath("det_b.gguf"),
                    c = testing::TempPath("det_c.gguf");
  ASSERT_TRUE(SynthesizeGguf(o, a).ok());
  o.n_threads = 2;
  ASSERT_TRUE(SynthesizeGguf(o, b).ok());
  o.seed = 2;
  ASSERT_TRUE(SynthesizeGguf(o, c).ok());
  const auto da = ReadAll(a), db = ReadAll(b), dc = ReadAll(c);
  EXPECT_GT(da.size(), 100000u);
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
  EXPECT_EQ(da.size(), dc.size());
  auto plan = DescribeGguf(SynthOptions::Tiny());
  auto f = gguf::File::Open(a);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ((*f)->tensors().size(), plan->tensors.size());
  for (size_t i = 0; i < plan->tensors.size(); ++i) {
    EXPECT_EQ((*f)->tensors()[i].name, plan->tensors[i].name);
    EXPECT_EQ((*f)->tensors()[i].nbytes, plan->tensors[i].nbytes);
  }
}

// Both generation modes give matrices with std ≈ 1/sqrt(in) and mean ≈ 0.
TEST(Synth, MatrixScalesInBothModes) {
  struct Case {
    GgmlType type;
    SynthQuantMode mode;
  } cases[] = {{GgmlType::F32, SynthQuantMode::kQuantizeFloats},
               {GgmlType::Q6_K, SynthQuantMode::kQuantizeFloats},
               {GgmlType::Q6_K, SynthQuantMode::kRandomBlocks},
               {GgmlType::Q8_0, SynthQuantMode::kRandomBlocks},
               {GgmlType::IQ4_XS, SynthQuantMode::kRandomBlocks},
               {GgmlType::IQ4_NL, SynthQuantMode::kRandomBlocks},
               {GgmlType::Q4_K, SynthQuantMode::kRandomBlocks},
               {GgmlType::Q5_K, SynthQuantMode::kRandomBlocks}};
  for (const Case& cs : cases) {
    SynthOptions o = SynthOptions::Tiny();
    o.n_embd = 256;
    o.n_ff = 512;
    o.weight_type = cs.type;
    o.quant_mode = cs.mode;
    const std::string p = testing::TempPath("scale.gguf");
    ASSERT_TRUE(SynthesizeGguf(o, p).ok());
    auto f = gguf::File::Open(p);
    ASSERT_TRUE(f.ok());
    for (const char* name : {"blk.0.ffn_up.weight", "blk.0.ffn_down.weight"}) {
      const gguf::TensorInfo* t = (*f)->FindTensor(name);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->type, cs.type);
      std::vector<float> x(t->n_elements());
      for (int64_t r = 0; r < t->n_rows(); ++r)
        cpu::DequantizeRow(t->type, t->data + r * t->row_bytes(), x.data() + r * t->ne[0], t->ne[0]);
      double s = 0, ss = 0;
      for (float v : x) {
        s += v;
        ss += double(v) * v;
      }
      const double mean = s / x.size(), sd = std::sqrt(ss / x.size() - mean * mean);
      const double want = 1.0 / std::sqrt(double(t->ne[0]));
      EXPECT_NEAR(sd / want, 1.0, 0.15) << GgmlInfo(cs.type).name << " " << name;
      EXPECT_LT(std::abs(mean), 0.05 * want) << GgmlInfo(cs.type).name << " " << name;
    }
  }
}

TEST(Synth, RejectsBadOptions) {
  SynthOptions o = SynthOptions::Tiny();
  o.n_head_kv = 3;
  EXPECT_FALSE(DescribeGguf(o).ok());
  o = SynthOptions::Tiny();
  o.weight_type = GgmlType::Q4_0;
  EXPECT_FALSE(SynthesizeGguf(o, testing::TempPath("bad.gguf")).ok());
}

}  // namespace
}  // namespace ds
