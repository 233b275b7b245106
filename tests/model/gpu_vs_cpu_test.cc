// Whole-model GPU check (label `gpu`, not run in CI; on a device: tools/device/check_gpu_vs_cpu.sh):
// the CUDA backend against the CPU reference backend on the HF reference model
// (tests/reference/data/tiny_ref.gguf) and on synthetic models of every weight type both
// backends compute with, written here through the synth library.
//
// One schedule on both backends: step 0 is a mixed batch (slot 0: a 100-token prompt with
// all_logits, crossing 64-token KV pages and taking the cuBLAS prefill path; slot 1: a 23-token
// prompt, last row only), then 16 decode steps, both slots for the first 8 (2 rows) and slot 0
// alone after (1 row), so that the CUDA decode graphs of two batch sizes are captured and
// replayed. The CPU picks the greedy tokens; the GPU is fed the same tokens (teacher forcing), so
// every step compares logits of identical inputs. Asserted per model:
//   * max |gpu - cpu| / max |cpu| over each step's logits <= the type's bound (kCases; one for
//     the prefill step, one for the decode steps);
//   * two CPU backends give bit-identical logits (and tokens);
//   * two loads of the CUDA backend give bit-identical logits.
// Measured values are printed (one line per model) and recorded as test properties
// (step_NN_rel, max_rel, greedy_agree) so that the bounds can be set from a device run.
//
// Plus the GDN state in bf16 (GpuGdnStateBf16): the same schedule with BackendOptions::
// gdn_state_bf16 on both sides (CUDA: bf16 storage; CPU: its emulation), within the type's
// bounds.
//
// Plus the tiled Q6_K check: a 4-layer model of the 27B width (K % 256 == 0, so the repacked
// 16-row tile layout is used) prefilled on the CUDA backend with the tiled and with the raw
// layout: both dequantize to the same bf16 values for cuBLAS, so the logits agree to 1e-5.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/ggml_types.h"
#include "kernels/cuda/gemv_tiled.cuh"
#include "kernels/cuda/tiled_f16.cuh"
#include "tests/gpu_test_options.h"
#include "tests/model/test_util.h"
#include "tests/model/widened_tiny.h"
#include "tools/synth/synth.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/model/backend.h"

namespace ds {
namespace {

enum class Shape {
  kReference,  // tests/reference/data/tiny_ref.gguf (HF Qwen3_5ForCausalLM, Q8_0 weights)
  kTiny,       // SynthOptions::Tiny(): `gguf-synth --preset tiny` (hidden 128, dk = dv = 16)
  kWide,       // Tiny() widened so that every matrix row is a multiple of 256 (below)
};

struct Case {
  const char* name;       // test name suffix
  Shape shape;
  GgmlType type;          // weight type of the synthetic model (kReference: unused)
  double prefill_bound;   // max |gpu - cpu| / max |cpu| over step 0 (101 rows)
  double decode_bound;    // the same over each decode step (1-2 rows)
};

// Bounds, to be tightened from device measurements (each run prints the per-step values).
// F32: fp32 cuBLAS for prefill rows, fp32 GEMV for decode rows. The other types need more room:
// the CUDA path quantizes activations to int8 (GEMV) or uses bf16 GEMM operands (prefill), keeps
// an f16 KV cache, and random-weight models have near-tied logits.
// First device run (H200, 2026-12-01; max over the prefill step / over the 16 decode steps):
//   ref 1.4e-2 / 3.8e-2; F32 1.2e-4 / 4.0e-5 (tiny 1.1e-4 / 3.9e-5);
//   tiny F16 0.17 / 0.036, Q8_0 0.16 / 0.051, Q6_K 0.10 / 0.062;
//   F16 0.083 / 0.032, BF16 0.10 / 0.036, Q8_0 0.37 / 0.18, Q6_K 0.18 / 0.13, Q5_K 0.13 / 0.15,
//   Q4_K 0.11 / 0.21, IQ4_NL 0.061 / 0.12, IQ4_XS 0.46 / 0.13.
// The large prefill values (Q8_0, IQ4_XS) are single rows: per-row values are ~0.02-0.05 except
// one or two rows of the 101 at 0.3-0.7 (of that row's largest logit), with the following rows
// back at ~0.02. To be explained before the prefill bound is tightened.
//
// Weight types not here: Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K are not computable weight types
// (GgmlInfo::supported is false: no CPU dequant / dot, GemvSupported is false on CUDA, and
// the synth refuses them; Q4_0 / Q8_0 are only KV cache element types there, --kv-type).
//
// The tiny preset rows are 128 wide (n_embd) and 96 / 128 (ssm_out / attn_output inputs): a 256-
// block type (K-quants, IQ4_XS) only reaches ffn_down there and the synth falls back to Q8_0 for
// the rest. kWide models give every type every matrix; kTiny keeps the shapes of the script this
// test replaces (dk = dv = 16, head_dim 32) for the types it measured.
constexpr double kQuantPrefill = 0.6, kQuantDecode = 0.3;
constexpr Case kCases[] = {
    {"ref", Shape::kReference, GgmlType::Q8_0, kQuantPrefill, kQuantDecode},
    {"tiny_F32", Shape::kTiny, GgmlType::F32, 2e-3, 2e-3},
    {"tiny_F16", Shape::kTiny, GgmlType::F16, kQuantPrefill, kQuantDecode},
    {"tiny_Q8_0", Shape::kTiny, GgmlType::Q8_0, kQuantPrefill, kQuantDecode},
    {"tiny_Q6_K", Shape::kTiny, GgmlType::Q6_K, kQuantPrefill, kQuantDecode},
    {"F32", Shape::kWide, GgmlType::F32, 2e-3, 2e-3},
    {"F16", Shape::kWide, GgmlType::F16, kQuantPrefill, kQuantDecode},
    {"BF16", Shape::kWide, GgmlType::BF16, kQuantPrefill, kQuantDecode},
    {"Q8_0", Shape::kWide, GgmlType::Q8_0, kQuantPrefill, kQuantDecode},
    {"Q6_K", Shape::kWide, GgmlType::Q6_K, kQuantPrefill, kQuantDecode},
    {"Q5_K", Shape::kWide, GgmlType::Q5_K, kQuantPrefill, kQuantDecode},
    {"Q4_K", Shape::kWide, GgmlType::Q4_K, kQuantPrefill, kQuantDecode},
    {"IQ4_NL", Shape::kWide, GgmlType::IQ4_NL, kQuantPrefill, kQuantDecode},
    {"IQ4_XS", Shape::kWide, GgmlType::IQ4_XS, kQuantPrefill, kQuantDecode},
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

constexpr int kPromptLen = 100;   // slot 0, all_logits
constexpr int kPrompt2Len = 23;   // slot 1, in the same step
constexpr int kDecodeSteps = 16;  // after the prefill step
constexpr int kSlot1Steps = 8;    // decode steps slot 1 takes part in
constexpr int kSlotCtx = 256;

bool HaveGpu() {
  static const bool have = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return have;
}

// Scratch directory for the synthesized models (each test removes its file; the directory goes
// when the program ends).
std::string ScratchDir() {
  static const std::string dir = (std::filesystem::temp_directory_path() /
                                  ("ds_gpu_vs_cpu_" + std::to_string(getpid())))
                                     .string();
  std::filesystem::create_directories(dir);
  return dir;
}
class RemoveScratchDir : public ::testing::Environment {
 public:
  void TearDown() override { std::filesystem::remove_all(ScratchDir()); }
};
[[maybe_unused]] ::testing::Environment* const kRemoveScratchDir =
    ::testing::AddGlobalTestEnvironment(new RemoveScratchDir);

// The HF reference model: $DS_TINY_REF_GGUF, else relative to the working directory (the
// repository root on the device), else the source tree this was built from.
std::optional<std::string> ReferenceModel() {
  std::vector<std::string> candidates;
  if (const char* e = std::getenv("DS_TINY_REF_GGUF")) candidates.push_back(e);
  candidates.push_back("tests/reference/data/tiny_ref.gguf");
  candidates.push_back(DS_TINY_REF_GGUF);
  for (const std::string& p : candidates)
    if (std::filesystem::exists(p)) return p;
  return std::nullopt;
}

SynthOptions ModelOptions(const Case& c) {
  SynthOptions o = SynthOptions::Tiny();
  if (c.shape == Shape::kWide) WidenTiny(&o);  // tests/model/widened_tiny.h
  o.weight_type = c.type;
  o.seed = 3;
  return o;
}

// Every logit of one run, step by step, and the greedy tokens the run would feed next.
struct Trace {
  std::vector<std::vector<float>> logits;  // [step][n_rows * n_vocab]
  std::vector<int> rows;                   // [step] n_rows
  std::vector<std::vector<int32_t>> next;  // [step][active slots] argmax of each slot's last row
};

int32_t Argmax(const std::vector<float>& l, int row, int V) {
  const auto b = l.begin() + static_cast<ptrdiff_t>(row) * V;
  return static_cast<int32_t>(std::max_element(b, b + V) - b);
}

// Runs the schedule of the file comment on `be`. With `follow`, the decode tokens are follow's
// greedy tokens (teacher forcing), else this run's own.
Trace RunSchedule(Backend& be, const Trace* follow) {
  Trace t;
  const int V = be.config().n_vocab;
  SeqStep a, b;
  a.slot = 0;
  a.all_logits = true;
  for (int i = 0; i < kPromptLen; ++i) a.tokens.push_back(((i * 37) % 500 + 1) % V);
  b.slot = 1;
  for (int i = 0; i < kPrompt2Len; ++i) b.tokens.push_back(((i * 53) % 400 + 7) % V);
  std::vector<SeqStep> batch = {a, b};
  StepOutput out;
  for (int step = 0; step <= kDecodeSteps; ++step) {
    absl::Status st = be.Forward(batch, StepOptions{}, &out);
    EXPECT_TRUE(st.ok()) << be.name() << " step " << step << ": " << st;
    if (!st.ok()) return t;
    if (out.logits.size() != static_cast<size_t>(out.n_rows) * V) {
      ADD_FAILURE() << be.name() << " step " << step << ": " << out.logits.size()
                    << " logits for " << out.n_rows << " rows of " << V;
      return t;
    }
    t.logits.push_back(out.logits);
    t.rows.push_back(out.n_rows);
    std::vector<int32_t> next;
    int row = 0;
    for (const SeqStep& s : batch) {
      row += s.all_logits ? static_cast<int>(s.tokens.size()) : 1;
      next.push_back(Argmax(out.logits, row - 1, V));
    }
    t.next.push_back(next);
    if (follow) {
      if (step >= static_cast<int>(follow->next.size())) {
        ADD_FAILURE() << "followed trace has only " << follow->next.size() << " steps";
        return t;
      }
      next = follow->next[step];
    }
    // The next step: one token per slot; slot 1 leaves after kSlot1Steps decode steps.
    std::vector<SeqStep> nb;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].slot == 1 && step >= kSlot1Steps) continue;
      SeqStep s;
      s.slot = batch[i].slot;
      s.pos0 = batch[i].pos0 + static_cast<int32_t>(batch[i].tokens.size());
      s.tokens = {next[i]};
      nb.push_back(s);
    }
    batch = std::move(nb);
  }
  return t;
}

using ds::testing::RelDiff;  // tests/model/test_util.h

// The first step at which two traces differ in any bit, or -1.
int FirstDifferentStep(const Trace& x, const Trace& y) {
  const size_t n = std::max(x.logits.size(), y.logits.size());
  for (size_t s = 0; s < n; ++s) {
    if (s >= x.logits.size() || s >= y.logits.size()) return static_cast<int>(s);
    if (x.logits[s].size() != y.logits[s].size() ||
        std::memcmp(x.logits[s].data(), y.logits[s].data(), x.logits[s].size() * 4) != 0)
      return static_cast<int>(s);
  }
  return -1;
}

BackendOptions Options() {
  BackendOptions o;
  o.n_slots = 2;
  o.slot_ctx = kSlotCtx;
  return ds::testing::GpuTestOptions(o);  // --portable: the sm_70 kernel path
}

std::string Sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", v);
  return buf;
}

// The case's model file: the reference model, or a synthetic one written to
// ScratchDir()/<name><suffix>.gguf (the caller removes it).
absl::StatusOr<std::string> CaseModel(const Case& c, const std::string& suffix) {
  if (c.shape == Shape::kReference) {
    auto ref = ReferenceModel();
    if (!ref.has_value())
      return absl::NotFoundError(
          "tiny_ref.gguf not found: run from the repository root or set DS_TINY_REF_GGUF");
    return *ref;
  }
  const std::string path = absl::StrCat(ScratchDir(), "/", c.name, suffix, ".gguf");
  DS_RETURN_IF_ERROR(SynthesizeGguf(ModelOptions(c), path));
  return path;
}

class GpuVsCpu : public ::testing::TestWithParam<Case> {};

TEST_P(GpuVsCpu, LogitsWithinBoundAndDeterministic) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  auto model = CaseModel(c, "");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string path = *model;

  // CPU reference, twice (each run on its own backend).
  Trace cpu, cpu2;
  {
    auto be = CreateCpuBackend(path, Options());
    ASSERT_TRUE(be.ok()) << be.status();
    cpu = RunSchedule(**be, nullptr);
  }
  ASSERT_EQ(cpu.logits.size(), static_cast<size_t>(kDecodeSteps + 1));
  {
    auto be = CreateCpuBackend(path, Options());
    ASSERT_TRUE(be.ok()) << be.status();
    cpu2 = RunSchedule(**be, nullptr);
  }
  EXPECT_EQ(FirstDifferentStep(cpu2, cpu), -1) << "two CPU runs differ";
  EXPECT_EQ(cpu2.next, cpu.next) << "two CPU runs pick different greedy tokens";

  // CUDA, two loads, both fed the CPU's tokens.
  Trace gpu, gpu2;
  {
    auto be = CreateCudaBackend(path, Options());
    ASSERT_TRUE(be.ok()) << be.status();
    gpu = RunSchedule(**be, &cpu);
  }
  ASSERT_EQ(gpu.logits.size(), cpu.logits.size());
  {
    auto be = CreateCudaBackend(path, Options());
    ASSERT_TRUE(be.ok()) << be.status();
    gpu2 = RunSchedule(**be, &cpu);
  }
  EXPECT_EQ(FirstDifferentStep(gpu2, gpu), -1) << "two loads of the CUDA backend differ";

  // GPU vs CPU, step by step.
  double worst = 0;
  int agree = 0, total = 0;
  std::string line;
  for (size_t s = 0; s < cpu.logits.size(); ++s) {
    EXPECT_EQ(gpu.rows[s], cpu.rows[s]) << "step " << s;
    const double rel = RelDiff(gpu.logits[s], cpu.logits[s]);
    worst = std::max(worst, rel);
    char key[32];
    std::snprintf(key, sizeof key, "step_%02zu_rel", s);
    RecordProperty(key, Sci(rel));
    line += " " + Sci(rel);
    EXPECT_LE(rel, s == 0 ? c.prefill_bound : c.decode_bound)
        << c.name << " step " << s << (s == 0 ? " (prefill)" : " (decode)");
    for (size_t i = 0; i < cpu.next[s].size() && i < gpu.next[s].size(); ++i, ++total)
      agree += gpu.next[s][i] == cpu.next[s][i];
  }
  RecordProperty("max_rel", Sci(worst));
  RecordProperty("prefill_bound", Sci(c.prefill_bound));
  RecordProperty("decode_bound", Sci(c.decode_bound));
  RecordProperty("greedy_agree", std::to_string(agree) + "/" + std::to_string(total));
  std::printf("gpu_vs_cpu %-10s bounds %.1e / %.1e max %.3e  greedy argmax agree %d/%d  per "
              "step (0 = prefill):%s\n",
              c.name, c.prefill_bound, c.decode_bound, worst, agree, total, line.c_str());
  std::fflush(stdout);
  if (c.shape != Shape::kReference) std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuVsCpu, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.name);
                         });

// The GDN recurrent state stored in bf16 (BackendOptions::gdn_state_bf16 -> CudaBackendOptions::
// gdn_state_bf16, issue #22) against the CPU's emulation of it (the state rounded to bf16 after
// every decode token and at the end of every prefill piece, as the kernels round), on the
// reference model and the two F32 models. Both sides round f32 states that agree to the f32
// tests' precision, so their states differ only where a value straddles a rounding midpoint (one
// bf16 ulp of that element, tests/kernels/cuda/gdn_cuda_test.cc Gdn.Bf16State); those flips
// are carried from step to step, so the F32 models' logits are held to kBf16StateBound, not to
// the f32 state's 2e-3 (measured on the H200, 2026-12-03: 7.0e-3 and 1.12e-2 at most), and
// must be closer to the CPU emulation than the f32-state GPU run is (2.5e-2 and 1.6e-2: a GPU
// that did not round, or rounded elsewhere, fails that). The Q8_0 reference model keeps its
// bounds (its quantization noise dominates both distances). The option must take effect: the
// CUDA logits differ from the f32 state's, and the memory plan's recurrent bytes shrink.
constexpr double kBf16StateBound = 2e-2;
TEST(GpuGdnStateBf16, LogitsWithinBoundOfTheCpuEmulation) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (const Case& c : kCases) {
    const std::string name = c.name;
    if (name != "ref" && name != "tiny_F32" && name != "F32") continue;
    SCOPED_TRACE(name);
    auto model = CaseModel(c, "_gdn_bf16");
    ASSERT_TRUE(model.ok()) << model.status();
    const std::string path = *model;
    BackendOptions bo = Options();
    bo.gdn_state_bf16 = true;
    Trace cpu, gpu, gpu_f32;
    {
      auto be = CreateCpuBackend(path, bo);
      ASSERT_TRUE(be.ok()) << be.status();
      cpu = RunSchedule(**be, nullptr);
    }
    ASSERT_EQ(cpu.logits.size(), static_cast<size_t>(kDecodeSteps + 1));
    uint64_t rec_bf16 = 0, rec_f32 = 0;
    {
      auto be = cuda::CreateCudaBackendApi(path, bo, CudaBackendOptions{});
      ASSERT_TRUE(be.ok()) << be.status();
      rec_bf16 = (*be)->memory_plan().recurrent;
      gpu = RunSchedule(**be, &cpu);
    }
    {
      auto be = cuda::CreateCudaBackendApi(path, Options(), CudaBackendOptions{});
      ASSERT_TRUE(be.ok()) << be.status();
      rec_f32 = (*be)->memory_plan().recurrent;
      gpu_f32 = RunSchedule(**be, &cpu);
    }
    EXPECT_LT(rec_bf16, rec_f32);
    EXPECT_NE(FirstDifferentStep(gpu, gpu_f32), -1) << "the bf16 state changed no logit";
    ASSERT_EQ(gpu.logits.size(), cpu.logits.size());
    double worst = 0, worst_f32 = 0;
    std::string line;
    for (size_t s = 0; s < cpu.logits.size(); ++s) {
      const double rel = RelDiff(gpu.logits[s], cpu.logits[s]);
      worst = std::max(worst, rel);
      worst_f32 = std::max(worst_f32, RelDiff(gpu_f32.logits[s], cpu.logits[s]));
      line += " " + Sci(rel);
      const double bound = c.type == GgmlType::F32 ? kBf16StateBound
                           : s == 0                 ? c.prefill_bound
                                                    : c.decode_bound;
      EXPECT_LE(rel, bound) << name << " step " << s << (s == 0 ? " (prefill)" : " (decode)");
    }
    if (c.type == GgmlType::F32) {
      EXPECT_LT(worst, worst_f32) << name << ": the bf16-state GPU run is no closer to the CPU's "
                                             "bf16 emulation than the f32-state run";
    }
    // For the record: the f32-state GPU run against the bf16 CPU emulation (how far the
    // rounding itself moves the logits).
    std::printf(
        "gpu_vs_cpu gdn-state bf16 %-9s max %.3e (f32-state GPU vs it: %.3e) recurrent "
        "%.2f -> %.2f MiB  per step:%s\n",
        name.c_str(), worst, worst_f32, rec_f32 / 1048576.0, rec_bf16 / 1048576.0, line.c_str());
    std::fflush(stdout);
    if (c.shape != Shape::kReference) std::filesystem::remove(path);
  }
}

// Tiled Q4_K / Q5_K / Q8_0 / IQ4_XS / IQ4_NL (CudaBackendOptions::tiled_f16_formats, issue #22):
// the schedule above
// on those models with their matrices tiled at upload, every column product (1-2 decode rows, the
// 23-token prompt) on the f16 tensor-core kernel and the 100-token prefill dequantized from the
// tiles: within the type's bounds of the CPU, the same logits on two loads, and not the raw
// layout's logits bit for bit (the tiled kernels did run); the raw layout (the v2 GEMV,
// tiled_f16_formats off) within the same bounds. Where the wgmma form runs (sm_90a), the mma.sync
// form (f16_wgmma off) gives the same logits bit for bit, through the whole model.
TEST(GpuTiledF16Formats, LogitsWithinBoundAndDeterministic) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  if (ds::testing::ForcePortable()) GTEST_SKIP() << "the portable (sm_70) path has no tiled layout";
  for (const Case& c : kCases) {
    if (c.shape != Shape::kWide ||
        (c.type == GgmlType::Q6_K || !cuda::TiledSupported(c.type)))
      continue;
    SCOPED_TRACE(c.name);
    auto model = CaseModel(c, "_tiled");
    ASSERT_TRUE(model.ok()) << model.status();
    const std::string path = *model;
    Trace cpu, tiled, tiled2, raw;
    {
      auto be = CreateCpuBackend(path, Options());
      ASSERT_TRUE(be.ok()) << be.status();
      cpu = RunSchedule(**be, nullptr);
    }
    CudaBackendOptions co;
    co.tiled_f16_formats = true;
    for (Trace* t : {&tiled, &tiled2}) {
      auto be = cuda::CreateCudaBackendApi(path, Options(), co);
      ASSERT_TRUE(be.ok()) << be.status();
      *t = RunSchedule(**be, &cpu);
    }
    {
      CudaBackendOptions raw_co;
      raw_co.tiled_f16_formats = false;
      auto be = cuda::CreateCudaBackendApi(path, Options(), raw_co);
      ASSERT_TRUE(be.ok()) << be.status();
      raw = RunSchedule(**be, &cpu);
    }
    EXPECT_EQ(FirstDifferentStep(tiled2, tiled), -1) << "two loads differ";
    EXPECT_NE(FirstDifferentStep(tiled, raw), -1) << "tiled_f16_formats changed no logit";
    if (cuda::TiledF16WgmmaAvailable()) {
      CudaBackendOptions sync_co;
      sync_co.tiled_f16_formats = true;
      sync_co.f16_wgmma = false;
      auto be = cuda::CreateCudaBackendApi(path, Options(), sync_co);
      ASSERT_TRUE(be.ok()) << be.status();
      const Trace sync = RunSchedule(**be, &cpu);
      EXPECT_EQ(FirstDifferentStep(sync, tiled), -1) << "the wgmma and mma.sync forms differ";
    }
    ASSERT_EQ(tiled.logits.size(), cpu.logits.size());
    double worst = 0, worst_raw = 0;
    std::string line;
    for (size_t s = 0; s < cpu.logits.size(); ++s) {
      const double rel = RelDiff(tiled.logits[s], cpu.logits[s]);
      worst = std::max(worst, rel);
      const double rel_raw = RelDiff(raw.logits[s], cpu.logits[s]);
      worst_raw = std::max(worst_raw, rel_raw);
      line += " " + Sci(rel);
      EXPECT_LE(rel, s == 0 ? c.prefill_bound : c.decode_bound) << "step " << s;
      // The raw layout (--tiled-f16-formats off) keeps its bounds too: since the tiles are the
      // default, this is the only whole-model check of the v2 GEMV on these formats.
      EXPECT_LE(rel_raw, s == 0 ? c.prefill_bound : c.decode_bound) << "raw layout, step " << s;
    }
    std::printf("gpu_tiled_kquant %-5s max %.3e (raw layout: %.3e) per step:%s\n", c.name, worst,
                worst_raw, line.c_str());
    std::fflush(stdout);
    std::filesystem::remove(path);
  }
}

// The tiled Q6_K layout (matrices repacked into 16-row int8 mma tiles at upload) against the raw
// GGUF layout, prefill only: > 32 rows go through dequantization to bf16 + cuBLAS on both, the
// same bf16 values, so the logits agree to 1e-5. Decode is not compared here: the int8 activation
// quantization turns float-order differences into rounding flips that reach 1e-2 of the logits
// (tools/device/tiled_decode_check.sh compares decode against the CPU). The model has the 27B
// widths (n_embd 5120, n_ff 17408, K % 256 == 0) but 4 layers (3 GDN + 1 attention), no MTP and
// a 32768-token vocabulary instead of 248320: ~1.5 GB instead of ~3.6 GB, the LM head still tiled.
// The 27B-width Q6_K model of the tests below, written to ScratchDir()/name.
std::string Synth27BWidth(const std::string& name, uint64_t seed) {
  SynthOptions o = SynthOptions::Qwen27B();
  o.n_layer = 4;
  o.with_mtp = false;
  o.n_vocab = 32768;
  o.weight_type = GgmlType::Q6_K;
  o.quant_mode = SynthQuantMode::kRandomBlocks;
  o.seed = seed;
  const std::string path = ScratchDir() + "/" + name;
  absl::Status s = SynthesizeGguf(o, path);
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? path : "";
}

TEST(GpuTiledQ6K, PrefillTiledMatchesRawLayout) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  if (ds::testing::ForcePortable()) GTEST_SKIP() << "the portable (sm_70) path has no tiled layout";
  const std::string path = Synth27BWidth("q6k_27b_width_4l.gguf", 3);
  ASSERT_FALSE(path.empty());

  BackendOptions bo;
  bo.n_slots = 1;
  bo.slot_ctx = 128;
  SeqStep a;
  a.all_logits = true;
  for (int i = 0; i < kPromptLen; ++i) a.tokens.push_back((i * 37) % 500 + 1);
  auto prefill = [&](bool tiled_layout, std::vector<float>* logits) {
    CudaBackendOptions co;
    co.tiled = tiled_layout;
    auto be = cuda::CreateCudaBackendApi(path, bo, co);
    ASSERT_TRUE(be.ok()) << be.status();
    StepOutput out;
    absl::Status st = (*be)->Forward({&a, 1}, StepOptions{}, &out);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(out.n_rows, kPromptLen);
    *logits = std::move(out.logits);
  };
  std::vector<float> tiled, raw;
  prefill(true, &tiled);
  prefill(false, &raw);
  std::filesystem::remove(path);
  ASSERT_FALSE(tiled.empty());
  const double rel = RelDiff(tiled, raw);
  RecordProperty("tiled_vs_raw_rel", Sci(rel));
  std::printf("gpu_tiled_q6k 27b-width x4 layers, tiled vs raw layout, prefill %d rows: max rel "
              "diff %.3e (bound 1e-5)\n",
              kPromptLen, rel);
  std::fflush(stdout);
  EXPECT_LT(rel, 1e-5);
}

// The dense-weights cases below: on a 27B-width file of 4 layers, a prefill of `prefill_len`
// tokens in slot 0 (all logits) and then one decode step of 40 one-token sequences in slots
// 1..40, with the CUDA options given; their logits and the backend's memory plan.
struct DenseCase {
  std::vector<float> prefill, decode;
  CudaMemoryPlan plan;
};
void RunDenseCase(const std::string& path, int prefill_len, const CudaBackendOptions& co,
                  DenseCase* out) {
  BackendOptions bo;
  bo.n_slots = 41;
  bo.slot_ctx = 256;
  std::vector<SeqStep> decode(40);
  for (int i = 0; i < 40; ++i) {
    decode[i].slot = i + 1;
    decode[i].tokens = {(i * 53) % 900 + 2};
  }
  SeqStep prefill;
  prefill.all_logits = true;
  for (int i = 0; i < prefill_len; ++i) prefill.tokens.push_back((i * 37) % 500 + 1);
  auto be = cuda::CreateCudaBackendApi(path, bo, co);
  ASSERT_TRUE(be.ok()) << be.status();
  out->plan = (*be)->memory_plan();
  StepOutput step;
  absl::Status st = (*be)->Forward({&prefill, 1}, StepOptions{}, &step);
  ASSERT_TRUE(st.ok()) << st;
  out->prefill = std::move(step.logits);
  st = (*be)->Forward(decode, StepOptions{}, &step);
  ASSERT_TRUE(st.ok()) << st;
  out->decode = std::move(step.logits);
  ASSERT_FALSE(out->prefill.empty());
  ASSERT_FALSE(out->decode.empty());
}

// Dense weights (CudaBackendOptions::dense_weights, issue #22): the GEMM path multiplies the
// 16-bit copies made at load instead of dequantizing per step, the same bf16 values and the same
// cuBLAS product. On the 27B-width model above: a prefill of 64 tokens and a step of 40 one-token
// sequences (batched decode past 32 rows) against the same steps with dequantization (MMQ and
// the f16 kernel off, so that those 40 decode rows take the GEMM as well): logits within 1e-6
// (the same numbers).
TEST(GpuDenseWeights, GemmStepsMatchDequantization) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  if (ds::testing::ForcePortable()) GTEST_SKIP() << "the portable path is covered by the bf16 one";
  const std::string path = Synth27BWidth("q6k_27b_width_4l_dense.gguf", 4);
  ASSERT_FALSE(path.empty());
  DenseCase dense, plain;
  CudaBackendOptions co;
  co.dense_weights = DenseWeights::kOn;
  RunDenseCase(path, 64, co, &dense);
  co.dense_weights = DenseWeights::kOff;
  co.int8_mmq = false;  // the 40 decode rows take dequantization + cuBLAS too
  co.f16_mma = false;
  RunDenseCase(path, 64, co, &plain);
  std::filesystem::remove(path);
  ASSERT_FALSE(HasFatalFailure());
  const double rp = RelDiff(dense.prefill, plain.prefill), rd = RelDiff(dense.decode, plain.decode);
  std::printf("gpu_dense_weights 27b-width x4 layers: prefill 64 rows max rel %.3e, decode 40 "
              "sequences %.3e (bound 1e-6)\n",
              rp, rd);
  std::fflush(stdout);
  EXPECT_LT(rp, 1e-6);
  EXPECT_LT(rd, 1e-6);
}

// Dense weights on `auto` (the default; worker/model/dense_weights.h): on a card with room the
// copies are made (the plan says so), and they change no number: a prefill of 100 tokens (past
// the column kernels' 64 rows: the GEMM path, copies against per-step dequantization) and a
// decode step of 40 sequences (the f16 kernel either way) give the logits of `off` bit for bit.
TEST(GpuDenseWeights, AutoMakesCopiesAndChangesNoLogits) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  if (ds::testing::ForcePortable()) GTEST_SKIP() << "the portable path is covered by the bf16 one";
  const std::string path = Synth27BWidth("q6k_27b_width_4l_dense_auto.gguf", 4);
  ASSERT_FALSE(path.empty());
  DenseCase aut, off;
  CudaBackendOptions co;
  co.dense_weights = DenseWeights::kAuto;
  RunDenseCase(path, 100, co, &aut);
  co.dense_weights = DenseWeights::kOff;
  RunDenseCase(path, 100, co, &off);
  std::filesystem::remove(path);
  ASSERT_FALSE(HasFatalFailure());
  std::printf("gpu_dense_weights auto: %s\n", aut.plan.ToString().c_str());
  std::fflush(stdout);
  EXPECT_GT(aut.plan.dense_copies, 0u) << aut.plan.dense_choice;
  EXPECT_EQ(aut.plan.weights, off.plan.weights + aut.plan.dense_copies);
  EXPECT_EQ(aut.plan.plan.pool_pages, off.plan.plan.pool_pages);
  EXPECT_EQ(off.plan.dense_copies, 0u);
  EXPECT_EQ(RelDiff(aut.prefill, off.prefill), 0.0);
  EXPECT_EQ(RelDiff(aut.decode, off.decode), 0.0);
}

// FP8 prefill (CudaBackendOptions::prefill_fp8, issue #22; Hopper with cuBLAS 12.9+, else the
// option is dropped and the test skips): the dense copies in e4m3 and the prefill GEMMs on FP8
// tensor cores. On the 27B-width model, dense copies on `auto` (made: the model is small): a
// prefill of 101 tokens (25 groups of 4 and a 1-token tail) stays near the bf16 path's logits
// and repeats bit for bit. The decode step of 40 other sequences after it: with fp8_decode_rows 0
// the column kernels' logits bit for bit; with 16 the FP8 product (40 >= 16 decode rows), near
// the column kernels' and bit for bit the same in a second run. "Near": e4m3 keeps 3 significant
// bits of every weight and activation and the random weights of five layers carry the error to
// the logits (H100, 2026-12-06: 0.295 prefill, 0.367 decode as max |d| / max |ref|), so the bound
// is the one of the other random quantized models here (0.6; the per-product error is checked
// tightly by gemm_fp8_cuda_test, the model-level one on real text by the demo's perplexity), and
// a decode row's error is of a prefill row's size (each row is quantized on its own).
TEST(GpuFp8Prefill, NearTheBf16PathDeterministicDecodeRowsByOption) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  if (ds::testing::ForcePortable()) GTEST_SKIP() << "the portable path has no FP8";
  const std::string path = Synth27BWidth("q6k_27b_width_4l_fp8.gguf", 5);
  ASSERT_FALSE(path.empty());
  DenseCase fp8, fp8_again, bf16, fp8_dec, fp8_dec_again;
  CudaBackendOptions co;
  co.dense_weights = DenseWeights::kAuto;
  RunDenseCase(path, 101, co, &bf16);
  co.prefill_fp8 = true;
  co.fp8_decode_rows = 0;
  RunDenseCase(path, 101, co, &fp8);
  RunDenseCase(path, 101, co, &fp8_again);
  co.fp8_decode_rows = 16;
  RunDenseCase(path, 101, co, &fp8_dec);
  RunDenseCase(path, 101, co, &fp8_dec_again);
  std::filesystem::remove(path);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_GT(bf16.plan.dense_copies, 0u) << bf16.plan.dense_choice;
  if (fp8.plan.dense_copies * 10 > bf16.plan.dense_copies * 6)
    GTEST_SKIP() << "no FP8 copies on this device (see the worker's note on stderr)";
  const double rp = RelDiff(fp8.prefill, bf16.prefill);
  const double rd = RelDiff(fp8_dec.decode, bf16.decode);
  RecordProperty("fp8_vs_bf16_prefill_rel", Sci(rp));
  RecordProperty("fp8_vs_columns_decode40_rel", Sci(rd));
  std::printf("gpu_fp8_prefill 27b-width x4 layers: prefill 101 rows max rel %.3e against bf16, "
              "decode 40 rows %.3e against the column kernels (bound 0.6), copies %.2f GiB vs "
              "%.2f\n",
              rp, rd, fp8.plan.dense_copies / double(1ull << 30),
              bf16.plan.dense_copies / double(1ull << 30));
  std::fflush(stdout);
  EXPECT_LT(rp, 0.6);
  EXPECT_GT(rp, 1e-6);  // the FP8 products did run
  EXPECT_EQ(RelDiff(fp8.prefill, fp8_again.prefill), 0.0);
  EXPECT_EQ(RelDiff(fp8.decode, bf16.decode), 0.0);  // fp8_decode_rows 0: the column kernels
  EXPECT_EQ(RelDiff(fp8_dec.prefill, fp8.prefill), 0.0);
  EXPECT_LT(rd, 0.6);
  EXPECT_LT(rd, 2 * rp);
  EXPECT_GT(rd, 1e-6);  // the 40 decode rows took the FP8 product
  EXPECT_EQ(RelDiff(fp8_dec.decode, fp8_dec_again.decode), 0.0);
}

// Early launch of the decode kernels (CudaBackendOptions::early_launch, sm_90+): the column
// kernel, the norm + quantizer, the quantizer and the GDN decode kernel start while the kernel
// before them runs and wait for it before touching activations. Decode steps (one sequence, four,
// then twelve: the 1- and 4-column forms of the int8 kernels and the f16 kernel's 12 columns with
// its norm, eager and replayed from their graphs) give the logits of plain launches bit for bit.
TEST(GpuEarlyLaunch, DecodeLogitsEqualPlainLaunches) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  if (ds::testing::ForcePortable()) GTEST_SKIP() << "the portable path has no tiled kernel";
  const std::string path = Synth27BWidth("q6k_27b_width_4l_early.gguf", 4);
  ASSERT_FALSE(path.empty());
  BackendOptions bo;
  bo.n_slots = 13;
  bo.slot_ctx = 128;
  auto run = [&](bool early, std::vector<std::vector<float>>* steps) {
    CudaBackendOptions co;
    co.early_launch = early;
    auto be = cuda::CreateCudaBackendApi(path, bo, co);
    ASSERT_TRUE(be.ok()) << be.status();
    int32_t len[13] = {};
    for (int s = 0; s < 13; ++s) {
      SeqStep p;
      p.slot = s;
      for (int i = 0; i < 12 + s; ++i) p.tokens.push_back((i * 37 + s * 11) % 500 + 1);
      len[s] = static_cast<int32_t>(p.tokens.size());
      StepOutput out;
      absl::Status st = (*be)->Forward({&p, 1}, StepOptions{}, &out);
      ASSERT_TRUE(st.ok()) << st;
    }
    for (int it = 0; it < 9; ++it) {
      // Steps 0-2: one sequence; 3-5: four at once; 6-8: twelve (the f16 kernel from 9 rows).
      // Later repetitions replay captured graphs.
      const int n = it < 3 ? 1 : it < 6 ? 4 : 12;
      std::vector<SeqStep> dec(n);
      for (int i = 0; i < n; ++i) {
        dec[i].slot = i;
        dec[i].pos0 = len[i]++;
        dec[i].tokens = {(it * 53 + i * 7) % 900 + 2};
      }
      StepOutput out;
      absl::Status st = (*be)->Forward(dec, StepOptions{}, &out);
      ASSERT_TRUE(st.ok()) << st;
      steps->push_back(std::move(out.logits));
    }
  };
  std::vector<std::vector<float>> early, plain;
  run(true, &early);
  run(false, &plain);
  std::filesystem::remove(path);
  ASSERT_EQ(early.size(), plain.size());
  for (size_t i = 0; i < early.size(); ++i) {
    ASSERT_FALSE(early[i].empty());
    EXPECT_EQ(RelDiff(early[i], plain[i]), 0.0) << "decode step " << i;
  }
}

}  // namespace
}  // namespace ds
