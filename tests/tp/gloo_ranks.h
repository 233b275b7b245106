// Collective tests in one process: every rank is a thread with its own GlooCollective, the ranks
// meeting through a fresh FileStore directory.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/collective/gloo_collective.h"
#include "gtest/gtest.h"

namespace ds {

// An empty directory under the test temp dir, unique to this process and `name`.
inline std::string FreshDir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/ds_coll_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(d);
  return d;
}

// Runs `world` ranks: `make(rank, gloo)` turns the rank's Gloo group into the collective under
// test, then fn(rank, collective) runs and a barrier ends it. The collectives outlive every
// thread: a rank that closed its sockets while a peer is still inside the last collective would
// make that peer fail ("connection closed by peer").
template <typename C>
void RunRanks(int world, const std::string& name,
              const std::function<std::unique_ptr<C>(int, std::unique_ptr<GlooCollective>)>& make,
              const std::function<void(int, C&)>& fn) {
  const std::string dir = FreshDir(name);
  std::vector<std::unique_ptr<C>> coll(world);
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      GlooOptions o;
      o.rank = r;
      o.world = world;
      o.store_dir = dir;
      o.prefix = name;
      auto g = GlooCollective::Create(o);
      ASSERT_TRUE(g.ok()) << g.status();
      coll[r] = make(r, std::move(*g));
      fn(r, *coll[r]);
      EXPECT_TRUE(coll[r]->Barrier().ok());
    });
  for (auto& t : th) t.join();
}

}  // namespace ds
