// GlooCollective: ds::Collective over Gloo's TCP transport, for CPU worker processes.
//
// Rendezvous: every rank publishes its listening address in a key-value store and connects to
// every other rank (full mesh). The store is either a directory on a shared filesystem
// (gloo::rendezvous::FileStore; tests and single-host runs) or any RendezvousStore the caller
// provides (the scheduler will hand one out over gRPC; see docs/tp.md).
//
// Performance note (measured, docs/perf/tp.md): Gloo's one-shot API (gloo::allreduce with unbound
// buffers) costs 2–8 ms per small call on loopback here, its pre-bound algorithm classes
// (AllreduceRing, AllgatherRing, BroadcastOneToAll, BarrierAllToAll) ~0.1–0.3 ms. So each call
// stages through a persistent buffer owned by a cached algorithm instance, keyed by a size bucket
// (4 buckets per octave: at most 25% padding). Every rank makes the same calls in the same order,
// so every rank creates the same instances in the same order (Gloo pairs them by creation slot).
#pragma once
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/collective/collective.h"

namespace gloo {
class Context;
class Algorithm;
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
  // A cached algorithm with its staging buffers.
  struct Op {
    std::vector<float> in, out;   // [cap] / [cap·world] (all-gather) staging
    std::vector<uint8_t> bytes;   // [cap] broadcast staging
    std::unique_ptr<gloo::Algorithm> alg;
  };
  enum Kind { kAllReduce, kAllGather, kBroadcast, kBarrier };
  Op* GetOp(Kind kind, size_t cap, int root);

  std::shared_ptr<gloo::Context> ctx_;
  int rank_ = 0, world_ = 1;
  std::map<std::pair<int, size_t>, std::unique_ptr<Op>> ops_;  // (kind·world + root, cap)
  // AllgatherRing writes straight into the peers' output buffers with no clear-to-send
  // handshake, so a fast rank's next gather could overwrite a slow rank's result before it is
  // copied out. Alternating between two instances prevents that: finishing gather k+1 needs every
  // rank to have started it, i.e. to have copied out gather k, before gather k+2 reuses k's
  // buffers. (AllreduceRing and BroadcastOneToAll handshake themselves.)
  int gather_parity_ = 0;
};

}  // namespace ds
