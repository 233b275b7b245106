// Helpers of the TP tests that run ranks as processes (tp_logits_test, custom_allreduce_test):
// a scratch directory per test program and a launcher that runs commands concurrently.
#pragma once
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"

extern char** environ;

namespace ds::tp_test {

// <gtest TempDir>/<prefix><pid>, created on first use.
inline std::string ScratchDir(const std::string& prefix) {
  const std::string p = ::testing::TempDir() + "/" + prefix + std::to_string(::getpid());
  std::filesystem::create_directories(p);
  return p;
}

// Runs the commands (argv[0] a path) concurrently; returns their exit codes (128 + signal when
// killed, -1 when one could not be started).
inline std::vector<int> RunAll(const std::vector<std::vector<std::string>>& cmds) {
  std::vector<pid_t> pids;
  for (const auto& cmd : cmds) {
    std::vector<char*> argv;
    for (const auto& s : cmd) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) pid = -1;
    pids.push_back(pid);
  }
  std::vector<int> rc;
  for (pid_t p : pids) {
    int st = 0;
    if (p < 0 || waitpid(p, &st, 0) != p) {
      rc.push_back(-1);
      continue;
    }
    rc.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  return rc;
}

}  // namespace ds::tp_test
