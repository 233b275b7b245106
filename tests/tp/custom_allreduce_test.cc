// The custom (CUDA IPC) all-reduce on ONE GPU, between real processes (IPC handles are only
// valid across processes; NCCL refuses two ranks on one device). Label `gpu`.
//
//   * CustomAllReduce.{Two,Three,Four}Ranks: the binary re-runs itself as W rank processes on GPU
//     0, met through a Gloo FileStore. Each rank checks, for messages from one 5,120-float decode
//     row to a 2,048-row prefill step (several buffer-sized chunks), unaligned and odd sizes,
//     one-shot / two-shot / automatic: its result equals CarReferenceSum of every rank's input
//     (regenerated locally) BIT FOR BIT — eager, and replayed from a captured CUDA graph with new
//     inputs — and AllGatherV with uneven counts (larger than the buffer too) equals the
//     concatenation.
//   * CustomTp.*: ds_tp_rank --backend cuda --collective custom groups (TP = 2, 3) against CUDA
//     TP = 1 on the TP test shape: F32 logits within 1e-4 of max |logit| and greedy tokens equal
//     (docs/tp.md §9), decode graphs on (the collective is graph-capturable); Q8_0 within 5e-2;
//     the same with the all-reduces of a long prefill step overlapped with the GEMMs (--overlap);
//     Q4_K / IQ4_NL on a 256-wide shape whose slices mix the tiled and the raw layout.
#include <cuda_runtime.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/collective/custom_allreduce.h"
#include "common/collective/gloo_collective.h"
#include "common/collective/host_staged_collective.h"
#include "gtest/gtest.h"
#include "tests/tp/rank_processes.h"
#include "nlohmann/json.hpp"

namespace ds {
namespace {

std::string Dir() {
  static const std::string d = tp_test::ScratchDir("ds_car_");
  return d;
}
using tp_test::RunAll;

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Rank q's input element i of message `tag`: varied signs and magnitudes (2^-8 .. 2^7), so that a
// different summation order would change the rounding.
float Value(int q, size_t i, uint64_t tag) {
  uint64_t x = (tag * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull) ^ (q * 0x94D049BB133111EBull);
  x ^= x >> 31;
  x *= 0xD6E8FEB86CA6D34Dull;
  x ^= x >> 29;
  const float unit = static_cast<float>(x >> 40) / static_cast<float>(1ull << 24) * 2.f - 1.f;
  return std::ldexp(unit, static_cast<int>((x >> 8) % 16) - 8);
}

// ---- rank process ----

int rank_failures = 0;
#define RANK_EXPECT(cond, ...)                                     \
  do {                                                             \
    if (!(cond)) {                                                 \
      std::fprintf(stderr, "rank check failed: " __VA_ARGS__);     \
      std::fprintf(stderr, "\n");                                  \
      ++rank_failures;                                             \
    }                                                              \
  } while (0)
#define RANK_OK(expr)                                                                      \
  do {                                                                                     \
    absl::Status s_ = (expr);                                                              \
    if (!s_.ok()) {                                                                        \
      std::fprintf(stderr, "rank: %s: %s\n", #expr, std::string(s_.message()).c_str());   \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)
#define RANK_CUDA(expr)                                                                    \
  do {                                                                                     \
    cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "rank: %s: %s\n", #expr, cudaGetErrorString(e_));              \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

// Inputs of every rank for message `tag` of n floats, and the expected result.
std::vector<float> Expected(int world, size_t n, uint64_t tag) {
  std::vector<std::vector<float>> in(world, std::vector<float>(n));
  std::vector<const float*> p;
  for (int q = 0; q < world; ++q) {
    for (size_t i = 0; i < n; ++i) in[q][i] = Value(q, i, tag);
    p.push_back(in[q].data());
  }
  std::vector<float> out(n);
  CarReferenceSum(p, n, out.data());
  return out;
}

int RankMain(int rank, int world, const std::string& store) {
  GlooOptions go;
  go.rank = rank;
  go.world = world;
  go.store_dir = store;
  go.prefix = "car";
  auto gloo = GlooCollective::Create(go);
  RANK_OK(gloo.status());
  auto dev = NewCudaStagingDevice(0);
  RANK_OK(dev.status());
  CustomAllReduceOptions opts;
  opts.buffer_bytes = 8u << 20;  // 2 M floats: the prefill-size messages below take several chunks
  auto car_or = CustomAllReduceCollective::Create(
      std::make_unique<HostStagedCollective>(std::move(*gloo), std::move(*dev)), 0, opts);
  RANK_OK(car_or.status());
  CustomAllReduceCollective& car = **car_or;
  RANK_EXPECT(car.rank() == rank && car.world() == world && car.graph_capturable(), "identity");

  cudaStream_t stream;
  RANK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t kMax = 5120 * 2048 + 8;
  float* d = nullptr;
  RANK_CUDA(cudaMalloc(&d, kMax * sizeof(float)));
  std::vector<float> host(kMax);
  uint64_t tag = 1;
  using Algo = CustomAllReduceOptions::Algo;

  // Eager: sizes × algorithms; `shift` = 1 makes the buffer start 4 bytes off alignment.
  const size_t sizes[] = {5120, 5123, 1, 5120 * 8, 5120 * 64, 5120 * 512, 5120 * 2048};
  for (Algo algo : {Algo::kAuto, Algo::kOneShot, Algo::kTwoShot}) {
    car.set_algo(algo);
    for (size_t n : sizes)
      for (int shift : {0, 1}) {
        if (shift && n > 5120 * 64) continue;
        ++tag;
        for (size_t i = 0; i < n; ++i) host[i] = Value(rank, i, tag);
        RANK_CUDA(cudaMemcpyAsync(d + shift, host.data(), n * sizeof(float), cudaMemcpyHostToDevice,
                                  stream));
        RANK_OK(car.AllReduceSumOnStream(d + shift, n, stream));
        RANK_CUDA(cudaStreamSynchronize(stream));
        RANK_CUDA(cudaMemcpy(host.data(), d + shift, n * sizeof(float), cudaMemcpyDeviceToHost));
        const std::vector<float> want = Expected(world, n, tag);
        RANK_EXPECT(std::memcmp(host.data(), want.data(), n * sizeof(float)) == 0,
                    "eager n=%zu shift=%d algo=%d two_shot=%d: not bitwise equal to the reference",
                    n, shift, static_cast<int>(algo), car.TwoShot(n));
      }
  }
  car.set_algo(Algo::kAuto);
  // The blocking form on a device pointer.
  {
    const size_t n = 5120;
    ++tag;
    for (size_t i = 0; i < n; ++i) host[i] = Value(rank, i, tag);
    RANK_CUDA(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    RANK_CUDA(cudaDeviceSynchronize());  // a pageable copy may return before its DMA is done
    RANK_OK(car.AllReduceSum(d, n));
    RANK_CUDA(cudaMemcpy(host.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    const std::vector<float> want = Expected(world, n, tag);
    RANK_EXPECT(std::memcmp(host.data(), want.data(), n * sizeof(float)) == 0, "blocking AllReduceSum");
  }

  // Graph-captured: three all-reduces (one row, 4 rows, 64 rows = two-shot) captured once and
  // replayed with fresh inputs each time.
  {
    const size_t ns[3] = {5120, 5120 * 4, 5120 * 64};
    const size_t offs[3] = {0, 8192, 8192 + 5120 * 4 + 4};
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    RANK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < 3; ++k) RANK_OK(car.AllReduceSumOnStream(d + offs[k], ns[k], stream));
    RANK_CUDA(cudaStreamEndCapture(stream, &graph));
    RANK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 4; ++replay) {
      const uint64_t base = 1000 + 10 * replay;
      for (int k = 0; k < 3; ++k) {
        for (size_t i = 0; i < ns[k]; ++i) host[i] = Value(rank, i, base + k);
        RANK_CUDA(cudaMemcpyAsync(d + offs[k], host.data(), ns[k] * sizeof(float),
                                  cudaMemcpyHostToDevice, stream));
        RANK_CUDA(cudaStreamSynchronize(stream));  // host is refilled for the next message
      }
      RANK_CUDA(cudaGraphLaunch(exec, stream));
      RANK_CUDA(cudaStreamSynchronize(stream));
      for (int k = 0; k < 3; ++k) {
        RANK_CUDA(cudaMemcpy(host.data(), d + offs[k], ns[k] * sizeof(float), cudaMemcpyDeviceToHost));
        const std::vector<float> want = Expected(world, ns[k], base + k);
        RANK_EXPECT(std::memcmp(host.data(), want.data(), ns[k] * sizeof(float)) == 0,
                    "graph replay %d message %d (n=%zu): not bitwise equal", replay, k, ns[k]);
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }

  // All-reduce fused with the RMSNorm after it (AllReduceRmsNormOnStream): h is the same sum,
  // bit for bit; out = RMSNorm(h) * w against a double reference; the int8 copy within half a
  // quantization step of out. Eager for 1, 4, 32 and 64 rows of 5,120 (and 3 rows of 256), then
  // the 4-row case captured in a graph and replayed.
  {
    struct FusedCase {
      int rows, n;
      bool graph;
    };
    const FusedCase cases[] = {{1, 5120, false}, {4, 5120, false}, {32, 5120, false},
                               {64, 5120, false}, {3, 256, false}, {4, 5120, true}};
    float *w = nullptr, *out = nullptr, *xd = nullptr;
    int8_t* xq = nullptr;
    const int max_rows = 64, max_n = 5120;
    RANK_CUDA(cudaMalloc(&w, max_n * sizeof(float)));
    RANK_CUDA(cudaMalloc(&out, max_rows * max_n * sizeof(float)));
    RANK_CUDA(cudaMalloc(&xq, max_rows * max_n));
    RANK_CUDA(cudaMalloc(&xd, max_rows * max_n / 32 * sizeof(float)));
    std::vector<float> hw(max_n);
    for (int i = 0; i < max_n; ++i) hw[i] = 1.f + 0.5f * Value(0, i, 777);
    RANK_CUDA(cudaMemcpy(w, hw.data(), max_n * sizeof(float), cudaMemcpyHostToDevice));
    RANK_CUDA(cudaDeviceSynchronize());
    const float eps = 1e-6f;
    for (const FusedCase& c : cases) {
      const size_t n = static_cast<size_t>(c.rows) * c.n;
      Collective::FusedNormArgs a;
      a.h = d;
      a.rows = c.rows;
      a.n = c.n;
      a.w = w;
      a.eps = eps;
      a.out = out;
      a.xq = xq;
      a.xd = xd;
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      if (c.graph) {
        RANK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        RANK_OK(car.AllReduceRmsNormOnStream(a, stream));
        RANK_CUDA(cudaStreamEndCapture(stream, &graph));
        RANK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      }
      for (int replay = 0; replay < (c.graph ? 3 : 1); ++replay) {
        ++tag;
        for (size_t i = 0; i < n; ++i) host[i] = Value(rank, i, tag);
        RANK_CUDA(cudaMemcpyAsync(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
        RANK_CUDA(cudaStreamSynchronize(stream));
        if (c.graph) RANK_CUDA(cudaGraphLaunch(exec, stream));
        else RANK_OK(car.AllReduceRmsNormOnStream(a, stream));
        RANK_CUDA(cudaStreamSynchronize(stream));
        std::vector<float> h(n), o(n), scale(n / 32);
        std::vector<int8_t> q(n);
        RANK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
        RANK_CUDA(cudaMemcpy(o.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
        RANK_CUDA(cudaMemcpy(q.data(), xq, n, cudaMemcpyDeviceToHost));
        RANK_CUDA(cudaMemcpy(scale.data(), xd, n / 32 * sizeof(float), cudaMemcpyDeviceToHost));
        const std::vector<float> want = Expected(world, n, tag);
        RANK_EXPECT(std::memcmp(h.data(), want.data(), n * sizeof(float)) == 0,
                    "fused %d x %d (graph %d): the sum is not bitwise the all-reduce's", c.rows,
                    c.n, c.graph);
        double worst = 0, worst_q = 0;
        for (int r = 0; r < c.rows; ++r) {
          const float* hr = want.data() + static_cast<size_t>(r) * c.n;
          double ss = 0, amax_row = 0, worst_row = 0;
          for (int i = 0; i < c.n; ++i) ss += static_cast<double>(hr[i]) * hr[i];
          const double inv = 1.0 / std::sqrt(ss / c.n + eps);
          for (int i = 0; i < c.n; ++i) {
            const double ref = hr[i] * inv * hw[i];
            amax_row = std::max(amax_row, std::fabs(ref));
            worst_row = std::max(worst_row, std::fabs(o[static_cast<size_t>(r) * c.n + i] - ref));
          }
          worst = std::max(worst, worst_row / std::max(amax_row, 1e-30));
          for (int b = 0; b < c.n / 32; ++b) {
            const size_t k = static_cast<size_t>(r) * (c.n / 32) + b;
            for (int i = 0; i < 32; ++i) {
              const size_t e = static_cast<size_t>(r) * c.n + b * 32 + i;
              worst_q = std::max(worst_q, std::fabs(q[e] * static_cast<double>(scale[k]) - o[e]) /
                                              std::max(static_cast<double>(scale[k]), 1e-30));
            }
          }
        }
        RANK_EXPECT(worst < 1e-5, "fused %d x %d: norm off by %.3e of the row's max", c.rows, c.n,
                    worst);
        RANK_EXPECT(worst_q <= 0.5001, "fused %d x %d: int8 copy off by %.3f steps", c.rows, c.n,
                    worst_q);
      }
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
    }
    // Shapes it does not take are refused as Unimplemented (the caller falls back).
    Collective::FusedNormArgs big;
    big.h = d;
    big.rows = 65;
    big.n = 5120;
    big.w = w;
    big.out = out;
    RANK_EXPECT(absl::IsUnimplemented(car.AllReduceRmsNormOnStream(big, stream)),
                "65 rows must be refused");
    cudaFree(w);
    cudaFree(out);
    cudaFree(xq);
    cudaFree(xd);
  }

  // AllGatherV: uneven counts, small (logits of a few rows) and over the buffer (2 M floats).
  for (size_t base_count : {size_t{1000}, size_t{(8u << 20) / 4 + 3000}}) {
    std::vector<size_t> counts(world);
    size_t total = 0;
    for (int q = 0; q < world; ++q) total += counts[q] = base_count + 7 * q;
    float *in = nullptr, *out = nullptr;
    RANK_CUDA(cudaMalloc(&in, counts[rank] * sizeof(float)));
    RANK_CUDA(cudaMalloc(&out, total * sizeof(float)));
    ++tag;
    std::vector<float> mine(counts[rank]);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = Value(rank, i, tag);
    RANK_CUDA(cudaMemcpy(in, mine.data(), mine.size() * sizeof(float), cudaMemcpyHostToDevice));
    RANK_CUDA(cudaDeviceSynchronize());
    RANK_OK(car.AllGatherV(in, counts, out));
    std::vector<float> got(total);
    RANK_CUDA(cudaMemcpy(got.data(), out, total * sizeof(float), cudaMemcpyDeviceToHost));
    size_t at = 0;
    bool ok = true;
    for (int q = 0; q < world; ++q)
      for (size_t i = 0; i < counts[q]; ++i) ok &= got[at++] == Value(q, i, tag);
    RANK_EXPECT(ok, "AllGatherV of %zu floats per rank", base_count);
    cudaFree(in);
    cudaFree(out);
  }
  // Host pointers go to the base collective.
  {
    float x = static_cast<float>(rank + 1);
    RANK_OK(car.AllReduceSum(&x, 1));
    RANK_EXPECT(x == world * (world + 1) / 2.f, "host AllReduceSum");
  }
  RANK_OK(car.Barrier());
  cudaFree(d);
  cudaStreamDestroy(stream);
  std::fprintf(stderr, "rank %d/%d: %d failed checks\n", rank, world, rank_failures);
  return rank_failures == 0 ? 0 : 1;
}

std::string self_exe;
// ds_tp_rank: the build's, or $DS_TP_RANK_BIN (the device scripts run packed binaries elsewhere).
std::string TpRankBin() {
  const char* e = std::getenv("DS_TP_RANK_BIN");
  return e && *e ? e : DS_TP_RANK_BIN;
}

void RunRanks(int world) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string store = Dir() + "/store_w" + std::to_string(world);
  std::filesystem::remove_all(store);
  std::vector<std::vector<std::string>> cmds;
  for (int r = 0; r < world; ++r)
    cmds.push_back({self_exe, "--car-rank", std::to_string(r), "--car-world", std::to_string(world),
                    "--car-store", store});
  const auto rc = RunAll(cmds);
  for (int r = 0; r < world; ++r) EXPECT_EQ(rc[r], 0) << "rank " << r << " of " << world;
}

TEST(CustomAllReduce, TwoRanksOnOneGpu) { RunRanks(2); }
TEST(CustomAllReduce, ThreeRanksOnOneGpu) { RunRanks(3); }
TEST(CustomAllReduce, FourRanksOnOneGpu) { RunRanks(4); }

// ---- CUDA TP groups over the custom collective ----

nlohmann::json Load(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  if (!f.good()) return {};
  return nlohmann::json::parse(f);
}

// ds_tp_rank's synthetic model of `shape` (tp, tiled) and weight type, made once per test program.
const std::string& Model(const std::string& type, const std::string& shape = "tp") {
  static std::map<std::string, std::string> paths;
  const std::string key = shape + "_" + type;
  auto it = paths.find(key);
  if (it != paths.end()) return it->second;
  const std::string p = Dir() + "/" + key + ".gguf";
  const auto rc = RunAll({{TpRankBin(), "--make-model", p, "--shape", shape, "--type", type}});
  EXPECT_EQ(rc[0], 0) << "synthesizing " << p;
  return paths[key] = p;
}

// --portable (or DS_TEST_PORTABLE=1, read by main only): every rank runs the portable (sm_70 /
// V100) kernel path, as the other GPU tests do with tests/gpu_test_main.cc (issue #19).
bool run_portable = false;

nlohmann::json RunGroup(const std::string& model, int world, const std::string& name,
                        std::vector<std::string> extra = {}) {
  const std::string store = Dir() + "/store_" + name, out = Dir() + "/res_" + name + ".json";
  std::filesystem::remove_all(store);
  std::vector<std::vector<std::string>> cmds;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> c = {TpRankBin(), "--backend", "cuda", "--model", model, "--rank",
                                  std::to_string(r), "--world", std::to_string(world), "--store",
                                  store, "--prefix", name, "--out", out, "--gen", "8"};
    if (world > 1) c.insert(c.end(), {"--collective", "custom"});
    if (run_portable) c.insert(c.end(), {"--portable", "on"});
    c.insert(c.end(), extra.begin(), extra.end());
    cmds.push_back(c);
  }
  const auto rc = RunAll(cmds);
  for (int r = 0; r < world; ++r) EXPECT_EQ(rc[r], 0) << name << " rank " << r;
  return Load(out);
}

void ExpectClose(const nlohmann::json& got, const nlohmann::json& ref, double bound,
                 const std::string& what) {
  ASSERT_TRUE(got.contains("logits") && ref.contains("logits")) << what;
  EXPECT_EQ(got["tokens"], ref["tokens"]) << what;
  const auto& a = got["logits"];
  const auto& b = ref["logits"];
  ASSERT_EQ(a.size(), b.size()) << what;
  double max_diff = 0, max_abs = 0;
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].size(), b[s].size()) << what << " step " << s;
    for (size_t i = 0; i < a[s].size(); ++i) {
      const double x = a[s][i].get<double>(), y = b[s][i].get<double>();
      max_diff = std::max(max_diff, std::abs(x - y));
      max_abs = std::max(max_abs, std::abs(y));
    }
  }
  EXPECT_GT(max_abs, 0.1) << what;
  EXPECT_LT(max_diff, bound * max_abs) << what << ": max |dlogit| " << max_diff << " of " << max_abs;
  std::printf("%s: max |dlogit| / max |logit| = %.3g (bound %.g)\n", what.c_str(),
              max_diff / std::max(max_abs, 1e-30), bound);
}

TEST(CustomTp, CudaGroupsOnOneGpuMatchTp1) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (const std::string type : {"F32", "Q8_0"}) {
    const double bound = type == "F32" ? 1e-4 : 5e-2;
    const nlohmann::json ref = RunGroup(Model(type), 1, "ref_" + type);
    for (const auto& [world, fused] : {std::pair{2, false}, {3, false}, {2, true}}) {
      // fused: each all-reduce fused with the RMSNorm after it (CudaBackendOptions::
      // fuse_allreduce_norm), in the decode graphs too.
      const std::string name =
          "custom_w" + std::to_string(world) + (fused ? "_fused_" : "_") + type;
      const nlohmann::json got =
          RunGroup(Model(type), world, name,
                   fused ? std::vector<std::string>{"--fuse-norm", "on"} : std::vector<std::string>{});
      EXPECT_EQ(got["collective"], "custom") << name;
      ExpectClose(got, ref, bound, name);
      for (int r = 1; r < world; ++r)
        EXPECT_EQ(Load(Dir() + "/res_" + name + ".json." + std::to_string(r))["tokens"], got["tokens"])
            << name << " rank " << r;
    }
  }
}

// Tiled Q4_K / IQ4_NL in TP groups (CudaBackendOptions::tiled_f16_formats, on by default): on the
// tiled shape (ds_tp_rank --shape tiled) each rank tiles the slices that hold whole 256-element
// units and keeps the others raw, and its f16 kernel scales the activations per row of its own
// slice; TP = 2 and 3 must still match TP = 1 within the Q8_0 bound and agree on the tokens.
TEST(CustomTp, TiledFormatsMatchTp1) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (const std::string type : {"Q4_K", "IQ4_NL"}) {
    const std::string& model = Model(type, "tiled");
    const nlohmann::json ref = RunGroup(model, 1, "tiled_ref_" + type);
    for (const int world : {2, 3}) {
      const std::string name = "tiled_w" + std::to_string(world) + "_" + type;
      const nlohmann::json got = RunGroup(model, world, name);
      ExpectClose(got, ref, 5e-2, name);
      for (int r = 1; r < world; ++r)
        EXPECT_EQ(Load(Dir() + "/res_" + name + ".json." + std::to_string(r))["tokens"], got["tokens"])
            << name << " rank " << r;
    }
  }
}

// TP all-reduce overlapped with the projection GEMMs (CudaBackendOptions::overlap_allreduce): a
// 300-token prompt beside the 24-token one makes one 324-row prefill micro-step. With
// --overlap-min-rows 256 (the default is 4,096) and 4 chunks, the flavour-0 plan: slot 0's 24
// rows take the column kernels, the 300-row cuBLAS piece is cut into 128 + 128 + 44 rows; the
// pieces, coalesced up to 64 rows, are [0,152) [152,280) [280,324): 3 all-reduces per
// projection, 2 projections per layer, 4 layers. With --overlap-min-rows 64 --overlap-chunks 8:
// chunks of 64 (ceil(300/8) rounded up), pieces of >= 8 rows: [0,24) + 4 x 64 + 44 = 6 per
// projection. TP = 3 has a rank without GDN heads (the Q8_0 pair of key heads moves as one
// granule), which must issue the same pieces. Everything must match overlap off and TP = 1
// within the bounds of the other CustomTp test; the ranks report the same count.
TEST(CustomTp, OverlappedAllReduceMatchesPlain) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::string> longp = {"--prompt2", "300", "--ctx", "512"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> v = longp;
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  const int n_layer = 4;
  for (const std::string type : {"F32", "Q8_0"}) {
    const double bound = type == "F32" ? 1e-4 : 5e-2;
    const nlohmann::json ref = RunGroup(Model(type), 1, "ovl_ref_" + type, longp);
    const nlohmann::json off = RunGroup(Model(type), 2, "ovl_off_" + type, with({"--overlap", "off"}));
    EXPECT_EQ(off["overlap_allreduces"], 0);
    ExpectClose(off, ref, bound, "overlap off TP=2 vs TP=1 " + type);
    struct Case {
      int world;
      std::vector<std::string> args;
      int per_projection;
    };
    const std::vector<std::string> at256 = {"--overlap", "on", "--overlap-min-rows", "256",
                                            "--overlap-chunks", "4"};
    const std::vector<std::string> at64 = {"--overlap", "on", "--overlap-min-rows", "64",
                                           "--overlap-chunks", "8"};
    for (const Case& k : {Case{2, at256, 3}, Case{2, at64, 6}, Case{3, at256, 3}}) {
      const std::string name = "ovl_w" + std::to_string(k.world) + "_" +
                               std::to_string(k.per_projection) + "_" + type;
      const nlohmann::json got = RunGroup(Model(type), k.world, name, with(k.args));
      for (int r = 0; r < k.world; ++r) {
        const nlohmann::json rr =
            r == 0 ? got : Load(Dir() + "/res_" + name + ".json." + std::to_string(r));
        EXPECT_EQ(rr["overlap_allreduces"], 2 * n_layer * k.per_projection) << name << " rank " << r;
        EXPECT_EQ(rr["tokens"], got["tokens"]) << name << " rank " << r;
      }
      ExpectClose(got, ref, bound, name + " vs TP=1");
      ExpectClose(got, off, bound, name + " vs overlap off");
    }
  }
}

}  // namespace
}  // namespace ds

int main(int argc, char** argv) {
  ds::self_exe = std::filesystem::canonical("/proc/self/exe").string();
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--car-rank") {
      int rank = -1, world = 0;
      std::string store;
      for (int k = 1; k + 1 < argc; k += 2) {
        const std::string a = argv[k];
        if (a == "--car-rank") rank = std::atoi(argv[k + 1]);
        if (a == "--car-world") world = std::atoi(argv[k + 1]);
        if (a == "--car-store") store = argv[k + 1];
      }
      return ds::RankMain(rank, world, store);
    }
  ::testing::InitGoogleTest(&argc, argv);
  const char* env = std::getenv("DS_TEST_PORTABLE");
  ds::run_portable = env && std::string(env) == "1";
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--portable") ds::run_portable = true;
  return RUN_ALL_TESTS();
}
