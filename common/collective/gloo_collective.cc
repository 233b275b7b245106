// GlooCollective (see gloo_collective.h). Gloo reports failures by throwing gloo::Exception
// (peer closed, timeout, enforce failures); every call is wrapped so none escapes.
#include "common/collective/gloo_collective.h"

#include <filesystem>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
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

absl::Status GlooCollective::AllReduceSum(float* data, size_t n) {
  if (n == 0 || world_ == 1) return absl::OkStatus();
  try {
    gloo::AllreduceOptions opts(ctx_);
    opts.setOutput(data, n);  // in place: the output doubles as the input
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(tag_++);
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    return Failed("allreduce", e);
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::AllGather(const float* in, size_t n, float* out) {
  if (n == 0) return absl::OkStatus();
  try {
    gloo::AllgatherOptions opts(ctx_);
    opts.setInput(const_cast<float*>(in), n);  // gloo only reads the input
    opts.setOutput(out, n * world_);
    opts.setTag(tag_++);
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    return Failed("allgather", e);
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::AllGatherV(const float* in, std::span<const size_t> counts,
                                        float* out) {
  if (static_cast<int>(counts.size()) != world_)
    return absl::InvalidArgumentError(
        absl::StrCat("AllGatherV: ", counts.size(), " counts for a world of ", world_));
  if (std::accumulate(counts.begin(), counts.end(), size_t{0}) == 0) return absl::OkStatus();
  try {
    gloo::AllgathervOptions opts(ctx_);
    opts.setInput(const_cast<float*>(in), counts[rank_]);
    opts.setOutput(out, std::vector<size_t>(counts.begin(), counts.end()));
    opts.setTag(tag_++);
    gloo::allgatherv(opts);
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
    gloo::BroadcastOptions opts(ctx_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTag(tag_++);
    gloo::broadcast(opts);
  } catch (const std::exception& e) {
    return Failed("broadcast", e);
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::Barrier() {
  if (world_ == 1) return absl::OkStatus();
  try {
    gloo::BarrierOptions opts(ctx_);
    opts.setTag(tag_++);
    gloo::barrier(opts);
  } catch (const std::exception& e) {
    return Failed("barrier", e);
  }
  return absl::OkStatus();
}

}  // namespace ds
