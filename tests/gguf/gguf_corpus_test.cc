// Regression over the committed fuzz corpus (tests/fuzz/corpus/gguf): nothing may crash, valid_*
// files must parse, bad_* files must be rejected, and the committed seeds must match the generator.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/gguf/gguf.h"
#include "tests/fuzz/gguf_corpus_gen.h"
#include "tests/gguf/raw_gguf.h"

namespace ds::gguf {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

TEST(GgufCorpus, EveryFileParsesWithoutCrashing) {
  const fs::path dir = DS_GGUF_CORPUS_DIR;
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int valid = 0, bad = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    const auto bytes = ReadAll(entry.path());
    testing::ExactBuffer buf(bytes);
    auto f = File::Parse(buf.data.get(), buf.size);
    if (name.rfind("valid_", 0) == 0) {
      ++valid;
      EXPECT_TRUE(f.ok()) << name << ": " << f.status();
    } else if (name.rfind("bad_", 0) == 0) {
      ++bad;
      EXPECT_FALSE(f.ok()) << name;
    }
    // Any other file (e.g. a minimised fuzzer finding) only has to not crash.
    // Opening through mmap must agree with parsing the bytes.
    auto g = File::Open(entry.path().string());
    EXPECT_EQ(g.ok(), f.ok()) << name;
  }
  EXPECT_GE(valid, 8);
  EXPECT_GE(bad, 5);
}

TEST(GgufCorpus, CommittedSeedsMatchGenerator) {
  const fs::path dir = DS_GGUF_CORPUS_DIR;
  for (const auto& [name, bytes] : testing::MakeGgufCorpus()) {
    ASSERT_FALSE(bytes.empty()) << name;
    EXPECT_EQ(ReadAll(dir / name), bytes)
        << name << " is stale: rerun gguf_make_corpus " << dir.string();
  }
}

}  // namespace
}  // namespace ds::gguf
