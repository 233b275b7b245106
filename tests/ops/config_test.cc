// common/config: key = value files, their errors (file:line), and expansion into a role's flags.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/config/config_file.h"

namespace ds::config {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ConfigParse, KeysValuesCommentsAndQuotes) {
  auto f = Parse(
      "# gateway\n"
      "\n"
      "  listen = 0.0.0.0:50051\n"
      "max_inflight=64   # trailing comment\n"
      "model = \"/models/qwen 3.5 #1.gguf\"  # quoted keeps spaces and '#'\n"
      "api_key_file = /etc/deltaserve/api-keys\n"
      "note = \"say \\\"hi\\\" \\\\ bye\"\n",
      "gw.conf");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->entries.size(), 5u);
  EXPECT_EQ(f->entries[0].key, "listen");
  EXPECT_EQ(f->entries[0].value, "0.0.0.0:50051");
  EXPECT_EQ(f->entries[0].line, 3);
  EXPECT_EQ(f->entries[1].value, "64");
  EXPECT_EQ(f->entries[2].value, "/models/qwen 3.5 #1.gguf");
  EXPECT_EQ(f->entries[4].value, "say \"hi\" \\ bye");
  EXPECT_EQ(FlagForKey("max_inflight"), "--max-inflight");
}

TEST(ConfigParse, ErrorsNameFileAndLine) {
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"listen 0.0.0.0:1\n", "c.conf:1: expected 'key = value'"},
      {"\n\nMax-Inflight = 3\n", "c.conf:3: bad key 'Max-Inflight'"},
      {"slots = 4\nslots = 8\n", "c.conf:2: key 'slots' set twice"},
      {"model =\n", "c.conf:1: key 'model' has no value"},
      {"model = \"/a/b\n", "c.conf:1: unterminated quoted value"},
      {"model = \"/a/b\" c\n", "c.conf:1: unexpected text after the quoted value"},
      {" = 3\n", "c.conf:1: bad key ''"},
  };
  for (const Case& c : cases) {
    auto f = Parse(c.text, "c.conf");
    ASSERT_FALSE(f.ok()) << c.text;
    EXPECT_NE(f.status().message().find(c.want), std::string::npos)
        << "got: " << f.status().message() << "\nwant: " << c.want;
  }
  auto missing = Load("/nonexistent/deltaserve.conf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/deltaserve.conf"), std::string::npos);
}

TEST(ConfigArgs, ExpandsInPlaceAndLaterFlagsOverride) {
  const std::string path = WriteTemp("sched.conf", "slots = 4\nctx = 8192\nsplit = pool\n");
  std::vector<std::string> in = {"--config", path, "--slots", "8"};
  std::vector<char*> argv;
  for (auto& s : in) argv.push_back(s.data());
  auto a = Args::Expand(static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(a.ok()) << a.status();
  const std::vector<std::string> want = {"--slots", "4",    "--ctx",   "8192",
                                         "--split", "pool", "--slots", "8"};
  EXPECT_EQ(a->args(), want);
  EXPECT_EQ(a->argc(), 8);
  EXPECT_STREQ(a->argv()[1], "4");
  EXPECT_TRUE(a->from_config());
}

TEST(ConfigArgs, ParserErrorsAreExplainedWithTheFileLine) {
  const std::string path =
      WriteTemp("gw.conf", "# gateway\nlistn = 0.0.0.0:1\nmax_inflight = many\nslots = 2\n");
  std::vector<std::string> in = {"--config", path, "--slots", "3"};
  std::vector<char*> argv;
  for (auto& s : in) argv.push_back(s.data());
  auto a = Args::Expand(static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(a.ok());
  absl::Status unknown = a->Explain(absl::InvalidArgumentError("unknown flag '--listn'"));
  EXPECT_EQ(unknown.message(), path + ":2: unknown key 'listn'");
  absl::Status bad =
      a->Explain(absl::InvalidArgumentError("--max-inflight expects an integer >= 1, got 'many'"));
  EXPECT_EQ(bad.message(), path + ":3: key 'max_inflight' expects an integer >= 1, got 'many'");
  // --slots was overridden on the command line: its error is about the command line.
  absl::Status cli = a->Explain(absl::InvalidArgumentError("--slots expects an integer"));
  EXPECT_EQ(cli.message(), "--slots expects an integer");
  // A flag that merely starts like a config key is not confused with it.
  absl::Status other = a->Explain(absl::InvalidArgumentError("--max-inflight-x is odd"));
  EXPECT_EQ(other.message(), "--max-inflight-x is odd");
}

TEST(ConfigArgs, NoNestedConfigAndMissingFile) {
  const std::string path = WriteTemp("nested.conf", "config = /etc/other.conf\n");
  std::vector<std::string> in = {"--config", path};
  std::vector<char*> argv;
  for (auto& s : in) argv.push_back(s.data());
  auto a = Args::Expand(2, argv.data());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("nested.conf:1"), std::string::npos);
  std::vector<std::string> in2 = {"--config"};
  std::vector<char*> argv2 = {in2[0].data()};
  EXPECT_FALSE(Args::Expand(1, argv2.data()).ok());
}

}  // namespace
}  // namespace ds::config

namespace ds::config {
namespace {

TEST(ConfigArgs, TakeRemovesSharedFlagsKeepingTheLastValue) {
  const std::string path =
      WriteTemp("take.conf", "log_level = debug\nmetrics_listen = 127.0.0.1:9400\nslots = 2\n");
  std::vector<std::string> in = {"--config", path, "--log-level", "warning", "--ctx", "64"};
  std::vector<char*> argv;
  for (auto& s : in) argv.push_back(s.data());
  auto a = Args::Expand(static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(a.ok());
  auto level = a->Take("--log-level");
  ASSERT_TRUE(level.ok());
  EXPECT_EQ(level->value_or(""), "warning") << "the command line overrides the file";
  auto metrics = a->Take("--metrics-listen");
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(metrics->value_or(""), "127.0.0.1:9400");
  auto none = a->Take("--tls-cert");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  const std::vector<std::string> want = {"--slots", "2", "--ctx", "64"};
  EXPECT_EQ(a->args(), want);
  EXPECT_EQ(a->argc(), 4);
  // Origins still line up after the removal.
  absl::Status e = a->Explain(absl::InvalidArgumentError("--slots must be >= 4"));
  EXPECT_EQ(e.message(), path + ":3: key 'slots' must be >= 4");
}

}  // namespace
}  // namespace ds::config

#include "common/config/role.h"

namespace ds::config {
namespace {

TEST(RoleSetup, TakesSharedFlagsAndExplainsBadLevels) {
  const std::string good =
      WriteTemp("role.conf", "log_level = warning\nmetrics_listen = 127.0.0.1:9400\nslots = 2\n");
  std::vector<std::string> in = {"--config", good, "--ctx", "64"};
  std::vector<char*> argv;
  for (auto& s : in) argv.push_back(s.data());
  auto r = SetUpRole("scheduler", static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->metrics_listen, "127.0.0.1:9400");
  const std::vector<std::string> want = {"--slots", "2", "--ctx", "64"};
  EXPECT_EQ(r->args.args(), want);
  EXPECT_FALSE(log::Enabled(log::Level::kInfo)) << "log_level = warning applied";
  log::SetMinLevel(log::Level::kInfo);

  const std::string bad = WriteTemp("role-bad.conf", "# x\nlog_level = loud\n");
  std::vector<std::string> in2 = {"--config", bad};
  std::vector<char*> argv2;
  for (auto& s : in2) argv2.push_back(s.data());
  auto b = SetUpRole("scheduler", 2, argv2.data());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(),
            bad + ":2: key 'log_level' expects debug, info, warning or error, got 'loud'");
}

}  // namespace
}  // namespace ds::config
