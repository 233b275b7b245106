// The committed demo model (models/demo/): the CPU backend's greedy tokens equal those PyTorch
// produced for the same weights (tools/train/train.py, stored in tests/model/data/demo_pytorch_ref.json
// by the training run), the vocabulary in the file encodes the prompts to the ids PyTorch was
// given, and the MTP head's greedy drafts over held-out text equal PyTorch's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/model_alias.h"
#include "gtest/gtest.h"
#include "worker/model/cpu_backend.h"

namespace ds {
namespace {

const std::string kRoot = DS_SOURCE_DIR;

nlohmann::json LoadRef() {
  std::ifstream f(kRoot + "/tests/model/data/demo_pytorch_ref.json");
  EXPECT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::unique_ptr<CpuBackend> MakeDemo(int ctx) {
  BackendOptions o;
  o.n_slots = 1;
  o.slot_ctx = ctx;
  o.n_threads = 2;
  auto b = CpuBackend::Create(kRoot + "/" + kDemoModelRelPath, o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

int32_t Argmax(const float* row, int n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

TEST(DemoModel, AliasNamesTheCommittedFile) {
  const std::string p = ResolveModelAlias("demo");
  EXPECT_NE(p.find(kDemoModelRelPath), std::string::npos) << p;
  EXPECT_TRUE(gguf::File::Open(p).ok()) << p;
  EXPECT_EQ(ResolveModelAlias("other.gguf"), "other.gguf");
}

TEST(DemoModel, PromptsTokenizeAsForPyTorch) {
  const nlohmann::json ref = LoadRef();
  auto file = gguf::File::Open(kRoot + "/" + kDemoModelRelPath);
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_EQ(ref["greedy_f16"].size(), 3u);
  for (const auto& p : ref["greedy_f16"]) {
    auto ids = tok->Encode(p["prompt"].get<std::string>(), /*parse_special=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, p["prompt_ids"].get<std::vector<int32_t>>()) << p["prompt"];
  }
}

TEST(DemoModel, GreedyTokensEqualPyTorch) {
  const nlohmann::json ref = LoadRef();
  auto be = MakeDemo(256);
  ASSERT_TRUE(be);
  const int V = be->config().n_vocab;
  for (const auto& p : ref["greedy_f16"]) {
    const auto prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = p["tokens"].get<std::vector<int32_t>>();
    ASSERT_EQ(want.size(), 32u);
    be->ResetSlot(0);
    SeqStep s{0, 0, prompt, false};
    StepOutput out;
    ASSERT_TRUE(be->Forward({&s, 1}, StepOptions{}, &out).ok());
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      got.push_back(Argmax(out.logits.data() + out.logits.size() - V, V));
      SeqStep d{0, static_cast<int32_t>(prompt.size() + i), {got.back()}, false};
      out = StepOutput{};
      ASSERT_TRUE(be->Forward({&d, 1}, StepOptions{}, &out).ok());
    }
    EXPECT_EQ(got, want) << p["prompt"];
  }
}

TEST(DemoModel, MtpDraftsEqualPyTorch) {
  const nlohmann::json ref = LoadRef();
  const auto ids = ref["check_ids"].get<std::vector<int32_t>>();
  const auto want = ref["mtp_argmax_f16"].get<std::vector<int32_t>>();
  ASSERT_EQ(want.size() + 1, ids.size());
  auto be = MakeDemo(128);
  ASSERT_TRUE(be);
  const int V = be->config().n_vocab, H = be->config().n_embd;
  SeqStep s{0, 0, ids, true};
  StepOptions o;
  o.want_hidden = true;
  StepOutput out;
  ASSERT_TRUE(be->Forward({&s, 1}, o, &out).ok());
  std::vector<int32_t> got;
  std::vector<float> lg, ho;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    std::span<const float> h(out.hidden.data() + t * H, H);
    ASSERT_TRUE(be->MtpStep(0, ids[t + 1], static_cast<int32_t>(t), h, &lg, &ho).ok());
    got.push_back(Argmax(lg.data(), V));
  }
  EXPECT_EQ(got, want);
}

// FP8 prefill's CPU twin (BackendOptions::prefill_fp8, worker/model/fp8_prefill_emulation.h): a
// prefill piece of more than 64 rows multiplies e4m3 values, one of 64 rows or fewer keeps the
// exact products bit for bit with fp8_decode_rows 0; with fp8_decode_rows N, products of N rows
// take FP8 and of N - 1 do not; over held-out text (the reference's 64 ids three times, 192
// tokens in one piece) the text's mean negative log-likelihood moves by under 1%.
TEST(DemoModel, Fp8PrefillEmulation) {
  const nlohmann::json ref = LoadRef();
  const auto check = ref["check_ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> ids;
  for (int i = 0; i < 3; ++i) ids.insert(ids.end(), check.begin(), check.end());
  auto prefill = [&](bool fp8, size_t n, std::vector<float>* logits, int decode_rows = 0) {
    BackendOptions o;
    o.n_slots = 1;
    o.slot_ctx = 256;
    o.n_threads = 2;
    o.prefill_fp8 = fp8;
    o.fp8_decode_rows = decode_rows;
    auto b = CpuBackend::Create(kRoot + "/" + kDemoModelRelPath, o);
    ASSERT_TRUE(b.ok()) << b.status();
    SeqStep s{0, 0, std::vector<int32_t>(ids.begin(), ids.begin() + n), true};
    StepOutput out;
    ASSERT_TRUE((*b)->Forward({&s, 1}, StepOptions{}, &out).ok());
    *logits = std::move(out.logits);
  };
  std::vector<float> exact64, fp8_64, exact, fp8, exact15, exact16, fp8_15, fp8_16;
  prefill(false, 64, &exact64);
  prefill(true, 64, &fp8_64);
  prefill(false, 15, &exact15);
  prefill(false, 16, &exact16);
  prefill(true, 15, &fp8_15, 16);
  prefill(true, 16, &fp8_16, 16);
  prefill(false, ids.size(), &exact);
  prefill(true, ids.size(), &fp8);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(exact64, fp8_64);  // 64 rows: the column kernels' range, no FP8
  EXPECT_EQ(exact15, fp8_15);  // 15 rows at fp8_decode_rows 16: exact
  EXPECT_NE(exact16, fp8_16);  // 16 rows: e4m3
  const int V = static_cast<int>(exact.size() / ids.size());
  auto mean_nll = [&](const std::vector<float>& l) {
    double nll = 0;
    for (size_t t = 0; t + 1 < ids.size(); ++t) {
      const float* row = l.data() + t * V;
      const double mx = *std::max_element(row, row + V);
      double z = 0;
      for (int v = 0; v < V; ++v) z += std::exp(row[v] - mx);
      nll += mx + std::log(z) - row[ids[t + 1]];
    }
    return nll / static_cast<double>(ids.size() - 1);
  };
  const double a = mean_nll(exact), b = mean_nll(fp8);
  std::printf("demo, 192 tokens in one piece: mean NLL %.5f exact, %.5f with FP8 (%+.3f%%)\n", a,
              b, 100.0 * (b - a) / a);
  EXPECT_NE(exact, fp8);  // the e4m3 products did run
  EXPECT_LT(std::fabs(b - a), 0.01 * a);
}

}  // namespace
}  // namespace ds
