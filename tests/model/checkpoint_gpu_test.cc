// Prefix-cache checkpoints in device memory (issue #17; label `gpu`, not run in CI): a slot's
// state saved with Backend::SaveCheckpoint and loaded into another slot (whose pages held a
// longer, different sequence before) decodes the next token with logits bit-identical to the
// slot it was saved from and to a host snapshot restored the same way (Snapshot / Restore, the
// CPU-checked path); the checkpoint is a copy, unaffected by what the source slot does next.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "tests/gpu_test_options.h"
#include "tools/synth/synth.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/model/backend.h"

namespace ds {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<int32_t> Tokens(int n, int V, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(((i * 37 + salt * 11) % 500 + 3) % V);
  return t;
}

TEST(DeviceCheckpoint, LoadEqualsTheSourceAndAHostSnapshot) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("ds_ckpt_gpu_" + std::to_string(getpid()) + ".gguf"))
                               .string();
  SynthOptions so = SynthOptions::Tiny();
  so.weight_type = GgmlType::F32;
  so.seed = 9;
  ASSERT_TRUE(SynthesizeGguf(so, path).ok());
  auto f = gguf::File::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  std::filesystem::remove(path);
  BackendOptions o;
  o.n_slots = 3;
  o.slot_ctx = 256;
  CudaBackendOptions c;
  c.kv_page_size = 16;  // several pages, the last one partly used
  auto be_or = CreateCudaBackend(std::shared_ptr<const gguf::File>(std::move(*f)),
                                 testing::GpuTestOptions(o), testing::GpuTestOptions(c));
  ASSERT_TRUE(be_or.ok()) << be_or.status();
  Backend& be = **be_or;
  ASSERT_TRUE(be.SupportsDeviceCheckpoints());
  const int V = be.config().n_vocab;
  auto forward = [&](int slot, int32_t pos0, std::vector<int32_t> tokens) {
    SeqStep s;
    s.slot = slot;
    s.pos0 = pos0;
    s.tokens = std::move(tokens);
    StepOutput out;
    absl::Status st = be.Forward({&s, 1}, StepOptions{}, &out);
    EXPECT_TRUE(st.ok()) << st;
    return out.logits;
  };
  const std::vector<int32_t> prompt = Tokens(75, V, 1);
  // Slots 1 and 2 first hold longer, different sequences (their pages are rewritten by the load).
  forward(1, 0, Tokens(120, V, 2));
  forward(2, 0, Tokens(100, V, 3));
  forward(0, 0, prompt);
  auto snap = be.Snapshot(0);
  ASSERT_TRUE(snap.ok()) << snap.status();
  auto ckpt = be.SaveCheckpoint(0);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const int32_t next = 17;
  const std::vector<float> ref = forward(0, 75, {next});
  forward(0, 76, {5, 6, 7});  // the source goes on: the checkpoint must not follow it
  ASSERT_TRUE(be.LoadCheckpoint(1, **ckpt).ok());
  EXPECT_EQ(be.SlotLength(1), 75);
  const std::vector<float> from_ckpt = forward(1, 75, {next});
  ASSERT_TRUE(be.Restore(2, *snap).ok());
  const std::vector<float> from_snap = forward(2, 75, {next});
  ASSERT_EQ(from_ckpt.size(), ref.size());
  ASSERT_EQ(from_snap.size(), ref.size());
  EXPECT_EQ(std::memcmp(from_ckpt.data(), ref.data(), ref.size() * sizeof(float)), 0)
      << "device checkpoint differs from the slot it was saved from";
  EXPECT_EQ(std::memcmp(from_snap.data(), ref.data(), ref.size() * sizeof(float)), 0)
      << "host snapshot differs from the slot it was saved from";
  // A second load of the same checkpoint gives the same again (it was not consumed).
  ASSERT_TRUE(be.LoadCheckpoint(2, **ckpt).ok());
  EXPECT_EQ(forward(2, 75, {next}), ref);
}

}  // namespace
}  // namespace ds
