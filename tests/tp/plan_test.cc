// The sharding plan: apportioning units by split weights, split parsing, the tiled GDN value-head
// mapping surviving the cut, every tensor's cuts partitioning it exactly, shard views holding the
// right bytes, and the memory planner.
#include "worker/tp/plan.h"

#include <algorithm>
#include <numeric>

#include "gtest/gtest.h"
#include "kernels/cpu/quant.h"
#include "worker/tp/shard.h"

namespace ds::tp {
namespace {

ModelConfig TestConfig() {
  ModelConfig c;
  c.arch = "qwen35";
  c.n_layer = 4;
  c.n_embd = 128;
  c.n_ff = 384;
  c.n_vocab = 256;
  c.n_head = 12;
  c.n_head_kv = 4;
  c.head_dim = 32;
  c.n_rot = 8;
  c.conv_kernel = 4;
  c.gdn_k_heads = 4;
  c.gdn_v_heads = 12;
  c.gdn_k_dim = 16;
  c.gdn_v_dim = 16;
  c.is_recurrent = {true, true, true, false};
  return c;
}

TEST(Apportion, LargestRemainderSumsToTotal) {
  EXPECT_EQ(Apportion(12, std::vector<double>{1, 2}), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(Apportion(4, std::vector<double>{1, 1, 1}), (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(Apportion(4, std::vector<double>{1, 1, 1, 3}), (std::vector<int64_t>{1, 1, 0, 2}));
  EXPECT_EQ(Apportion(4, std::vector<double>{1, 2}), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(Apportion(68, std::vector<double>{1, 1.5}), (std::vector<int64_t>{27, 41}));
  for (int n = 0; n < 50; ++n) {
    const std::vector<double> w = {0.3, 1.7, 1.0, 2.2};
    const auto a = Apportion(n, w);
    EXPECT_EQ(std::accumulate(a.begin(), a.end(), int64_t{0}), n);
    for (size_t i = 0; i < w.size(); ++i)
      EXPECT_LE(std::abs(a[i] - n * w[i] / 5.2), 1.0) << "n " << n << " rank " << i;
  }
}

TEST(ParseSplit, AcceptsCommaOrColonAndRejectsJunk) {
  EXPECT_EQ(*ParseSplit("1,2"), (std::vector<double>{1, 2}));
  EXPECT_EQ(*ParseSplit("1:1.5"), (std::vector<double>{1, 1.5}));
  EXPECT_EQ(*ParseSplit("3"), (std::vector<double>{3}));
  for (const char* bad : {"", "1,,2", "0,1", "-1,2", "a", "1,2,", "nan"}) {
    auto s = ParseSplit(bad);
    EXPECT_FALSE(s.ok()) << bad;
    if (!s.ok()) EXPECT_NE(s.status().message().find("--split field"), std::string::npos);
  }
}

TEST(SplitFromFreeBytes, IsProportional) {
  const auto p = Plan::Make(TestConfig(), SplitFromFreeBytes(std::vector<double>{16e9, 32e9}), 32,
                            LmHead::kVocabParallel);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ranks[0].gdn_units.size(), 1);  // 4 key heads 1:2 → 1.33 / 2.67 → 1 / 3
  EXPECT_EQ(p->ranks[1].gdn_units.size(), 3);
  EXPECT_EQ(p->ranks[0].ffn.size(), 128);
  EXPECT_EQ(p->ranks[1].ffn.size(), 256);
}

TEST(Plan, RejectsShapesItCannotSplit) {
  ModelConfig c = TestConfig();
  EXPECT_FALSE(Plan::Make(c, {}, 32, LmHead::kVocabParallel).ok());
  EXPECT_FALSE(Plan::Make(c, std::vector<double>{1, 0}, 32, LmHead::kVocabParallel).ok());
  EXPECT_FALSE(Plan::Make(c, std::vector<double>{1, 1}, 256, LmHead::kVocabParallel).ok());
  c.n_head = 10;
  EXPECT_FALSE(Plan::Make(c, std::vector<double>{1, 1}, 32, LmHead::kVocabParallel).ok());
}

TEST(Plan, RankZeroLmHeadHoldsTheWholeVocabulary) {
  auto p = Plan::Make(TestConfig(), std::vector<double>{1, 1, 1}, 32, LmHead::kRank0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ranks[0].vocab, (Range{0, 256}));
  EXPECT_EQ(p->ranks[1].vocab.size(), 0);
  EXPECT_EQ(p->ranks[2].vocab.size(), 0);
}

// Local value head j of a rank owning key heads [k0, k1) must read local key head j mod (k1 − k0),
// i.e. the global pair (p, p mod Hk) of spec §5.3 is preserved.
TEST(GdnValueHeads, LocalTiledOrderKeepsTheGlobalPairing) {
  const int Hk = 4, Hv = 12;
  for (int k0 = 0; k0 < Hk; ++k0)
    for (int k1 = k0 + 1; k1 <= Hk; ++k1) {
      const auto ranges = GdnValueHeads(Hk, Hv, {k0, k1});
      std::vector<int64_t> heads;
      for (const Range& r : ranges)
        for (int64_t p = r.begin; p < r.end; ++p) heads.push_back(p);
      ASSERT_EQ(static_cast<int>(heads.size()), (k1 - k0) * (Hv / Hk));
      for (size_t j = 0; j < heads.size(); ++j)
        EXPECT_EQ(heads[j] % Hk, k0 + static_cast<int64_t>(j) % (k1 - k0))
            << "k [" << k0 << "," << k1 << ") local head " << j;
    }
  EXPECT_TRUE(GdnValueHeads(Hk, Hv, {2, 2}).empty());
}

// Over all ranks, the cuts of every sharded tensor cover each row/column exactly once.
TEST(CutFor, RanksPartitionEveryShardedTensor) {
  const ModelConfig c = TestConfig();
  const int64_t H = c.n_embd, C = c.gdn_conv_channels();
  struct T {
    const char* name;
    int64_t extent;  // rows for row cuts, ne0 for column cuts
  };
  const std::vector<T> tensors = {
      {"attn_q.weight", 2LL * c.n_head * c.head_dim}, {"attn_k.weight", 1LL * c.n_head_kv * c.head_dim},
      {"attn_v.weight", 1LL * c.n_head_kv * c.head_dim}, {"attn_output.weight", 1LL * c.n_head * c.head_dim},
      {"attn_qkv.weight", C}, {"ssm_conv1d.weight", C}, {"attn_gate.weight", c.gdn_value_width()},
      {"ssm_beta.weight", c.gdn_v_heads}, {"ssm_alpha.weight", c.gdn_v_heads}, {"ssm_a", c.gdn_v_heads},
      {"ssm_dt.bias", c.gdn_v_heads}, {"ssm_out.weight", c.gdn_value_width()},
      {"ffn_gate.weight", c.n_ff}, {"ffn_up.weight", c.n_ff}, {"ffn_down.weight", c.n_ff},
      {"output.weight", c.n_vocab}, {"token_embd.weight", c.n_vocab}};
  for (const auto& split : std::vector<std::vector<double>>{{1, 1}, {1, 2}, {1, 1, 1}, {1, 2, 3}, {1, 1, 1, 3}}) {
    auto p = Plan::Make(c, split, 32, LmHead::kVocabParallel);
    ASSERT_TRUE(p.ok());
    for (const T& t : tensors) {
      std::vector<int> hits(t.extent, 0);
      for (int r = 0; r < p->world; ++r) {
        const Cut cut = CutFor(c, *p, r, t.name);
        ASSERT_NE(cut.kind, Cut::kAll) << t.name;
        for (const Range& x : cut.ranges)
          for (int64_t i = x.begin; i < x.end; ++i) ++hits[i];
      }
      for (int64_t i = 0; i < t.extent; ++i) ASSERT_EQ(hits[i], 1) << t.name << " index " << i;
    }
    for (const char* rep : {"attn_norm.weight", "ssm_norm.weight", "attn_q_norm.weight"})
      EXPECT_EQ(CutFor(c, *p, 0, rep).kind, Cut::kAll) << rep;
    (void)H;
  }
}

TEST(CutMatrix, RowsAndColumnsHoldTheOriginalValues) {
  const int64_t rows = 6, cols = 96;  // 3 Q8_0 blocks per row
  std::vector<float> src(rows * cols);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(0.37f * i);
  const uint64_t rb = GgmlRowBytes(GgmlType::Q8_0, cols);
  std::vector<uint8_t> q(rows * rb);
  for (int64_t r = 0; r < rows; ++r) cpu::QuantizeRow(GgmlType::Q8_0, &src[r * cols], &q[r * rb], cols);
  const cpu::WeightView w{GgmlType::Q8_0, q.data(), cols, rows};
  auto deq = [](const cpu::WeightView& v, int64_t r) {
    std::vector<float> o(v.cols);
    cpu::GetRow(v, r, o.data());
    return o;
  };
  ShardStore store;
  // One row range: zero copy.
  auto one = CutMatrix(w, Cut{Cut::kRows, {{2, 5}}}, "t", &store);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->data, q.data() + 2 * rb);
  EXPECT_TRUE(store.empty());
  // Several row ranges: copied, same rows in order.
  auto multi = CutMatrix(w, Cut{Cut::kRows, {{4, 6}, {0, 1}}}, "t", &store);
  ASSERT_TRUE(multi.ok());
  EXPECT_EQ(multi->rows, 3);
  EXPECT_EQ(deq(*multi, 0), deq(w, 4));
  EXPECT_EQ(deq(*multi, 2), deq(w, 0));
  // Block-aligned columns stay Q8_0.
  uint64_t deq_bytes = 0;
  auto colsq = CutMatrix(w, Cut{Cut::kCols, {{64, 96}, {0, 32}}}, "t", &store, &deq_bytes);
  ASSERT_TRUE(colsq.ok());
  EXPECT_EQ(colsq->type, GgmlType::Q8_0);
  EXPECT_EQ(deq_bytes, 0u);
  // Unaligned columns are dequantized to f32.
  auto colsf = CutMatrix(w, Cut{Cut::kCols, {{16, 48}, {80, 88}}}, "t", &store, &deq_bytes);
  ASSERT_TRUE(colsf.ok());
  EXPECT_EQ(colsf->type, GgmlType::F32);
  EXPECT_EQ(deq_bytes, rows * 40 * 4u);
  for (int64_t r = 0; r < rows; ++r) {
    const auto full = deq(w, r), a = deq(*colsq, r), b = deq(*colsf, r);
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(a[i], full[64 + i]);
      EXPECT_EQ(a[32 + i], full[i]);
      EXPECT_EQ(b[i], full[16 + i]);
    }
    for (int i = 0; i < 8; ++i) EXPECT_EQ(b[32 + i], full[80 + i]);
  }
  EXPECT_FALSE(CutMatrix(w, Cut{Cut::kRows, {{4, 7}}}, "t", &store).ok());
  auto bad = CutMatrix(w, Cut{Cut::kCols, {{0, 97}}}, "blk.0.x", &store);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("blk.0.x"), std::string::npos);
}

TEST(CutFloats, SelectsRowsOrElements) {
  const std::vector<float> v = {0, 1, 2, 3, 4, 5, 6, 7};  // [4, 2]
  EXPECT_EQ(*CutFloats(v, 2, Cut{Cut::kRows, {{3, 4}, {0, 1}}}, "c"), (std::vector<float>{6, 7, 0, 1}));
  EXPECT_EQ(*CutFloats(v, 8, Cut{Cut::kCols, {{5, 7}, {1, 2}}}, "a"), (std::vector<float>{5, 6, 1}));
  EXPECT_EQ(*CutFloats(v, 2, Cut{}, "n"), v);
}

}  // namespace
}  // namespace ds::tp
