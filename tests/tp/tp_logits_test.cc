// End to end: TP groups of 2, 3 and 4 CPU ranks — separate ds_tp_rank processes meeting over
// Gloo/TCP on loopback — give the same logits as TP = 1 within an f32 bound and identical greedy
// tokens, for even and uneven splits, both lm_head placements and a split from free memory.
// Also: in one process, each rank's backend holds only its shard (view sizes, zero-copy views
// into the mapping) and the memory planner's numbers add up.
#include <spawn.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/collective/gloo_collective.h"
#include "gtest/gtest.h"
#include "tests/tp/rank_processes.h"
#include "nlohmann/json.hpp"
#include "worker/model/cpu_backend.h"
#include "worker/runner/slot_snapshot.h"
#include "worker/tp/plan.h"

namespace ds {
namespace {

std::string Dir() {
  static const std::string d = tp_test::ScratchDir("ds_tp_");
  return d;
}
using tp_test::RunAll;

// ds_tp_rank's synthetic model of `shape` (tp, tiled) and weight type, made once per test program.
const std::string& Model(const std::string& type, const std::string& shape = "tp") {
  static std::map<std::string, std::string> paths;
  const std::string key = shape + "_" + type;
  auto it = paths.find(key);
  if (it != paths.end()) return it->second;
  const std::string p = Dir() + "/" + key + ".gguf";
  const auto rc = RunAll({{DS_TP_RANK_BIN, "--make-model", p, "--shape", shape, "--type", type}});
  EXPECT_EQ(rc[0], 0) << "synthesizing " << p;
  return paths[key] = p;
}

nlohmann::json Load(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  if (!f.good()) return {};
  return nlohmann::json::parse(f);
}

// Runs one TP group; returns rank 0's result (rank r's is at <out>.r).
nlohmann::json RunGroup(const std::string& model, int world, const std::string& name,
                        std::vector<std::string> extra = {}) {
  const std::string store = Dir() + "/store_" + name, out = Dir() + "/res_" + name + ".json";
  std::filesystem::remove_all(store);
  std::vector<std::vector<std::string>> cmds;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> c = {DS_TP_RANK_BIN, "--model", model, "--rank", std::to_string(r),
                                  "--world", std::to_string(world), "--store", store, "--prefix",
                                  name, "--out", out, "--gen", "6", "--threads", "1"};
    c.insert(c.end(), extra.begin(), extra.end());
    cmds.push_back(c);
  }
  const auto rc = RunAll(cmds);
  for (int r = 0; r < world; ++r) EXPECT_EQ(rc[r], 0) << name << " rank " << r;
  return Load(out);
}

const nlohmann::json& Reference(const std::string& type) {
  static std::map<std::string, nlohmann::json> refs;
  auto it = refs.find(type);
  if (it != refs.end()) return it->second;
  return refs[type] = RunGroup(Model(type), 1, "ref_" + type);
}

// Same greedy tokens; every logit within 1e-4 of the largest |logit| (f32 sums in a different
// order: measured ~2e-6 relative).
void ExpectSameAsReference(const nlohmann::json& got, const nlohmann::json& ref, const std::string& what) {
  ASSERT_TRUE(got.contains("logits")) << what;
  EXPECT_EQ(got["tokens"], ref["tokens"]) << what;
  const auto& a = got["logits"];
  const auto& b = ref["logits"];
  ASSERT_EQ(a.size(), b.size()) << what;
  double max_diff = 0, max_abs = 0;
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].size(), b[s].size()) << what << " step " << s;
    for (size_t i = 0; i < a[s].size(); ++i) {
      const double x = a[s][i].get<double>(), y = b[s][i].get<double>();
      max_diff = std::max(max_diff, std::abs(x - y));
      max_abs = std::max(max_abs, std::abs(y));
    }
  }
  EXPECT_GT(max_abs, 0.1) << what;
  EXPECT_LT(max_diff, 1e-4 * max_abs) << what << ": max |Δlogit| " << max_diff << " of " << max_abs;
  std::printf("%s: max |dlogit| %.3g (max |logit| %.3g)\n", what.c_str(), max_diff, max_abs);
}

struct Case {
  int world;
  std::string split;  // "" = even
  std::string type;
  std::string lm_head = "vocab";
  bool align = false;  // true: default head granules (GDN in pairs here); false: --no-align
};

class TpGroup : public ::testing::TestWithParam<Case> {};

TEST_P(TpGroup, MatchesTp1) {
  const Case& c = GetParam();
  std::string name = "w" + std::to_string(c.world) + "_" + c.type + "_" + c.lm_head + "_" +
                     (c.split.empty() ? "even" : c.split) + (c.align ? "_aligned" : "");
  std::replace(name.begin(), name.end(), ',', '-');
  std::vector<std::string> extra = {"--lm-head", c.lm_head};
  if (!c.align) extra.push_back("--no-align");
  if (!c.split.empty()) extra.insert(extra.end(), {"--split", c.split});
  const nlohmann::json got = RunGroup(Model(c.type), c.world, name, extra);
  ExpectSameAsReference(got, Reference(c.type), name);
  // The plan really split the heads: every rank's ranges, in rank order, tile the model.
  ASSERT_EQ(got["ranks"].size(), static_cast<size_t>(c.world));
  int64_t attn = 0, gdn = 0, ffn = 0;
  for (const auto& r : got["ranks"]) {
    EXPECT_EQ(r["attn"][0].get<int64_t>(), attn);
    EXPECT_EQ(r["gdn"][0].get<int64_t>(), gdn);
    EXPECT_EQ(r["ffn"][0].get<int64_t>(), ffn);
    attn = r["attn"][1];
    gdn = r["gdn"][1];
    ffn = r["ffn"][1];
  }
  EXPECT_EQ(attn, 4);
  EXPECT_EQ(gdn, 4);
  EXPECT_EQ(ffn, 384);
  // dv = 16 < the Q8_0 block: single GDN heads need f32 ssm_out slices on some rank; aligned
  // plans move GDN heads in pairs and keep everything quantized.
  if (c.align) {
    for (const auto& r : got["ranks"]) EXPECT_EQ(r["gdn"][0].get<int>() % 2, 0);
    EXPECT_EQ(got["dequantized_bytes"].get<uint64_t>(), 0u);
  }
  // Non-zero ranks got the same tokens (they follow rank 0's broadcast).
  for (int r = 1; r < c.world; ++r) {
    const auto other = Load(Dir() + "/res_" + name + ".json." + std::to_string(r));
    EXPECT_EQ(other["tokens"], got["tokens"]) << "rank " << r;
    if (c.lm_head == "rank0") {
      EXPECT_FALSE(other.contains("logits") && !other["logits"].empty());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, TpGroup,
    ::testing::Values(Case{2, "", "Q8_0"}, Case{2, "1,2", "Q8_0"}, Case{3, "", "Q8_0"},
                      Case{3, "1,2,3", "Q8_0"}, Case{4, "", "Q8_0"}, Case{4, "1,1,1,3", "Q8_0"},
                      Case{3, "2,1,1", "F32"}, Case{2, "1,3", "Q8_0", "rank0"},
                      Case{2, "1,2", "Q8_0", "vocab", true}, Case{3, "", "Q8_0", "vocab", true}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string s = "tp" + std::to_string(i.param.world) + "_" +
                      (i.param.split.empty() ? "even" : i.param.split) + "_" + i.param.type + "_" +
                      i.param.lm_head + (i.param.align ? "_aligned" : "");
      for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

// K-quant and IQ4 files under TP (the tp shape's 128-wide rows hold no 256-element block): on the
// 256-wide shape (ds_tp_rank --shape tiled) Q4_K moves FFN columns in 256-column granules,
// IQ4_NL in 32, and at TP = 3 one rank holds no GDN heads; TP = 2 and 3 match TP = 1 as the Q8_0
// cases do (measured ~2e-6 of max |logit|, 2026-12-05). The CUDA twin: CustomTp.TiledFormatsMatchTp1.
TEST(TpGroup, KQuantAndIq4FilesMatchTp1) {
  for (const std::string type : {"Q4_K", "IQ4_NL"}) {
    const std::string& model = Model(type, "tiled");
    const nlohmann::json ref = RunGroup(model, 1, "tiled_ref_" + type);
    for (const int world : {2, 3}) {
      const std::string name = "tiled_w" + std::to_string(world) + "_" + type;
      const nlohmann::json got = RunGroup(model, world, name);
      ExpectSameAsReference(got, ref, name);
      ASSERT_EQ(got["ranks"].size(), static_cast<size_t>(world)) << name;
      EXPECT_EQ(got["ranks"][world - 1]["ffn"][1].get<int64_t>(), 768) << name;
    }
  }
}

TEST(TpGroup, SplitFromFreeMemory) {
  // Rank 1 reports 3x the free memory of rank 0: it must get 3 of the 4 KV/GDN head units.
  const std::string model = Model("Q8_0"), store = Dir() + "/store_mem", out = Dir() + "/res_mem.json";
  std::filesystem::remove_all(store);
  std::vector<std::vector<std::string>> cmds;
  for (int r = 0; r < 2; ++r)
    cmds.push_back({DS_TP_RANK_BIN, "--model", model, "--rank", std::to_string(r), "--world", "2",
                    "--store", store, "--prefix", "mem", "--out", out, "--gen", "6", "--threads", "1",
                    "--split", "mem", "--free-gib", r == 0 ? "8" : "24"});
  const auto rc = RunAll(cmds);
  EXPECT_EQ(rc[0], 0);
  EXPECT_EQ(rc[1], 0);
  const auto got = Load(out);
  ExpectSameAsReference(got, Reference("Q8_0"), "split mem 8:24");
  EXPECT_EQ(got["ranks"][0]["attn"], (std::vector<int>{0, 1}));
  EXPECT_EQ(got["ranks"][1]["attn"], (std::vector<int>{1, 4}));
  EXPECT_LT(got["ranks"][0]["weight_bytes"].get<uint64_t>(), got["ranks"][1]["weight_bytes"].get<uint64_t>());
}

TEST(TpGroup, BadSplitFailsCleanly) {
  const auto rc = RunAll({{DS_TP_RANK_BIN, "--model", Model("Q8_0"), "--split", "1,x"}});
  EXPECT_EQ(rc[0], 1);
}

// In one process (two threads = two ranks): the shard views have the local sizes, contiguous
// row cuts stay zero-copy views into the rank's mapping, state is sized for local heads only,
// and the memory planner agrees with the bytes the views hold.
TEST(TpShard, EachRankHoldsOnlyItsShard) {
  const std::string model = Model("Q8_0"), store = Dir() + "/store_inproc";
  std::filesystem::remove_all(store);
  std::vector<std::unique_ptr<CpuBackend>> be(2);
  std::vector<std::unique_ptr<GlooCollective>> coll(2);
  std::vector<std::thread> th;
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      GlooOptions go;
      go.rank = r;
      go.world = 2;
      go.store_dir = store;
      auto c = GlooCollective::Create(go);
      ASSERT_TRUE(c.ok()) << c.status();
      coll[r] = std::move(*c);
      BackendOptions o;
      o.n_threads = 1;
      o.slot_ctx = 64;
      o.tp_rank = r;
      o.tp_world = 2;
      o.tp_split = {1, 3};
      o.tp_align_heads = false;  // single GDN heads: exercises the dequantized ssm_out slices
      o.collective = coll[r].get();
      auto b = CpuBackend::Create(model, o);
      ASSERT_TRUE(b.ok()) << b.status();
      be[r] = std::move(*b);
    });
  for (auto& t : th) t.join();
  ASSERT_TRUE(be[0] && be[1]);
  const ModelConfig& c = be[0]->config();
  const tp::Plan& p = *be[0]->tp_plan();
  for (int r = 0; r < 2; ++r) {
    const ModelWeights& w = be[r]->weights();
    const int hk = p.gdn_k(r), hv = p.gdn_v(r), kv = p.kv_heads(r), q = p.q_heads(r);
    EXPECT_EQ(hk, r == 0 ? 1 : 3);
    EXPECT_EQ(hv, 3 * hk);
    const GdnLayerWeights& g = w.layers[0].gdn;
    EXPECT_EQ(g.qkv.rows, 2LL * hk * c.gdn_k_dim + hv * c.gdn_v_dim);
    EXPECT_EQ(g.gate.rows, hv * c.gdn_v_dim);
    EXPECT_EQ(g.beta.rows, hv);
    EXPECT_EQ(g.out.cols, hv * c.gdn_v_dim);
    EXPECT_EQ(g.out.type, GgmlType::F32);  // dv = 16 < Q8_0 block: dequantized at load
    EXPECT_EQ(g.ssm_a.size(), static_cast<size_t>(hv));
    EXPECT_EQ(g.conv.size(), static_cast<size_t>(g.qkv.rows * c.conv_kernel));
    const AttnLayerWeights& at = w.layers[3].attn;
    EXPECT_EQ(at.q.rows, 2LL * q * c.head_dim);
    EXPECT_EQ(at.k.rows, 1LL * kv * c.head_dim);
    EXPECT_EQ(at.out.cols, 1LL * q * c.head_dim);
    EXPECT_EQ(at.out.type, GgmlType::Q8_0);  // 3 heads x 32 = whole blocks: stays quantized
    EXPECT_EQ(w.layers[0].ffn_down.cols, p.ranks[r].ffn.size());
    EXPECT_EQ(w.output.rows, p.ranks[r].vocab.size());
    // Vocab-parallel embedding: the same vocabulary rows of token_embd, a view into the mapping.
    EXPECT_EQ(w.token_embd.rows, p.ranks[r].vocab.size());
    const gguf::TensorInfo* te = be[r]->file().FindTensor("token_embd.weight");
    ASSERT_NE(te, nullptr);
    EXPECT_EQ(w.token_embd.data, te->data + p.ranks[r].vocab.begin * te->row_bytes());
    // Zero-copy: attn_k rows of this rank are a view into the mapping at the rank's first row.
    const gguf::TensorInfo* tk = be[r]->file().FindTensor("blk.3.attn_k.weight");
    ASSERT_NE(tk, nullptr);
    EXPECT_EQ(at.k.data, tk->data + p.ranks[r].attn_units.begin * c.head_dim * tk->row_bytes());
    EXPECT_FALSE(w.has_mtp);
  }
  auto hg = tp::AlignedHeadGranules(be[0]->file(), c);
  ASSERT_TRUE(hg.ok());
  EXPECT_EQ(hg->attn, 1);  // 3 q heads x 32 = 96 columns = 3 Q8_0 blocks
  EXPECT_EQ(hg->gdn, 2);   // dv 16: two value heads per Q8_0 block
  auto mem = tp::PlanMemory(be[0]->file(), c, p);
  ASSERT_TRUE(mem.ok());
  EXPECT_EQ((*mem)[0].dequantized_bytes, be[0]->weights().dequantized_bytes);
  EXPECT_EQ((*mem)[1].dequantized_bytes, be[1]->weights().dequantized_bytes);
  EXPECT_LT((*mem)[0].weight_bytes, (*mem)[1].weight_bytes);
  // State and KV: the ranks' shares add up to the unsharded sizes.
  const uint64_t full_kv = 4ull * c.n_attention() * 2 * c.n_head_kv * c.head_dim;
  EXPECT_EQ((*mem)[0].kv_bytes_per_token + (*mem)[1].kv_bytes_per_token, full_kv);
  const uint64_t full_state =
      4ull * c.n_recurrent() *
      ((c.conv_kernel - 1) * c.gdn_conv_channels() +
       static_cast<uint64_t>(c.gdn_v_heads) * c.gdn_k_dim * c.gdn_v_dim);
  EXPECT_EQ((*mem)[0].state_bytes_per_slot + (*mem)[1].state_bytes_per_slot, full_state);
  // Snapshots carry only the rank's own state.
  auto s0 = be[0]->Snapshot(0), s1 = be[1]->Snapshot(0);
  ASSERT_TRUE(s0.ok() && s1.ok());
  // (The CPU device's payload: a 4-byte MTP length, then the state; no KV at n_past 0.)
  auto p0 = DecodeSlotSnapshot(s0->bytes), p1 = DecodeSlotSnapshot(s1->bytes);
  ASSERT_TRUE(p0.ok() && p1.ok());
  EXPECT_EQ(p0->payload.size() - 4 + p1->payload.size() - 4, full_state);
  // The test shape has no MTP block: refused as without TP (MTP under TP: worker_mtp_tp_test).
  std::vector<float> lg, hid;
  EXPECT_EQ(be[0]->MtpStep(0, 1, 0, std::vector<float>(c.n_embd), &lg, &hid).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ds
