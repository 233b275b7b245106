// What the MTP tests on the CUDA device share (mtp_gpu_test.cc, fused_draft_chain_test.cc): tiny
// synthetic models with an MTP block, the backends the tests make of them, prompts, and the
// prefill that writes a prompt's MTP rows.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/util/status.h"
#include "tests/gpu_test_options.h"
#include "tests/model/test_util.h"
#include "tools/synth/synth.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_options.h"
#include "worker/model/backend.h"

namespace ds::mtp_test {

inline bool HaveGpu() {
  static const bool have = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return have;
}

struct Model {
  const char* name;
  GgmlType type;
  double bound;  // max |gpu - cpu| / max |cpu| for MtpStep outputs
};
inline void PrintTo(const Model& m, std::ostream* os) { *os << m.name; }

constexpr int kSlotCtx = 256;
constexpr int kPrompt = 40;

inline std::shared_ptr<const gguf::File> Synth(const Model& m) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("ds_mtp_gpu_" + std::to_string(getpid()) + "_" + m.name + ".gguf"))
                               .string();
  SynthOptions o = SynthOptions::Tiny();
  o.weight_type = m.type;
  o.seed = 5;
  absl::Status s = SynthesizeGguf(o, path);
  EXPECT_TRUE(s.ok()) << s;
  auto f = gguf::File::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  std::filesystem::remove(path);  // the mapping stays valid
  return f.ok() ? std::shared_ptr<const gguf::File>(std::move(*f)) : nullptr;
}

inline BackendOptions Opts() {
  BackendOptions o;
  o.n_slots = 2;
  o.slot_ctx = kSlotCtx;
  return ds::testing::GpuTestOptions(o);  // --portable: the sm_70 kernel path
}

inline std::unique_ptr<Backend> Cuda(std::shared_ptr<const gguf::File> f, int max_step_tokens = 0) {
  CudaBackendOptions c;
  c.spec_tokens = 4;
  c.spec_seqs = 2;
  if (max_step_tokens > 0) c.max_step_tokens = max_step_tokens;
  auto b = CreateCudaBackend(std::move(f), Opts(), c);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

inline std::vector<int32_t> Prompt(int n, int V) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(((i * 37) % 500 + 3) % V);
  return t;
}

using ds::testing::RelDiff;  // tests/model/test_util.h

inline int32_t Argmax(const float* l, int V) { return static_cast<int32_t>(std::max_element(l, l + V) - l); }

// Prefills `toks` into `slot` and writes its MTP rows (the token after the last is 3), as the
// draft-chain tests start from.
inline absl::Status PrefillWithMtpRows(Backend& b, int slot, const std::vector<int32_t>& toks) {
  b.ResetSlot(slot);
  SeqStep s;
  s.slot = slot;
  s.tokens = toks;
  s.all_logits = true;
  StepOptions o;
  o.want_hidden = true;
  StepOutput out;
  DS_RETURN_IF_ERROR(b.Forward({&s, 1}, o, &out));
  std::vector<float> l, h;
  std::vector<int32_t> next(toks.begin() + 1, toks.end());
  next.push_back(3);
  return b.MtpRows(slot, 0, next, out.hidden, &l, &h);
}

}  // namespace ds::mtp_test
