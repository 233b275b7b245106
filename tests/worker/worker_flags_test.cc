// Worker flags that select device paths (issue #19: --portable on|off; issue #22:
// --dense-weights on|off|auto, --early-launch on|off, --gdn-state f32|bf16, --tiled-f16-formats
// on|off, --prefill-fp8 on|off, --fp8-decode-rows N; issue #15: --coarse-draft-head on|off,
// --draft-resident on|off):
// parsed into WorkerOptions, bad values refused with a message naming the flag.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "worker/process/worker_process.h"

namespace ds {
namespace {

absl::StatusOr<WorkerOptions> Parse(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--scheduler", "127.0.0.1:1", "--model", "m.gguf"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseWorkerFlags(static_cast<int>(argv.size()), argv.data());
}

// An on|off flag: its default, both values, and a bad value refused naming the flag.
void ExpectOnOffFlag(const std::string& flag, bool DeviceTuning::*field, bool by_default) {
  SCOPED_TRACE(flag);
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->tuning.*field, by_default);
  for (const bool v : {true, false}) {
    auto set = Parse({flag, v ? "on" : "off"});
    ASSERT_TRUE(set.ok()) << set.status();
    EXPECT_EQ(set->tuning.*field, v);
  }
  auto bad = Parse({flag, "maybe"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find(flag + " expects on or off"),
            std::string::npos)
      << bad.status();
}

TEST(WorkerFlags, PortableOnOff) {
  ExpectOnOffFlag("--portable", &DeviceTuning::portable, false);
}

TEST(WorkerFlags, DenseWeightsOnOffAuto) {
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->tuning.dense_weights, DenseWeights::kAuto);
  auto on = Parse({"--dense-weights", "on"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->tuning.dense_weights, DenseWeights::kOn);
  auto off = Parse({"--dense-weights", "off"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->tuning.dense_weights, DenseWeights::kOff);
  auto bad = Parse({"--dense-weights", "1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("--dense-weights expects on, off or auto"),
            std::string::npos)
      << bad.status();
}

TEST(WorkerFlags, EarlyLaunchOnOff) {
  ExpectOnOffFlag("--early-launch", &DeviceTuning::early_launch, true);
}

TEST(WorkerFlags, TiledF16FormatsOnOff) {
  ExpectOnOffFlag("--tiled-f16-formats", &DeviceTuning::tiled_f16_formats, true);
}

TEST(WorkerFlags, F16WgmmaOnOff) {
  ExpectOnOffFlag("--f16-wgmma", &DeviceTuning::f16_wgmma, true);
}

TEST(WorkerFlags, PrefillFp8OnOff) {
  ExpectOnOffFlag("--prefill-fp8", &DeviceTuning::prefill_fp8, false);
}

// --fp8-decode-rows N: the default (33, measured) and counts (0: never); not a count refused
// naming the flag.
TEST(WorkerFlags, Fp8DecodeRows) {
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->tuning.fp8_decode_rows, 33);
  for (const int n : {0, 9, 64}) {
    auto set = Parse({"--fp8-decode-rows", std::to_string(n)});
    ASSERT_TRUE(set.ok()) << set.status();
    EXPECT_EQ(set->tuning.fp8_decode_rows, n);
  }
  for (const char* bad_value : {"-1", "sixteen", "4097"}) {
    auto bad = Parse({"--fp8-decode-rows", bad_value});
    ASSERT_FALSE(bad.ok()) << bad_value;
    EXPECT_NE(std::string(bad.status().message()).find("--fp8-decode-rows expects a row count"),
              std::string::npos)
        << bad.status();
  }
}

TEST(WorkerFlags, CoarseDraftHeadOnOff) {
  ExpectOnOffFlag("--coarse-draft-head", &DeviceTuning::coarse_draft_head, true);
}

TEST(WorkerFlags, DraftResidentOnOff) {
  ExpectOnOffFlag("--draft-resident", &DeviceTuning::draft_chain_resident, false);
}

TEST(WorkerFlags, ChainFoldOnOff) {
  ExpectOnOffFlag("--chain-fold", &DeviceTuning::draft_chain_fold_prep, false);
}

TEST(WorkerFlags, GdnOneGroupOnOff) {
  ExpectOnOffFlag("--gdn-one-group", &DeviceTuning::gdn_one_group_runs, false);
}

TEST(WorkerFlags, ChainPrefetchOnOff) {
  ExpectOnOffFlag("--chain-prefetch", &DeviceTuning::draft_chain_prefetch, false);
}

TEST(WorkerFlags, DeferredDraftsOnOff) {
  ExpectOnOffFlag("--deferred-drafts", &DeviceTuning::deferred_drafts, true);
}

TEST(WorkerFlags, JudgedChainsOnOff) {
  ExpectOnOffFlag("--judged-chains", &DeviceTuning::judged_chains, true);
}

TEST(WorkerFlags, GdnStateF32Bf16) {
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_FALSE(def->tuning.gdn_state_bf16);
  auto bf16 = Parse({"--gdn-state", "bf16"});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_TRUE(bf16->tuning.gdn_state_bf16);
  auto f32 = Parse({"--gdn-state", "f32"});
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_FALSE(f32->tuning.gdn_state_bf16);
  auto bad = Parse({"--gdn-state", "f16"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("--gdn-state expects f32 or bf16"),
            std::string::npos)
      << bad.status();
}

// `serve` forwards the switches by writing them as worker flags (DeviceTuningArgs): every
// combination that differs from the defaults in one or two switches parses back to itself, and the
// defaults write no flag at all.
TEST(WorkerFlags, DeviceTuningArgsParseBackToTheSameSwitches) {
  EXPECT_TRUE(DeviceTuningArgs(DeviceTuning{}).empty());
  std::vector<void (*)(DeviceTuning&)> changes = {
      [](DeviceTuning& t) { t.portable = !t.portable; },
      [](DeviceTuning& t) { t.dense_weights = DenseWeights::kOn; },
      [](DeviceTuning& t) { t.dense_weights = DenseWeights::kOff; },
      [](DeviceTuning& t) { t.early_launch = !t.early_launch; },
      [](DeviceTuning& t) { t.tiled_f16_formats = !t.tiled_f16_formats; },
      [](DeviceTuning& t) { t.coarse_draft_head = !t.coarse_draft_head; },
      [](DeviceTuning& t) { t.draft_chain_resident = !t.draft_chain_resident; },
      [](DeviceTuning& t) { t.deferred_drafts = !t.deferred_drafts; },
      [](DeviceTuning& t) { t.gdn_state_bf16 = !t.gdn_state_bf16; },
      [](DeviceTuning& t) { t.prefill_fp8 = !t.prefill_fp8; },
      [](DeviceTuning& t) { t.fp8_decode_rows = 16; }};
  for (size_t i = 0; i < changes.size(); ++i)
    for (size_t j = i; j < changes.size(); ++j) {
      DeviceTuning want;
      changes[i](want);
      if (j != i) changes[j](want);
      const std::vector<std::string> args = DeviceTuningArgs(want);
      SCOPED_TRACE(::testing::PrintToString(args));
      EXPECT_EQ(args.size() % 2, 0u);
      EXPECT_FALSE(args.empty());
      auto got = Parse(args);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->tuning == want);
    }
}

// The defaults of the switches are the backend's defaults, and each switch reaches its backend
// option (worker and generate both go through ApplyDeviceTuning).
TEST(WorkerFlags, ApplyDeviceTuningSetsEachBackendOption) {
  BackendOptions def;
  ApplyDeviceTuning(DeviceTuning{}, &def);
  const BackendOptions plain;
  EXPECT_EQ(def.portable, plain.portable);
  EXPECT_EQ(def.dense_weights, plain.dense_weights);
  EXPECT_EQ(def.early_launch, plain.early_launch);
  EXPECT_EQ(def.tiled_f16_formats, plain.tiled_f16_formats);
  EXPECT_EQ(def.coarse_draft_head, plain.coarse_draft_head);
  EXPECT_EQ(def.draft_chain_resident, plain.draft_chain_resident);
  EXPECT_EQ(def.gdn_state_bf16, plain.gdn_state_bf16);
  EXPECT_EQ(def.prefill_fp8, plain.prefill_fp8);
  EXPECT_EQ(def.fp8_decode_rows, plain.fp8_decode_rows);
  DeviceTuning t;
  t.portable = !t.portable;
  t.dense_weights = DenseWeights::kOff;
  t.early_launch = !t.early_launch;
  t.tiled_f16_formats = !t.tiled_f16_formats;
  t.coarse_draft_head = !t.coarse_draft_head;
  t.draft_chain_resident = !t.draft_chain_resident;
  t.gdn_state_bf16 = !t.gdn_state_bf16;
  t.prefill_fp8 = !t.prefill_fp8;
  t.fp8_decode_rows = 33;
  BackendOptions bo;
  ApplyDeviceTuning(t, &bo);
  EXPECT_EQ(bo.portable, t.portable);
  EXPECT_EQ(bo.dense_weights, DenseWeights::kOff);
  EXPECT_EQ(bo.early_launch, t.early_launch);
  EXPECT_EQ(bo.tiled_f16_formats, t.tiled_f16_formats);
  EXPECT_EQ(bo.coarse_draft_head, t.coarse_draft_head);
  EXPECT_EQ(bo.draft_chain_resident, t.draft_chain_resident);
  EXPECT_EQ(bo.gdn_state_bf16, t.gdn_state_bf16);
  EXPECT_EQ(bo.prefill_fp8, t.prefill_fp8);
  EXPECT_EQ(bo.fp8_decode_rows, 33);
}

}  // namespace
}  // namespace ds
