// HostStagedCollective over GlooCollective between threads of one process, with a fake device:
// "device memory" is a PROT_NONE address range (any direct access by the host collective would
// fault) backed by a host array that only the fake's copy functions touch. Checks that every
// device buffer is staged (in and out), that the stream-ordered all-reduce copies on the caller's
// stream, that host buffers pass through untouched, and that the sums / gathers / broadcasts are
// Gloo's exact results. The CUDA StagingDevice is exercised on a GPU (tools/device/tp_cuda_check.sh).
#include "common/collective/host_staged_collective.h"

#include <sys/mman.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "common/collective/gloo_collective.h"
#include "gtest/gtest.h"
#include "tests/tp/gloo_ranks.h"

namespace ds {
namespace {

class FakeDevice final : public StagingDevice {
 public:
  explicit FakeDevice(size_t bytes) : size_(bytes), backing_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    base_ = static_cast<uint8_t*>(p);
  }
  ~FakeDevice() override { munmap(base_, size_); }
  std::string name() const override { return "fake"; }
  absl::StatusOr<bool> IsDevice(const void* p) const override {
    auto* b = static_cast<const uint8_t*>(p);
    return b >= base_ && b < base_ + size_;
  }
  absl::Status ToHost(void* host, const void* dev, size_t bytes, void* stream) override {
    DS_RETURN_IF_ERROR(Check(dev, bytes));
    std::memcpy(host, backing_.data() + Off(dev), bytes);
    Log(stream);
    return absl::OkStatus();
  }
  absl::Status ToDevice(void* dev, const void* host, size_t bytes, void* stream) override {
    DS_RETURN_IF_ERROR(Check(dev, bytes));
    std::memcpy(backing_.data() + Off(dev), host, bytes);
    Log(stream);
    return absl::OkStatus();
  }

  // "cudaMalloc" of n floats (bump allocation) and host-side access for the test.
  float* Alloc(size_t n) {
    float* p = reinterpret_cast<float*>(base_ + used_);
    used_ += (n * sizeof(float) + 255) / 256 * 256;
    EXPECT_LE(used_, size_);
    return p;
  }
  void Write(float* dev, const std::vector<float>& v) {
    std::memcpy(backing_.data() + Off(dev), v.data(), v.size() * sizeof(float));
  }
  std::vector<float> Read(const float* dev, size_t n) const {
    std::vector<float> v(n);
    std::memcpy(v.data(), backing_.data() + Off(dev), n * sizeof(float));
    return v;
  }
  int copies() const { return copies_; }
  const std::vector<void*>& streams() const { return streams_; }

 private:
  size_t Off(const void* p) const { return static_cast<const uint8_t*>(p) - base_; }
  absl::Status Check(const void* p, size_t bytes) const {
    auto* b = static_cast<const uint8_t*>(p);
    if (b < base_ || b + bytes > base_ + size_)
      return absl::InvalidArgumentError("fake device: copy outside device memory");
    return absl::OkStatus();
  }
  void Log(void* stream) {
    ++copies_;
    streams_.push_back(stream);
  }
  size_t size_;
  uint8_t* base_ = nullptr;
  size_t used_ = 0;
  std::vector<uint8_t> backing_;
  int copies_ = 0;
  std::vector<void*> streams_;
};

// Runs fn(rank, staged collective, its fake device) on `world` threads.
void RunStaged(int world, const std::string& name,
               const std::function<void(int, HostStagedCollective&, FakeDevice&)>& fn) {
  std::vector<FakeDevice*> devs(world);
  RunRanks<HostStagedCollective>(
      world, "staged_" + name,
      [&](int r, std::unique_ptr<GlooCollective> g) {
        auto dev = std::make_unique<FakeDevice>(1 << 22);
        devs[r] = dev.get();
        return std::make_unique<HostStagedCollective>(std::move(g), std::move(dev));
      },
      [&](int r, HostStagedCollective& c) { fn(r, c, *devs[r]); });
}

TEST(HostStagedCollective, DescribesItself) {
  RunStaged(2, "desc", [](int r, HostStagedCollective& c, FakeDevice&) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.world(), 2);
    EXPECT_EQ(c.name(), "staged-gloo");
    EXPECT_TRUE(c.supports_stream_ordered());
    EXPECT_FALSE(c.graph_capturable());
  });
}

TEST(HostStagedCollective, AllReduceOnStreamStagesDeviceBuffersOnTheCallersStream) {
  for (int world : {2, 3}) {
    RunStaged(world, "ar" + std::to_string(world), [world](int r, HostStagedCollective& c,
                                                           FakeDevice& d) {
      void* const stream = reinterpret_cast<void*>(0x5157);
      for (size_t n : {size_t{1}, size_t{513}, size_t{70000}}) {
        float* x = d.Alloc(n);
        std::vector<float> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((r + 1) * (i % 101));
        d.Write(x, v);
        const int before = d.copies();
        ASSERT_TRUE(c.AllReduceSumOnStream(x, n, stream).ok());
        EXPECT_EQ(d.copies(), before + 2);  // in and out, nothing else
        EXPECT_EQ(d.streams().back(), stream);
        EXPECT_EQ(d.streams()[d.streams().size() - 2], stream);
        const std::vector<float> got = d.Read(x, n);
        const float f = world * (world + 1) / 2.0f;
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], f * (i % 101)) << "n " << n << " i " << i;
      }
      // The blocking form on a device buffer stages too; on a host buffer it copies nothing.
      float* y = d.Alloc(4);
      d.Write(y, {1, 2, 3, static_cast<float>(r)});
      ASSERT_TRUE(c.AllReduceSum(y, 4).ok());
      const std::vector<float> gy = d.Read(y, 4);
      EXPECT_EQ(gy[0], world);
      EXPECT_EQ(gy[3], world * (world - 1) / 2.0f);
      const int before = d.copies();
      std::vector<float> h = {1.f, static_cast<float>(r)};
      ASSERT_TRUE(c.AllReduceSumOnStream(h.data(), 2, stream).ok());
      EXPECT_EQ(d.copies(), before);
      EXPECT_EQ(h[0], world);
    });
  }
}

TEST(HostStagedCollective, AllGatherVWithDeviceAndHostBuffers) {
  RunStaged(3, "agv", [](int r, HostStagedCollective& c, FakeDevice& d) {
    const std::vector<size_t> counts = {1, 3, 2};
    float* in = d.Alloc(counts[r]);
    d.Write(in, std::vector<float>(counts[r], static_cast<float>(r + 1)));
    float* out = d.Alloc(6);
    d.Write(out, std::vector<float>(6, -1.f));
    ASSERT_TRUE(c.AllGatherV(in, counts, out).ok());
    EXPECT_EQ(d.Read(out, 6), (std::vector<float>{1, 2, 2, 2, 3, 3}));
    // Device in, host out.
    std::vector<float> host_out(6, -1.f);
    ASSERT_TRUE(c.AllGatherV(in, counts, host_out.data()).ok());
    EXPECT_EQ(host_out, (std::vector<float>{1, 2, 2, 2, 3, 3}));
    // Even form.
    std::vector<float> two = {10.f * r, 10.f * r + 1};
    float* mine = d.Alloc(2);
    d.Write(mine, two);
    float* gathered = d.Alloc(6);
    ASSERT_TRUE(c.AllGather(mine, 2, gathered).ok());
    EXPECT_EQ(d.Read(gathered, 6), (std::vector<float>{0, 1, 10, 11, 20, 21}));
    const std::vector<size_t> bad = {1, 2};
    EXPECT_EQ(c.AllGatherV(in, bad, out).code(), absl::StatusCode::kInvalidArgument);
  });
}

TEST(HostStagedCollective, BroadcastDeviceAndHostBuffers) {
  RunStaged(2, "bc", [](int r, HostStagedCollective& c, FakeDevice& d) {
    for (int root = 0; root < 2; ++root) {
      float* x = d.Alloc(3);
      d.Write(x, {static_cast<float>(r), 7.f, static_cast<float>(100 + r)});
      ASSERT_TRUE(c.Broadcast(x, 3 * sizeof(float), root).ok());
      EXPECT_EQ(d.Read(x, 3),
                (std::vector<float>{static_cast<float>(root), 7.f, static_cast<float>(100 + root)}));
      int32_t ids[2] = {r, r};  // host: the worker broadcasts sampled token ids from host memory
      const int before = d.copies();
      ASSERT_TRUE(c.Broadcast(ids, sizeof(ids), root).ok());
      EXPECT_EQ(d.copies(), before);
      EXPECT_EQ(ids[1], root);
    }
    float z = 0;
    EXPECT_EQ(c.Broadcast(&z, 4, 2).code(), absl::StatusCode::kInvalidArgument);
  });
}

}  // namespace
}  // namespace ds
