// Helpers shared by the process-level cluster tests (gateway_test, tp_cluster_test,
// worker_scheduler_test): a
// per-process scratch directory removed after the last test, the tiny synthesized model, small
// file and process utilities. Header-only; each test binary has one translation unit.
#pragma once
#include <errno.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tools/synth/synth.h"

namespace ds::cluster_test {

// /tmp/ds_<test binary>_<pid>: models, port files and logs of this test process.
inline const std::string& TestDir() {
  static const std::string dir = [] {
    std::string d = (std::filesystem::temp_directory_path() /
                     (std::string("ds_") + program_invocation_short_name + "_" +
                      std::to_string(getpid())))
                        .string();
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Removes TestDir() after the last test.
class RemoveTestDir : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(TestDir(), ec);
  }
};
inline ::testing::Environment* const kRemoveTestDir =
    ::testing::AddGlobalTestEnvironment(new RemoveTestDir);

// The tiny model (SynthOptions::Tiny(): F32, 4 q / 2 KV heads, 2 GDN key heads), made once.
inline const std::string& TinyModel() {
  static const std::string path = [] {
    std::string p = TestDir() + "/tiny.gguf";
    absl::Status s = SynthesizeGguf(SynthOptions::Tiny(), p);
    EXPECT_TRUE(s.ok()) << s;
    return p;
  }();
  return path;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// True while the child `pid` has not exited (reaps it when it has).
inline bool Alive(pid_t pid) {
  int st = 0;
  return pid > 0 && waitpid(pid, &st, WNOHANG) == 0;
}

// Runs `cmd` through the shell; its exit code (-1 when it did not exit normally) and stdout.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
inline CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  const int st = pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// "1,2,3", the --prompt-ids form.
inline std::string Join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace ds::cluster_test
