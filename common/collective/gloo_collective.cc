// GlooCollective (see gloo_collective.h). Gloo reports failures by throwing gloo::Exception
// (peer closed, timeout, enforce failures); every call is wrapped so none escapes.
#include "common/collective/gloo_collective.h"

#include <filesystem>
#include <numeric>

#include "absl/strings/str_cat.h"
#include <algorithm>
#include <cstring>

#include "gloo/allgather_ring.h"
#include "gloo/allreduce_ring.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/broadcast_one_to_all.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"

namespace ds {
namespace {

// Adapts a caller-provided RendezvousStore to gloo's Store interface.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(RendezvousStore* s, std::chrono::milliseconds timeout) : s_(s), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status st = s_->Set(key, data);
    if (!st.ok()) throw gloo::Exception(std::string(st.message()));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::vector<char>> v = s_->Get(key, timeout_);
    if (!v.ok()) throw gloo::Exception(std::string(v.status().message()));
    return std::move(*v);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    for (const std::string& k : keys) {
      absl::StatusOr<std::vector<char>> v = s_->Get(k, t);
      if (!v.ok()) throw gloo::Exception(std::string(v.status().message()));
    }
  }

 private:
  RendezvousStore* s_;
  std::chrono::milliseconds timeout_;
};

absl::Status Failed(const char* what, const std::exception& e) {
  return absl::UnavailableError(absl::StrCat("gloo ", what, " failed: ", e.what()));
}

}  // namespace

GlooCollective::~GlooCollective() = default;

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Create(const GlooOptions& o) {
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world)
    return absl::InvalidArgumentError(
        absl::StrCat("GlooOptions: rank ", o.rank, " not in a world of ", o.world));
  if (o.store_dir.empty() == (o.store == nullptr))
    return absl::InvalidArgumentError("GlooOptions: give exactly one of store_dir and store");
  std::unique_ptr<GlooCollective> c(new GlooCollective());
  c->rank_ = o.rank;
  c->world_ = o.world;
  try {
    gloo::transport::tcp::attr attr;
    if (!o.iface.empty())
      attr.iface = o.iface;
    else
      attr.hostname = o.hostname;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world);
    ctx->setTimeout(o.timeout);
    std::unique_ptr<gloo::rendezvous::Store> base;
    if (!o.store_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o.store_dir, ec);
      if (ec)
        return absl::InvalidArgumentError(
            absl::StrCat("GlooOptions.store_dir ", o.store_dir, ": ", ec.message()));
      base = std::make_unique<gloo::rendezvous::FileStore>(o.store_dir);
    } else {
      base = std::make_unique<StoreAdapter>(o.store, o.timeout);
    }
    gloo::rendezvous::PrefixStore store(o.prefix, *base);
    ctx->connectFullMesh(store, dev);
    c->ctx_ = std::move(ctx);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo rendezvous of rank ", o.rank, "/", o.world,
                                               " (prefix ", o.prefix, ") failed: ", e.what()));
  }
  return c;
}

namespace {
// Size bucket: ≥ n, 4 per octave, at least 256 elements.
size_t Bucket(size_t n) {
  if (n <= 256) return 256;
  size_t p = 1;
  while (p * 2 <= n) p *= 2;
  const size_t step = p / 4;
  return (n + step - 1) / step * step;
}
}  // namespace

GlooCollective::Op* GlooCollective::GetOp(Kind kind, size_t cap, int root) {
  auto& slot = ops_[{static_cast<int>(kind) * world_ + root, cap}];
  if (slot) return slot.get();
  auto op = std::make_unique<Op>();
  switch (kind) {
    case kAllReduce: {
      op->in.assign(cap, 0.f);
      std::vector<float*> p = {op->in.data()};
      op->alg = std::make_unique<gloo::AllreduceRing<float>>(ctx_, p, static_cast<int>(cap));
      break;
    }
    case kAllGather: {
      op->in.assign(cap, 0.f);
      op->out.assign(cap * world_, 0.f);
      std::vector<const float*> p = {op->in.data()};
      op->alg = std::make_unique<gloo::AllgatherRing<float>>(ctx_, p, op->out.data(),
                                                             static_cast<int>(cap));
      break;
    }
    case kBroadcast: {
      op->bytes.assign(cap, 0);
      std::vector<uint8_t*> p = {op->bytes.data()};
      op->alg = std::make_unique<gloo::BroadcastOneToAll<uint8_t>>(ctx_, p, cap, root);
      break;
    }
    case kBarrier:
      op->alg = std::make_unique<gloo::BarrierAllToAll>(ctx_);
      break;
  }
  slot = std::move(op);
  return slot.get();
}

absl::Status GlooCollective::AllReduceSum(float* data, size_t n) {
  if (n == 0 || world_ == 1) return absl::OkStatus();
  try {
    // The padding tail of the staging buffer carries whatever the last call left: its sums are
    // never read.
    Op* op = GetOp(kAllReduce, Bucket(n), 0);
    std::memcpy(op->in.data(), data, n * sizeof(float));
    op->alg->run();
    std::memcpy(data, op->in.data(), n * sizeof(float));
  } catch (const std::exception& e) {
    return Failed("allreduce", e);
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::AllGather(const float* in, size_t n, float* out) {
  if (n == 0) return absl::OkStatus();
  try {
    const size_t cap = Bucket(n);
    Op* op = GetOp(kAllGather, cap, gather_parity_);
    gather_parity_ ^= 1;
    std::memcpy(op->in.data(), in, n * sizeof(float));
    op->alg->run();
    for (int r = 0; r < world_; ++r)
      std::memcpy(out + r * n, op->out.data() + r * cap, n * sizeof(float));
  } catch (const std::exception& e) {
    return Failed("allgather", e);
  }
  return absl::OkStatus();
}

// Uneven all-gather as an all-gather of blocks padded to the largest count (every rank knows all
// counts), compacted afterwards.
absl::Status GlooCollective::AllGatherV(const float* in, std::span<const size_t> counts,
                                        float* out) {
  if (static_cast<int>(counts.size()) != world_)
    return absl::InvalidArgumentError(
        absl::StrCat("AllGatherV: ", counts.size(), " counts for a world of ", world_));
  const size_t mx = *std::max_element(counts.begin(), counts.end());
  if (mx == 0) return absl::OkStatus();
  try {
    const size_t cap = Bucket(mx);
    Op* op = GetOp(kAllGather, cap, gather_parity_);
    gather_parity_ ^= 1;
    if (counts[rank_]) std::memcpy(op->in.data(), in, counts[rank_] * sizeof(float));
    op->alg->run();
    size_t off = 0;
    for (int r = 0; r < world_; ++r) {
      if (counts[r]) std::memcpy(out + off, op->out.data() + r * cap, counts[r] * sizeof(float));
      off += counts[r];
    }
  } catch (const std::exception& e) {
    return Failed("allgatherv", e);
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::Broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= world_)
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " not in a world of ", world_));
  if (bytes == 0 || world_ == 1) return absl::OkStatus();
  try {
    Op* op = GetOp(kBroadcast, Bucket(bytes), root);
    if (rank_ == root) std::memcpy(op->bytes.data(), data, bytes);
    op->alg->run();
    if (rank_ != root) std::memcpy(data, op->bytes.data(), bytes);
  } catch (const std::exception& e) {
    return Failed("broadcast", e);
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::Barrier() {
  if (world_ == 1) return absl::OkStatus();
  try {
    GetOp(kBarrier, 0, 0)->alg->run();
  } catch (const std::exception& e) {
    return Failed("barrier", e);
  }
  return absl::OkStatus();
}

}  // namespace ds
