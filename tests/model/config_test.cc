// ModelConfig::FromGguf and ModelWeights::Load on synthesized and deliberately broken files.
#include <cmath>

#include "common/util/half.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"
#include "worker/model/config.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/weights.h"

namespace ds {
namespace {

using testing::Rewrite;
using testing::TempPath;
using testing::TensorEdit;
using testing::TinyModelPath;

absl::StatusOr<ModelConfig> LoadConfig(const std::string& path) {
  DS_ASSIGN_OR_RETURN(auto f, gguf::File::Open(path));
  return ModelConfig::FromGguf(*f);
}
// Config + weights of a file; the error of whichever fails.
absl::Status LoadAll(const std::string& path) {
  DS_ASSIGN_OR_RETURN(auto f, gguf::File::Open(path));
  DS_ASSIGN_OR_RETURN(ModelConfig c, ModelConfig::FromGguf(*f));
  return ModelWeights::Load(*f, c).status();
}
gguf::Value UInt(gguf::ValueType t, uint64_t x) {
  gguf::Value v;
  v.type = t;
  v.v = x;
  return v;
}

TEST(Config, TinySynthLoadsWithExpectedShapeAndTensorCount) {
  auto f = gguf::File::Open(TinyModelPath());
  ASSERT_TRUE(f.ok()) << f.status();
  auto c = ModelConfig::FromGguf(**f);
  ASSERT_TRUE(c.ok()) << c.status();
  const SynthOptions o = SynthOptions::Tiny();
  EXPECT_EQ(c->arch, "qwen35");
  EXPECT_EQ(c->n_layer, o.n_layer);
  EXPECT_EQ(c->n_nextn, 1);
  EXPECT_EQ(c->n_embd, o.n_embd);
  EXPECT_EQ(c->n_ff, o.n_ff);
  EXPECT_EQ(c->n_head, o.n_head);
  EXPECT_EQ(c->n_head_kv, o.n_head_kv);
  EXPECT_EQ(c->head_dim, o.head_dim);
  EXPECT_EQ(c->n_rot, o.n_rot);
  EXPECT_EQ(c->gdn_k_heads, o.gdn_k_heads);
  EXPECT_EQ(c->gdn_v_heads, o.gdn_v_heads);
  EXPECT_EQ(c->gdn_k_dim, o.gdn_k_dim);
  EXPECT_EQ(c->gdn_v_dim, o.gdn_v_dim);
  EXPECT_EQ(c->conv_kernel, o.conv_kernel);
  EXPECT_FLOAT_EQ(c->rope_base, o.rope_base);
  EXPECT_EQ(c->n_vocab % 64, 0);
  EXPECT_EQ(c->is_recurrent, (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(c->n_recurrent(), 3);
  EXPECT_EQ(c->n_attention(), 1);
  // §9.4: 3 globals + 3 GDN layers × 14 + 1 attention layer × 11 + MTP 15.
  EXPECT_EQ(ExpectedTensorCount(*c, false), 3 + 3 * 14 + 11 + 15);
  EXPECT_EQ((*f)->tensors().size(), static_cast<size_t>(ExpectedTensorCount(*c, false)));
  auto w = ModelWeights::Load(**f, *c);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->has_mtp);
  EXPECT_FALSE(w->tied_output);
  for (float a : w->layers[0].gdn.ssm_a) EXPECT_LT(a, 0.f);
  // Tokenizer rows: the tiny BPE padded with [PAD<id>] up to the embedding rows.
  auto toks = (*f)->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(toks.ok()) << toks.status();
  EXPECT_EQ(static_cast<int>(toks->size()), c->n_vocab);
  EXPECT_EQ(toks->back(), "[PAD" + std::to_string(c->n_vocab - 1) + "]");
}

TEST(Config, RejectsOtherArchitectureByName) {
  const std::string p = TempPath("arch.gguf");
  ASSERT_TRUE(Rewrite(TinyModelPath(), p,
                      [](const std::string& k, gguf::Value& v) {
                        if (k == "general.architecture") v.v = std::string("qwen3next");
                        return true;
                      },
                      nullptr)
                  .ok());
  auto c = LoadConfig(p);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("qwen3next"), std::string::npos) << c.status();
}

TEST(Config, MissingKeyIsNamed) {
  for (const char* key : {"qwen35.ssm.state_size", "qwen35.attention.head_count_kv",
                          "qwen35.rope.freq_base", "qwen35.embedding_length",
                          "qwen35.rope.dimension_sections"}) {
    const std::string p = TempPath("nokey.gguf");
    ASSERT_TRUE(Rewrite(TinyModelPath(), p,
                        [&](const std::string& k, gguf::Value&) { return k != key; }, nullptr)
                    .ok());
    auto c = LoadConfig(p);
    ASSERT_FALSE(c.ok()) << key;
    EXPECT_NE(c.status().message().find(key), std::string::npos) << c.status();
  }
}

TEST(Config, AcceptsAnyIntegerWidth) {
  const std::string p = TempPath("widths.gguf");
  ASSERT_TRUE(Rewrite(TinyModelPath(), p,
                      [](const std::string& k, gguf::Value& v) {
                        if (k == "qwen35.embedding_length") v = UInt(gguf::ValueType::U64, 128);
                        if (k == "qwen35.ssm.conv_kernel") v = UInt(gguf::ValueType::U8, 4);
                        if (k == "qwen35.attention.head_count") {
                          v.type = gguf::ValueType::I16;
                          v.v = int64_t{4};
                        }
                        return true;
                      },
                      nullptr)
                  .ok());
  auto c = LoadConfig(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_embd, 128);
  EXPECT_EQ(c->conv_kernel, 4);
  EXPECT_EQ(c->n_head, 4);
}

TEST(Config, InconsistentValuesAreNamed) {
  struct Case {
    const char* key;
    uint64_t value;
    const char* expect;
  } cases[] = {
      {"qwen35.vocab_size", 1000, "qwen35.vocab_size"},
      {"qwen35.ssm.inner_size", 95, "qwen35.ssm.inner_size"},
      {"qwen35.attention.head_count_kv", 3, "qwen35.attention.head_count"},
      {"qwen35.nextn_predict_layers", 2, "qwen35.nextn_predict_layers"},
      {"qwen35.attention.value_length", 16, "qwen35.attention.value_length"},
      {"qwen35.embedding_length", 64, "token_embd.weight"},
  };
  for (const Case& cs : cases) {
    const std::string p = TempPath("bad.gguf");
    ASSERT_TRUE(Rewrite(TinyModelPath(), p,
                        [&](const std::string& k, gguf::Value& v) {
                          if (k == cs.key) v = UInt(gguf::ValueType::U32, cs.value);
                          return true;
                        },
                        nullptr)
                    .ok());
    auto c = LoadConfig(p);
    ASSERT_FALSE(c.ok()) << cs.key;
    EXPECT_NE(c.status().message().find(cs.expect), std::string::npos) << c.status();
  }
}

TEST(Config, RecurrentLayersArrayOverridesInterval) {
  // Explicit per-layer array (5 entries = block_count incl. MTP): attention at layers 0 and 3.
  gguf::Array arr;
  arr.elem_type = gguf::ValueType::BOOL;
  for (bool r : {false, true, true, false, false}) {
    gguf::Value e;
    e.type = gguf::ValueType::BOOL;
    e.v = r;
    arr.items.push_back(e);
  }
  gguf::Value rl;
  rl.type = gguf::ValueType::ARRAY;
  rl.v = arr;
  auto f = gguf::File::Open(TinyModelPath());
  ASSERT_TRUE(f.ok());
  gguf::Writer w;
  for (const auto& [k, v] : (*f)->metadata()) w.AddValue(k, v);
  w.AddValue("qwen35.attention.recurrent_layers", rl);
  for (const auto& t : (*f)->tensors()) {
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    w.AddTensorBytes(t.name, ne, t.type, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  }
  const std::string p = TempPath("rl.gguf");
  ASSERT_TRUE(w.WriteFile(p).ok());
  auto c = LoadConfig(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->is_recurrent, (std::vector<bool>{false, true, true, false}));
  // Layer 0 is now declared attention but holds GDN tensors: the weights loader names the gap.
  absl::Status s = LoadAll(p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("blk.0.attn_q.weight"), std::string::npos) << s;
}

TEST(Weights, MissingTensorIsNamed) {
  for (const char* name : {"blk.1.ssm_a", "blk.3.attn_k_norm.weight", "output_norm.weight",
                           "blk.4.nextn.eh_proj.weight", "blk.2.ffn_down.weight"}) {
    const std::string p = TempPath("notensor.gguf");
    ASSERT_TRUE(Rewrite(TinyModelPath(), p, nullptr,
                        [&](TensorEdit& e) { return e.name != name; })
                    .ok());
    absl::Status s = LoadAll(p);
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_NE(s.message().find(name), std::string::npos) << s;
  }
}

TEST(Weights, WrongShapeNamesTensorAndBothShapes) {
  const std::string p = TempPath("shape.gguf");
  ASSERT_TRUE(Rewrite(TinyModelPath(), p, nullptr,
                      [](TensorEdit& e) {
                        if (e.name == "blk.3.attn_q.weight") e.ne = {128, 250};
                        return true;
                      })
                  .ok());
  absl::Status s = LoadAll(p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("blk.3.attn_q.weight"), std::string::npos) << s;
  EXPECT_NE(s.message().find("{128, 250}"), std::string::npos) << s;
  EXPECT_NE(s.message().find("{128, 256}"), std::string::npos) << s;
}

TEST(Weights, UnsupportedTypeIsNamed) {
  const std::string p = TempPath("type.gguf");
  ASSERT_TRUE(Rewrite(TinyModelPath(), p, nullptr,
                      [](TensorEdit& e) {
                        if (e.name == "blk.0.ffn_up.weight") e.type = GgmlType::Q4_0;
                        return true;
                      })
                  .ok());
  absl::Status s = LoadAll(p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("blk.0.ffn_up.weight"), std::string::npos) << s;
  EXPECT_NE(s.message().find("Q4_0"), std::string::npos) << s;
}

TEST(Weights, SmallTensorsOfAnyTypeAreDequantized) {
  // Store the GDN 1-D tensors and conv as F16: the loader dequantizes them to f32.
  const std::string p = TempPath("f16small.gguf");
  auto src = gguf::File::Open(TinyModelPath());
  ASSERT_TRUE(src.ok());
  gguf::Writer w;
  for (const auto& [k, v] : (*src)->metadata()) w.AddValue(k, v);
  for (const auto& t : (*src)->tensors()) {
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    const bool small = t.name == "blk.0.ssm_a" || t.name == "blk.0.ssm_conv1d.weight" ||
                       t.name == "blk.0.ssm_norm.weight";
    if (!small) {
      w.AddTensorBytes(t.name, ne, t.type, std::vector<uint8_t>(t.data, t.data + t.nbytes));
      continue;
    }
    std::vector<uint8_t> b(t.n_elements() * 2);
    const float* f = reinterpret_cast<const float*>(t.data);
    for (int64_t i = 0; i < t.n_elements(); ++i) {
      const uint16_t h = F32ToF16(f[i]);
      std::memcpy(&b[i * 2], &h, 2);
    }
    w.AddTensorBytes(t.name, ne, GgmlType::F16, std::move(b));
  }
  ASSERT_TRUE(w.WriteFile(p).ok());
  auto f16 = gguf::File::Open(p);
  ASSERT_TRUE(f16.ok());
  auto c = ModelConfig::FromGguf(**f16);
  ASSERT_TRUE(c.ok());
  auto w16 = ModelWeights::Load(**f16, *c);
  ASSERT_TRUE(w16.ok()) << w16.status();
  auto c32 = ModelConfig::FromGguf(**src);
  auto w32 = ModelWeights::Load(**src, *c32);
  ASSERT_TRUE(w32.ok());
  ASSERT_EQ(w16->layers[0].gdn.conv.size(), w32->layers[0].gdn.conv.size());
  for (size_t i = 0; i < w32->layers[0].gdn.conv.size(); ++i)
    EXPECT_NEAR(w16->layers[0].gdn.conv[i], w32->layers[0].gdn.conv[i], 2e-3);
  for (size_t i = 0; i < w32->layers[0].gdn.ssm_a.size(); ++i)
    EXPECT_NEAR(w16->layers[0].gdn.ssm_a[i], w32->layers[0].gdn.ssm_a[i],
                1e-3 * std::abs(w32->layers[0].gdn.ssm_a[i]));
}

TEST(Weights, TiedEmbeddingsAndNoMtp) {
  SynthOptions o = SynthOptions::Tiny();
  o.tied_output = true;
  o.with_mtp = false;
  const std::string p = testing::SynthPath("tied_nomtp", o);
  auto f = gguf::File::Open(p);
  ASSERT_TRUE(f.ok()) << f.status();
  auto c = ModelConfig::FromGguf(**f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_nextn, 0);
  EXPECT_EQ((*f)->tensors().size(), static_cast<size_t>(ExpectedTensorCount(*c, true)));
  auto w = ModelWeights::Load(**f, *c);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->tied_output);
  EXPECT_EQ(w->output.data, w->token_embd.data);
  EXPECT_FALSE(w->has_mtp);
  auto be = CreateCpuBackend(p, BackendOptions{1, 64, 2, 0});
  ASSERT_TRUE(be.ok()) << be.status();
  std::vector<float> logits, hid;
  std::vector<float> h(c->n_embd, 0.1f);
  EXPECT_EQ((*be)->MtpStep(0, 1, 0, h, &logits, &hid).code(),
            absl::StatusCode::kFailedPrecondition);  // the file has no MTP block
  SeqStep s{0, 0, {1, 2, 3}, false};
  StepOutput out;
  ASSERT_TRUE((*be)->Forward({&s, 1}, {}, &out).ok());
  EXPECT_EQ(out.n_rows, 1);
}

TEST(Weights, TokenizerNoneAndRecurrentArrayFilesLoadAndRun) {
  SynthOptions o = SynthOptions::Tiny();
  o.tokenizer = SynthTokenizer::kNone;
  o.n_vocab = 320;
  o.write_recurrent_layers = true;
  const std::string p = testing::SynthPath("toknone", o);
  auto f = gguf::File::Open(p);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->Find("tokenizer.ggml.tokens"), nullptr);
  EXPECT_NE((*f)->Find("qwen35.attention.recurrent_layers"), nullptr);
  auto be = CreateCpuBackend(p, BackendOptions{1, 64, 2, 0});
  ASSERT_TRUE(be.ok()) << be.status();
  EXPECT_EQ((*be)->config().n_vocab, 320);
  EXPECT_EQ((*be)->config().is_recurrent, (std::vector<bool>{true, true, true, false}));
  SeqStep s{0, 0, {1, 319, 3}, true};
  StepOutput out;
  ASSERT_TRUE((*be)->Forward({&s, 1}, {}, &out).ok());
  EXPECT_EQ(out.n_rows, 3);
  for (float x : out.logits) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace ds
