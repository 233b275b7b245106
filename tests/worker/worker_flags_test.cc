// Worker flags that select device paths (issue #19: --portable on|off; issue #22:
// --dense-weights on|off|auto, --early-launch on|off; issue #15: --coarse-draft-head on|off):
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

TEST(WorkerFlags, PortableOnOff) {
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_FALSE(def->portable);
  auto on = Parse({"--portable", "on"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->portable);
  auto off = Parse({"--portable", "off"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->portable);
  auto bad = Parse({"--portable", "yes"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("--portable expects on or off"),
            std::string::npos)
      << bad.status();
}

TEST(WorkerFlags, DenseWeightsOnOffAuto) {
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->dense_weights, DenseWeights::kAuto);
  auto on = Parse({"--dense-weights", "on"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->dense_weights, DenseWeights::kOn);
  auto off = Parse({"--dense-weights", "off"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->dense_weights, DenseWeights::kOff);
  auto bad = Parse({"--dense-weights", "1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("--dense-weights expects on, off or auto"),
            std::string::npos)
      << bad.status();
}

TEST(WorkerFlags, EarlyLaunchOnOff) {
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_TRUE(def->early_launch);
  auto off = Parse({"--early-launch", "off"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->early_launch);
  auto bad = Parse({"--early-launch", "maybe"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("--early-launch expects on or off"),
            std::string::npos)
      << bad.status();
}

TEST(WorkerFlags, CoarseDraftHeadOnOff) {
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_TRUE(def->coarse_draft_head);
  auto off = Parse({"--coarse-draft-head", "off"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->coarse_draft_head);
  auto on = Parse({"--coarse-draft-head", "on"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->coarse_draft_head);
  auto bad = Parse({"--coarse-draft-head", "4bit"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("--coarse-draft-head expects on or off"),
            std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace ds
