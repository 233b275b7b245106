// GlooCollective: ds::Collective over Gloo's TCP transport, for CPU worker processes.
//
// Rendezvous: every rank publishes its listening address in a key-value store and connects to
// every other rank (full mesh). The store is either a directory on a shared filesystem
// (gloo::rendezvous::FileStore; tests and single-host runs) or any RendezvousStore the caller
// provides (the scheduler will hand one out over gRPC; see docs/tp.md).
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/collective/collective.h"

namespace gloo {
class Context;
}

namespace ds {

// Minimal blocking key-value store for the rendezvous (what the scheduler must provide).
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual absl::Status Set(const std::string& key, const std::vector<char>& value) = 0;
  // Blocks until the key exists or the timeout passes (DeadlineExceeded).
  virtual absl::StatusOr<std::vector<char>> Get(const std::string& key,
                                                std::chrono::milliseconds timeout) = 0;
};

struct GlooOptions {
  int rank = 0;
  int world = 1;
  // Exactly one of the two rendezvous sources.
  std::string store_dir;                   // FileStore directory (created if missing)
  RendezvousStore* store = nullptr;        // caller-owned; must outlive Create()
  std::string prefix = "tp";               // key namespace (one per TP group / generation)
  // Transport: the interface to bind ("lo", "eth0") or, when empty, the address `hostname`
  // resolves to ("127.0.0.1" by default: single host).
  std::string iface;
  std::string hostname = "127.0.0.1";
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

class GlooCollective final : public Collective {
 public:
  static absl::StatusOr<std::unique_ptr<GlooCollective>> Create(const GlooOptions& opts);
  ~GlooCollective() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override { return "gloo"; }
  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status AllGather(const float* in, size_t n, float* out) override;
  absl::Status AllGatherV(const float* in, std::span<const size_t> counts, float* out) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;

 private:
  GlooCollective() = default;
  std::shared_ptr<gloo::Context> ctx_;
  int rank_ = 0, world_ = 1;
  uint32_t tag_ = 0;  // one tag per call: consecutive collectives never share a tag
};

}  // namespace ds
