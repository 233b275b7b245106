// GPU test of the NCCL tensor-parallel path at TP = 1 (label `gpu`, not run in CI):
//   * NcclCollective over a one-rank communicator (ncclGetUniqueId + ncclCommInitRank) reduces,
//     broadcasts and gathers device (and, where supported, host) buffers exactly;
//   * the CUDA backend with that collective (two stream-ordered all-reduces per layer, also inside
//     the decode CUDA graphs) gives logits bit-identical to the backend without a collective, on a
//     synthesized tiny model (F32 weights): prefill through cuBLAS (> 32 rows) and GEMV (<= 32
//     rows), then greedy decode long enough for the graphs to be captured and replayed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/collective/nccl_collective.h"
#include "tests/gpu_test_options.h"
#include "tools/synth/synth.h"
#include "worker/cuda/cuda_backend.h"

namespace ds {
namespace {

std::unique_ptr<NcclCollective> OneRank() {
  auto id = NcclCollective::NewUniqueId();
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return nullptr;
  auto c = NcclCollective::Create(0, 1, *id, 0);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(NcclCollectiveWorld1, AllReduceBroadcastGatherAreExact) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto c = OneRank();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world(), 1);
  EXPECT_EQ(c->name(), "nccl");
  EXPECT_TRUE(c->supports_stream_ordered());

  const size_t n = 100003;  // odd size: no vector-width assumptions
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 977) * 0.37f - 123.25f + 1e-7f * i;
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);

  // Blocking all-reduce over one rank: the sum of one term, bit for bit.
  ASSERT_TRUE(c->AllReduceSum(d, n).ok());
  std::vector<float> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), d, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), host.data(), n * 4), 0);

  // Stream-ordered form on the caller's stream, after a kernel-like op on the same stream.
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 0, n * 4, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d, host.data(), n * 4, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_TRUE(c->AllReduceSumOnStream(d, n, s).ok());
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), d, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), host.data(), n * 4), 0);

  // The same captured into a CUDA graph and replayed twice (what the backend's decode graphs do).
  {
    ASSERT_EQ(cudaMemcpy(d, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    cudaGraph_t g = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    absl::Status st = c->AllReduceSumOnStream(d, n, s);
    ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    ASSERT_TRUE(st.ok()) << st;
    cudaGraphExec_t ge = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(back.data(), d, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(back.data(), host.data(), n * 4), 0);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  }

  // Host buffers (the worker broadcasts sampled token ids from host memory).
  std::vector<float> h2(host.begin(), host.begin() + 1000);
  ASSERT_TRUE(c->AllReduceSum(h2.data(), h2.size()).ok());
  EXPECT_EQ(std::memcmp(h2.data(), host.data(), 1000 * 4), 0);
  int32_t tok = 4242;
  ASSERT_TRUE(c->Broadcast(&tok, sizeof(tok), 0).ok());
  EXPECT_EQ(tok, 4242);
  EXPECT_FALSE(c->Broadcast(&tok, sizeof(tok), 1).ok());  // root outside the world

  // Device broadcast, gather, gather-v, barrier.
  ASSERT_TRUE(c->Broadcast(d, n * 4, 0).ok());
  float* o = nullptr;
  ASSERT_EQ(cudaMalloc(&o, n * 4), cudaSuccess);
  ASSERT_TRUE(c->AllGather(d, n, o).ok());
  ASSERT_EQ(cudaMemcpy(back.data(), o, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), host.data(), n * 4), 0);
  ASSERT_EQ(cudaMemset(o, 0, n * 4), cudaSuccess);
  const size_t counts[1] = {n};
  ASSERT_TRUE(c->AllGatherV(d, counts, o).ok());
  ASSERT_EQ(cudaMemcpy(back.data(), o, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), host.data(), n * 4), 0);
  EXPECT_TRUE(c->Barrier().ok());
  cudaFree(o);
  cudaFree(d);
  cudaStreamDestroy(s);
}

// A host-only collective, for the backend's refusal.
class HostOnly final : public Collective {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::string name() const override { return "hostonly"; }
  absl::Status AllReduceSum(float*, size_t) override { return absl::OkStatus(); }
  absl::Status AllGather(const float*, size_t, float*) override { return absl::OkStatus(); }
  absl::Status AllGatherV(const float*, std::span<const size_t>, float*) override {
    return absl::OkStatus();
  }
  absl::Status Broadcast(void*, size_t, int) override { return absl::OkStatus(); }
  absl::Status Barrier() override { return absl::OkStatus(); }
};

class CudaBackendNccl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string((std::filesystem::temp_directory_path() /
                             ("ds_nccl_tiny_" + std::to_string(getpid()) + ".gguf"))
                                .string());
    SynthOptions o = SynthOptions::Tiny();
    o.weight_type = GgmlType::F32;
    absl::Status s = SynthesizeGguf(o, *path_);
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*path_);
    delete path_;
  }
  static std::string* path_;
};
std::string* CudaBackendNccl::path_ = nullptr;

TEST_F(CudaBackendNccl, RefusesWhatItCannotDo) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  BackendOptions bo;
  bo.n_slots = 1;
  bo.slot_ctx = 64;
  bo.tp_world = 2;
  bo.tp_rank = 1;
  // tp_world 2 without a collective
  auto b = CreateCudaBackend(*path_, testing::GpuTestOptions(bo));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  EXPECT_NE(b.status().message().find("needs a collective"), std::string_view::npos) << b.status();

  HostOnly h;
  BackendOptions bh;
  bh.n_slots = 1;
  bh.slot_ctx = 64;
  bh.collective = &h;
  auto b2 = CreateCudaBackend(*path_, testing::GpuTestOptions(bh));
  ASSERT_FALSE(b2.ok());
  EXPECT_EQ(b2.status().code(), absl::StatusCode::kInvalidArgument) << b2.status();
}

// Runs the same schedule on `be`: a 40-token prefill in slot 0 (all logits: cuBLAS rows), a
// 7-token prefill in slot 1 (GEMV rows), then `n_decode` greedy steps of both slots together and
// of slot 0 alone (each batch size: 1st step eager, 2nd captured, then replayed). Returns every
// logit produced, in order.
std::vector<float> RunSchedule(Backend& be, int n_decode) {
  std::vector<float> all;
  const int V = be.config().n_vocab;
  auto argmax = [&](const std::vector<float>& l, int row) {
    return static_cast<int32_t>(std::max_element(l.begin() + static_cast<size_t>(row) * V,
                                                 l.begin() + static_cast<size_t>(row + 1) * V) -
                                (l.begin() + static_cast<size_t>(row) * V));
  };
  SeqStep a, b;
  a.slot = 0;
  a.all_logits = true;
  for (int i = 0; i < 40; ++i) a.tokens.push_back((i * 37 + 5) % V);
  b.slot = 1;
  for (int i = 0; i < 7; ++i) b.tokens.push_back((i * 11 + 3) % V);
  StepOutput out;
  absl::Status st = be.Forward({&a, 1}, StepOptions{}, &out);
  EXPECT_TRUE(st.ok()) << st;
  all.insert(all.end(), out.logits.begin(), out.logits.end());
  int32_t next_a = argmax(out.logits, 39);
  st = be.Forward({&b, 1}, StepOptions{}, &out);
  EXPECT_TRUE(st.ok()) << st;
  all.insert(all.end(), out.logits.begin(), out.logits.end());
  int32_t next_b = argmax(out.logits, 0);
  a.pos0 = 40;
  a.all_logits = false;
  b.pos0 = 7;
  for (int i = 0; i < n_decode; ++i) {
    a.tokens = {next_a};
    b.tokens = {next_b};
    SeqStep both[2] = {a, b};
    st = be.Forward(both, StepOptions{}, &out);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return all;
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    next_a = argmax(out.logits, 0);
    next_b = argmax(out.logits, 1);
    ++a.pos0;
    ++b.pos0;
  }
  for (int i = 0; i < n_decode; ++i) {
    a.tokens = {next_a};
    st = be.Forward({&a, 1}, StepOptions{}, &out);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return all;
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    next_a = argmax(out.logits, 0);
    ++a.pos0;
  }
  return all;
}

TEST_F(CudaBackendNccl, LogitsBitIdenticalWithAndWithoutCollective) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  BackendOptions bo;
  bo.n_slots = 2;
  bo.slot_ctx = 128;
  auto plain = CreateCudaBackend(*path_, testing::GpuTestOptions(bo));
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<float> ref = RunSchedule(**plain, 6);
  plain->reset();

  auto c = OneRank();
  ASSERT_NE(c, nullptr);
  BackendOptions bn = bo;
  bn.collective = c.get();
  auto with = CreateCudaBackend(*path_, testing::GpuTestOptions(bn));
  ASSERT_TRUE(with.ok()) << with.status();
  const std::vector<float> got = RunSchedule(**with, 6);
  with->reset();  // before the collective it points into

  // The baseline itself must be repeatable, or a difference would say nothing about NCCL.
  auto plain2 = CreateCudaBackend(*path_, testing::GpuTestOptions(bo));
  ASSERT_TRUE(plain2.ok()) << plain2.status();
  const std::vector<float> ref2 = RunSchedule(**plain2, 6);

  auto count_diff = [](const std::vector<float>& p, const std::vector<float>& q, double* max_abs) {
    size_t diff = 0;
    *max_abs = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      uint32_t x, y;
      std::memcpy(&x, &p[i], 4);
      std::memcpy(&y, &q[i], 4);
      if (x != y) {
        ++diff;
        *max_abs = std::max(*max_abs, static_cast<double>(std::abs(p[i] - q[i])));
      }
    }
    return diff;
  };
  ASSERT_GT(ref.size(), 0u);
  ASSERT_EQ(ref2.size(), ref.size());
  ASSERT_EQ(got.size(), ref.size());
  double m0 = 0, m1 = 0;
  const size_t d0 = count_diff(ref, ref2, &m0);
  EXPECT_EQ(d0, 0u) << "the backend without a collective is not repeatable: " << d0 << " of "
                    << ref.size() << " logits differ, max |d| " << m0;
  const size_t d1 = count_diff(ref, got, &m1);
  EXPECT_EQ(d1, 0u) << d1 << " of " << ref.size() << " logits differ with NCCL, max |d| " << m1;
  std::printf("nccl tp=1: compared %zu logits with and without the collective: %zu differ "
              "(max |d| %g)\n", ref.size(), d1, m1);
}

}  // namespace
}  // namespace ds
