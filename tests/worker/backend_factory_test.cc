// worker/backend_factory.h: the kind names, and the speculative room a backend is made with
// (SpeculativeRoom): negative figures are refused before anything is created; the CPU backend
// takes speculative steps whatever it is given.
#include "worker/backend_factory.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>

#include "tools/synth/synth.h"

namespace ds {
namespace {

std::shared_ptr<const gguf::File> TinyFile() {
  static std::shared_ptr<const gguf::File> f = [] {
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("ds_factory_" + std::to_string(getpid()) + ".gguf"))
                                 .string();
    EXPECT_TRUE(SynthesizeGguf(SynthOptions::Tiny(), path).ok());
    auto file = gguf::File::Open(path);
    std::filesystem::remove(path);
    return file.ok() ? std::shared_ptr<const gguf::File>(std::move(*file)) : nullptr;
  }();
  return f;
}

TEST(BackendFactory, KindNames) {
  EXPECT_EQ(*ResolveBackendKind("cpu"), "cpu");
  EXPECT_EQ(ResolveBackendKind("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*BackendDeviceName("cpu", BackendOptions{}), "cpu");
}

TEST(BackendFactory, SpeculativeRoom) {
  auto f = TinyFile();
  ASSERT_TRUE(f);
  BackendOptions o;
  o.n_slots = 2;
  o.slot_ctx = 64;
  EXPECT_EQ(CreateBackend("cpu", f, o, SpeculativeRoom{-1, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateBackend("cpu", f, o, SpeculativeRoom{4, -2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto be = CreateBackend("cpu", f, o, SpeculativeRoom{4, 1});
  ASSERT_TRUE(be.ok()) << be.status();
  EXPECT_GE((*be)->max_speculative_tokens(), 4);
  // A speculative step of 4 tokens runs and commits.
  SeqStep s;
  s.tokens = {1, 2, 3, 4};
  s.speculative = true;
  StepOutput out;
  ASSERT_TRUE((*be)->Forward({&s, 1}, StepOptions{}, &out).ok());
  ASSERT_TRUE((*be)->CommitSpeculative(0, 2).ok());
  EXPECT_EQ((*be)->SlotLength(0), 2);
}

}  // namespace
}  // namespace ds
