// Benchmark driver (see bench.h). All timing is wall clock around synchronous backend steps
// (every step ends in a device sync inside the backend), after warm-up steps that include graph
// capture and cuBLAS handle setup.
#include "tools/bench/bench.h"
#include "tools/bench/bench_tp.h"
#include "tools/bench/mtp_cost.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/sampling/sampler.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/model/gdn_state.h"
#include "worker/model/kv_type.h"

namespace ds {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

#define BENCH_CHECK(expr)                                                                    \
  do {                                                                                       \
    absl::Status st_ = (expr);                                                               \
    if (!st_.ok()) {                                                                         \
      std::fprintf(stderr, "bench: %s failed: %s\n", #expr, st_.ToString().c_str());       \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

// Device-to-device copy of 4 GiB; bandwidth counts bytes read + written. Median of 7.
double MeasureCopyBandwidth(int device) {
  const size_t bytes = 4ull << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&a, bytes) != cudaSuccess ||
      cudaMalloc(&b, bytes) != cudaSuccess) {
    std::fprintf(stderr, "bench: could not allocate 8 GiB for the bandwidth probe\n");
    cudaFree(a);
    return 0;
  }
  cudaMemset(a, 0x5A, bytes);  // non-zero data
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 9; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  if (cudaGetLastError() != cudaSuccess) return 0;
  return 2.0 * bytes / (ms[ms.size() / 2] * 1e-3);
}

std::vector<int32_t> RandomTokens(int n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> d(0, std::max(1, std::min(vocab, 248000)) - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

struct Row {
  std::string test;
  double tok_s = 0;
  double gbs = 0;   // weight bytes / step time (decode rows)
  double pct = 0;   // of measured copy bandwidth
  std::string note;
};

void PrintRow(const Row& r) {
  std::printf("%-34s %12.1f %10.1f %7.1f%%  %s\n", r.test.c_str(), r.tok_s, r.gbs, r.pct, r.note.c_str());
  std::fflush(stdout);
}

// Decodes `steps` tokens for every slot in `slots` (one batched step per token), feeding back the
// greedy tokens. Returns seconds.
absl::StatusOr<double> DecodeLoop(cuda::CudaBackendApi& be, const std::vector<int>& slots,
                                  std::vector<int32_t> last, int steps) {
  const auto t0 = Clock::now();
  std::vector<SeqStep> batch(slots.size());
  std::vector<int32_t> out;
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < slots.size(); ++i) {
      batch[i].slot = slots[i];
      batch[i].pos0 = be.SlotLength(slots[i]);
      batch[i].tokens.assign(1, last[i]);
    }
    DS_RETURN_IF_ERROR(be.ForwardGreedy(batch, &out, nullptr));
    last = out;
  }
  return Since(t0);
}

// The --sample T,TOP_K,TOP_P parameters of the non-greedy decode rows.
sampling::SamplingParams BenchSampling(const BenchOptions& o) {
  sampling::SamplingParams sp;
  sp.temperature = o.sample_temperature;
  sp.top_k = o.sample_top_k;
  sp.top_p = o.sample_top_p;
  return sp;
}

// Like DecodeLoop, but every step goes through Forward and samples with `params` (seed per
// sequence): on the device (device_sample rows, tokens back) or on the host (logits back, CPU
// sampler per row, as the worker does).
absl::StatusOr<double> SampledDecodeLoop(cuda::CudaBackendApi& be, const std::vector<int>& slots,
                                         std::vector<int32_t> last, int steps,
                                         const sampling::SamplingParams& params, bool device) {
  const size_t B = slots.size();
  std::vector<sampling::Sampler> samplers;
  std::vector<std::vector<int32_t>> hist(B);
  for (size_t i = 0; i < B; ++i) {
    sampling::SamplingParams p = params;
    p.seed = 1000 + i;
    samplers.emplace_back(p);
    hist[i].push_back(last[i]);
  }
  std::vector<SeqStep> batch(B);
  std::vector<DeviceSampleRow> rows(B);
  StepOutput out;
  const int V = be.config().n_vocab;
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < B; ++i) {
      batch[i].slot = slots[i];
      batch[i].pos0 = be.SlotLength(slots[i]);
      batch[i].tokens.assign(1, last[i]);
      rows[i].mode = DeviceSampleRow::Mode::kSample;
      rows[i].params = &samplers[i].params();
      rows[i].history = hist[i];
      rows[i].uniform = params.temperature > 0 ? samplers[i].UniformAt(hist[i].size()) : 0.0;
    }
    StepOptions opts;
    if (device) opts.device_sample = rows;
    DS_RETURN_IF_ERROR(be.Forward(batch, opts, &out));
    for (size_t i = 0; i < B; ++i) {
      int32_t t;
      if (device) {
        t = out.tokens[i];
      } else {
        t = samplers[i].Sample(std::span<const float>(out.logits.data() + i * V, V), hist[i]).token;
      }
      if (t < 0 || t >= V) return absl::InternalError(absl::StrCat("sampled token ", t));
      last[i] = t;
      hist[i].push_back(t);
    }
  }
  return Since(t0);
}

// --mtp: one backend with room for the largest k and stream count, then every (k, streams).
template <typename MakeBackend>
int RunMtpSection(const BenchOptions& o, MakeBackend& make_backend) {
  int k_max = 0, b_max = 0;
  for (int k : o.mtp) k_max = std::max(k_max, k);
  for (int b : o.mtp_streams) b_max = std::max(b_max, b);
  MtpCostOptions big;
  big.k = k_max;
  big.depth = o.mtp_depth;
  big.iters = o.mtp_iters;
  const auto tl = Clock::now();
  auto be_or = make_backend(b_max, MtpCostSlotCtx(big), k_max + 1, b_max);
  if (!be_or.ok()) {
    std::fprintf(stderr, "bench: %s\n", be_or.status().ToString().c_str());
    return 1;
  }
  auto& be = **be_or;
  std::printf("loaded in %.1f s with speculative room %d tokens x %d sequences; memory plan: %s\n",
              Since(tl), k_max + 1, b_max, be.memory_plan().ToString().c_str());
  std::printf("greedy draft chain: %s\n", be.DraftChainForm().c_str());
  const std::vector<double> r75 = {0.75};
  std::string acc;
  for (double r : o.mtp_accept) {
    char b[32];
    std::snprintf(b, sizeof b, "%s%.3f", acc.empty() ? "" : ",", r);
    acc += b;
  }
  std::printf("\nMTP cost at depth %d, median of %d (ms; verify = k+1 tokens per stream, speculative, "
              "+ CommitSpeculative(1); draft = MtpRows of the catch-up rows + k-1 MtpStep per "
              "stream; tok/s = streams x tokens per step / (verify with logits+hidden to the host "
              "+ drafts); chain cyc = verify(dev) + MtpDraftGreedy of k drafts per stream, the "
              "fast path of plain greedy; deferred = the same cycle with the drafts left on the "
              "device for the next verify, MtpDraftDeferred)\n",
              o.mtp_depth, o.mtp_iters);
  std::printf("%2s %7s %8s %15s %15s %9s %9s %8s %9s %10s %10s %6s %8s %8s%s%s\n", "k", "streams",
              "decode", "verify(dev)", "verify(host)", "rows 1", "rows k+1", "MtpStep",
              "plain t/s", "t/s @75%", "tok/step", "cycle", "chain@75", "deferred",
              o.mtp_accept.empty() ? "" : "  t/s @", acc.c_str());
  std::vector<std::string> prof_lines;
  for (int B : o.mtp_streams) {
    for (int k : o.mtp) {
      MtpCostOptions mo = big;
      mo.k = k;
      mo.streams = B;
      if (o.profile && B == o.mtp_streams.front() && k == o.mtp.front()) {
        // Per-op-class time of a plain decode step and of a verify step (graphs off), printed
        // after the row.
        mo.profile = [&be, &prof_lines](const char* shape, bool begin) {
          if (begin) {
            be.SetProfiling(true);
            be.ResetProfile();
            return;
          }
          be.SetProfiling(false);
          std::string line = std::string("   per-op-class, ") + shape + " (ms/step):";
          for (auto& [cls, ms] : be.ProfileTotals()) {
            char b[64];
            std::snprintf(b, sizeof b, " %s %.3f", cls.c_str(), ms / 8);
            line += b;
          }
          prof_lines.push_back(line);
        };
      }
      auto c = MeasureMtpCost(be, mo);
      if (!c.ok()) {
        std::fprintf(stderr, "bench: MTP cost k=%d streams=%d: %s\n", k, B,
                     c.status().ToString().c_str());
        return 1;
      }
      // Milliseconds to the microsecond: the demo model's cycle changes by tens of them.
      std::printf("%2d %7d %8.3f %7.3f (%.2fx) %7.3f (%.2fx) %9.3f %9.3f %8.3f %9.1f %10.1f %10.2f",
                  k, B, c->decode_ms, c->verify_dev_ms, c->verify_dev_ms / c->decode_ms,
                  c->verify_host_ms, c->verify_host_ms / c->decode_ms, c->rows1_ms, c->rows_k1_ms,
                  c->step_ms, B * 1e3 / c->decode_ms, MtpProjectedTokS(*c, mo, r75),
                  MtpTokensPerStep(k, r75));
      std::printf(" %6.3f %8.1f %8.3f", c->cycle_ms, MtpChainProjectedTokS(*c, mo, r75),
                  c->cycle_deferred_ms);
      if (!o.mtp_accept.empty())
        std::printf("  %.1f (%.2f tok/step; chain %.1f)", MtpProjectedTokS(*c, mo, o.mtp_accept),
                    MtpTokensPerStep(k, o.mtp_accept), MtpChainProjectedTokS(*c, mo, o.mtp_accept));
      std::printf("\n");
      for (const std::string& line : prof_lines) std::printf("%s\n", line.c_str());
      prof_lines.clear();
      if (B == o.mtp_streams.front() && k == o.mtp.front())
        std::printf("   (MTP KV over a %d-token prompt, written inside its prefill: %.2f ms with, "
                    "%.2f ms without: +%.1f%%)\n",
                    o.mtp_depth, c->prompt_fill_ms, c->prompt_plain_ms,
                    100.0 * (c->prompt_fill_ms / c->prompt_plain_ms - 1.0));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int RunBench(const BenchOptions& o) {
  if (o.model.empty()) {
    std::fprintf(stderr, "bench: --model is required\n");
    return 1;
  }
  const auto kv_type_or = ParseKvType(o.kv_type);
  if (!kv_type_or.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(kv_type_or.status().message()).c_str());
    return 1;
  }
  const GgmlType kv_type = *kv_type_or;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, o.device) != cudaSuccess) {
    std::fprintf(stderr, "bench: no CUDA device %d\n", o.device);
    return 1;
  }
  // --tp N: this process is one rank (bench_tp.h); every rank runs every row in lock-step and
  // only rank 0's output is shown. Ranks > 0 skip the bandwidth probe (they may share its GPU).
  std::unique_ptr<Collective> tp_coll;
  if (o.tp > 1) {
    auto c = MakeBenchCollective(o);
    if (!c.ok()) {
      std::fprintf(stderr, "bench: rank %d: %s\n", o.tp_rank, c.status().ToString().c_str());
      return 1;
    }
    tp_coll = std::move(*c);
  }
  const double bw = o.tp_rank > 0 ? 0 : MeasureCopyBandwidth(o.device);
  std::printf("device %d: %s, %d SMs, %.1f GiB; measured copy bandwidth %.0f GB/s (read+write)\n",
              o.device, prop.name, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1ull << 30), bw * 1e-9);
  if (tp_coll) {
    std::printf("tensor parallel: %d ranks, collective %s, GPUs", o.tp, tp_coll->name().c_str());
    for (int r = 0; r < o.tp; ++r) std::printf(" %d", o.gpus.empty() ? r : o.gpus[r]);
    std::printf(" (rank 0's figures; every row runs on all ranks in lock-step)\n");
  }
  double ar_row_us = 0;  // graph-captured all-reduce of one decode row (TP), for the step share
  std::mt19937 rng(42);
  std::vector<Row> rows;
  auto pct = [&](double gbs) { return bw > 0 ? 100.0 * gbs * 1e9 / bw : 0.0; };
  // One backend per phase: `n_slots` slots of `slot_ctx` tokens on the bench's device and KV type.
  auto make_backend = [&](int n_slots, int slot_ctx, int spec_tokens = 0, int spec_seqs = 0)
      -> absl::StatusOr<std::unique_ptr<cuda::CudaBackendApi>> {
    BackendOptions bo;
    bo.device = o.device;
    bo.n_slots = n_slots;
    bo.slot_ctx = slot_ctx;
    bo.tp_rank = std::max(0, o.tp_rank);
    bo.tp_world = o.tp;
    bo.collective = tp_coll.get();
    CudaBackendOptions co;
    co.max_step_tokens = o.max_step_tokens;
    co.kv_type = kv_type;
    co.tiled = o.tiled;
    co.portable = o.portable;
    co.int8_mmq = o.mmq;
    co.f16_mma = o.f16_mma;
    co.dense_weights = o.dense;
    co.batch_invariant = o.batch_invariant;
    co.gdn_decode_runs = o.gdn_runs;
    co.gemv_six_columns = o.gemv_six;
    co.gemv_early_weights = o.gemv_early_weights;
    co.fuse_gdn_decode = o.fuse_gdn;
    co.attn_tensor_cores = o.attn_mma;
    co.attn_prefill_wgmma = o.attn_wgmma;
    co.gdn_scan_mma = o.gdn_scan_mma;
    co.gdn_bulk_state = o.gdn_bulk;
    co.gdn_state_early = o.gdn_state_early;
    co.gdn_spread_run_tokens = o.gdn_spread;
    co.gdn_one_group_runs = o.gdn_one_group;
    co.side_copies = o.side_copies;
    co.tiled_f16_formats = o.tiled_f16_formats;
    co.f16_cluster_split = o.f16_cluster;
    co.f16_tail_split = o.f16_tail_split;
    if (o.f16_split_cost >= 0) co.f16_split_cost = o.f16_split_cost;
    co.half_rows_in_registers = o.half_regs;
    co.f16_wgmma = o.f16_wgmma;
    co.prefill_fp8 = o.prefill_fp8;
    co.fuse_allreduce_norm = o.fuse_norm;
    if (o.overlap >= 0) co.overlap_allreduce = o.overlap == 1;
    if (o.overlap_chunks > 0) co.overlap_chunks = o.overlap_chunks;
    if (o.f16_min_cols > 0) co.f16_mma_min_cols = o.f16_min_cols;
    if (o.fp8_decode_rows >= 0) co.fp8_decode_rows = o.fp8_decode_rows;
    if (o.small_float_rows >= 0) co.small_float_max_rows = o.small_float_rows;
    co.early_launch = o.early_launch;
    co.coarse_draft_head = o.coarse_draft_head;
    co.fused_draft_chain = o.fused_draft;
    co.fused_draft_blocks = o.fused_draft_blocks;
    co.draft_chain_resident = o.draft_resident;
    co.draft_chain_fold_prep = o.chain_fold;
    co.draft_chain_prefetch = o.chain_prefetch;
    co.gdn_state_bf16 = o.gdn_state_bf16;
    // The speculative room (what CreateBackend's SpeculativeRoom sets): entries for spec_tokens
    // x spec_seqs verified tokens and the MTP block.
    co.spec_tokens = spec_tokens;
    co.spec_seqs = spec_seqs;
    auto be = cuda::CreateCudaBackendApi(o.model, bo, co);
    // TP: every rank has loaded before any of them runs a step, so no all-reduce kernel waits in
    // its device barrier for a peer that is still reading weights.
    if (be.ok() && tp_coll) DS_RETURN_IF_ERROR(tp_coll->Barrier());
    return be;
  };

  if (!o.mtp.empty()) {
    if (o.tp > 1) {
      std::fprintf(stderr, "bench: --mtp measures one rank (TP = 1); MTP under TP runs in the worker "
                           "(docs/tp.md §10)\n");
      return 1;
    }
    return RunMtpSection(o, make_backend);
  }

  // ---- one long slot: prefill and single-stream decode ----
  {
    int max_p = 0;
    for (int p : o.prefill) max_p = std::max(max_p, p);
    const int slot_ctx = std::max({max_p, o.depth, 1}) + o.decode_tokens + 64;
    const auto tl = Clock::now();
    auto be_or = make_backend(1, slot_ctx);
    if (!be_or.ok()) {
      std::fprintf(stderr, "bench: %s\n", be_or.status().ToString().c_str());
      return 1;
    }
    auto& be = **be_or;
    const double wbytes = static_cast<double>(be.StepWeightBytes());
    std::printf(
        "loaded in %.1f s; memory plan (KV %s, GDN state %s, slot_ctx %d): %s\nweight bytes "
        "per forward step: %.2f GB\n",
        Since(tl), o.kv_type.c_str(), GdnStateName(o.gdn_state_bf16), slot_ctx,
        be.memory_plan().ToString().c_str(), wbytes * 1e-9);
    if (bw > 0) std::printf("speed of light (weights only): %.1f tok/s single stream\n", bw / wbytes);
    std::printf("kernel path: %s\n", be.portable() ? "portable (sm_70: f16 cuBLAS, dp4a GEMV)"
                                                   : "sm_80+ (bf16 cuBLAS, tiled int8 mma)");
    const int vocab = be.config().n_vocab;
    std::vector<int32_t> out;
    // Warm-up: a short prefill and a few decode steps (graph capture, cuBLAS init).
    be.ResetSlot(0);
    {
      std::vector<SeqStep> b(1);
      b[0].tokens = RandomTokens(96, vocab, rng);
      BENCH_CHECK(be.ForwardGreedy(b, &out, nullptr));
      auto d = DecodeLoop(be, {0}, out, 4);
      BENCH_CHECK(d.status());
    }
    if (tp_coll) {
      // The all-reduce alone: one decode row, 16 rows (a batch of 16), 512 rows (prefill).
      std::printf("\nall-reduce of [rows, %d] f32 (%s, %d ranks), median us per call:\n",
                  be.config().n_embd, tp_coll->name().c_str(), o.tp);
      for (int rows_n : {1, 16, 512}) {
        auto t = TimeAllReduce(*tp_coll, o.device, static_cast<size_t>(rows_n) * be.config().n_embd);
        BENCH_CHECK(t.status());
        Row r{"allreduce " + std::to_string(rows_n) + "x" + std::to_string(be.config().n_embd), 0, 0,
              0, ""};
        char note[128];
        std::snprintf(note, sizeof note, "eager %.2f us, graph %.2f us per call", t->eager_us,
                      t->graph_us);
        r.note = note;
        PrintRow(r);
        rows.push_back(r);
        if (rows_n == 1) ar_row_us = t->graph_us > 0 ? t->graph_us : t->eager_us;
      }
    }
    std::printf("\n%-34s %12s %10s %8s\n", "test", "tok/s", "GB/s", "of BW");
    for (int p : o.prefill) {
      // Median of 3 runs: a single run of the first size used to carry first-use costs
      // (pp512 read 2,621..3,172 tok/s across calls with the same code).
      std::vector<double> runs;
      for (int rep = 0; rep < 3; ++rep) {
        be.ResetSlot(0);
        std::vector<SeqStep> b(1);
        b[0].tokens = RandomTokens(p, vocab, rng);
        double secs = 0;
        BENCH_CHECK(be.ForwardGreedy(b, &out, &secs));
        runs.push_back(secs);
      }
      std::sort(runs.begin(), runs.end());
      const double secs = runs[1];
      Row r{"prefill pp" + std::to_string(p), p / secs, 0, 0, ""};
      char note[96];
      std::snprintf(note, sizeof note, "%.3f s (median of 3; %.3f..%.3f)", secs, runs[0], runs[2]);
      r.note = note;
      PrintRow(r);
      rows.push_back(r);
    }
    auto decode_at = [&](int depth, const std::string& name) -> int {
      be.ResetSlot(0);
      std::vector<int32_t> last = {1};
      if (depth > 0) {
        std::vector<SeqStep> b(1);
        b[0].tokens = RandomTokens(depth, vocab, rng);
        double secs = 0;
        BENCH_CHECK(be.ForwardGreedy(b, &out, &secs));
        std::printf("  (filled %d tokens of context in %.2f s)\n", depth, secs);
        last = out;
      }
      auto d = DecodeLoop(be, {0}, last, o.decode_tokens);
      BENCH_CHECK(d.status());
      const double tps = o.decode_tokens / *d;
      const double gbs = wbytes * tps * 1e-9;
      Row r{name, tps, gbs, pct(gbs), ""};
      char note[96];
      std::snprintf(note, sizeof note, "%.2f ms/token", 1e3 / tps);
      r.note = note;
      if (bw > 0 && gbs * 1e9 > bw * 1.02) r.note += "  WARNING: exceeds measured bandwidth";
      if (ar_row_us > 0) {
        // Two all-reduces per layer (+ the embedding's), each of one row: their share of a step.
        const int n_ar = 2 * be.config().n_layer + 1;
        char share[160];
        std::snprintf(share, sizeof share, "; all-reduce %d x %.2f us = %.3f ms/token (%.1f%%)",
                      n_ar, ar_row_us, n_ar * ar_row_us * 1e-3, 100.0 * n_ar * ar_row_us * 1e-3 * tps / 1e3);
        r.note += share;
      }
      PrintRow(r);
      rows.push_back(r);
      if (o.profile && depth > 0) {
        // Per-op classes at this depth (continues the same slot; graphs off).
        be.SetProfiling(true);
        be.ResetProfile();
        const int steps = 8;
        auto pd = DecodeLoop(be, {0}, {1}, steps);
        BENCH_CHECK(pd.status());
        be.SetProfiling(false);
        std::printf("  per-op-class at depth %d (profiling pass, no graphs):", depth);
        for (auto& [cls, ms] : be.ProfileTotals()) std::printf(" %s %.3f", cls.c_str(), ms / steps);
        std::printf(" ms/token\n");
      }
      return 0;
    };
    if (decode_at(0, "decode tg" + std::to_string(o.decode_tokens) + " @0") != 0) return 1;
    const sampling::SamplingParams sp = BenchSampling(o);
    if (o.sample_temperature > 0) {
      for (bool device : {true, false}) {
        be.ResetSlot(0);
        auto w = SampledDecodeLoop(be, {0}, {1}, 4, sp, device);  // warm-up (graph capture)
        BENCH_CHECK(w.status());
        be.ResetSlot(0);
        auto d = SampledDecodeLoop(be, {0}, {1}, o.decode_tokens, sp, device);
        BENCH_CHECK(d.status());
        const double tps = o.decode_tokens / *d;
        Row r{std::string("decode sampled ") + (device ? "device" : "host") + " @0", tps,
              wbytes * tps * 1e-9, pct(wbytes * tps * 1e-9), ""};
        char note[96];
        std::snprintf(note, sizeof note, "%.2f ms/token", 1e3 / tps);
        r.note = note;
        PrintRow(r);
        rows.push_back(r);
      }
    }
    if (o.depth > 0 && decode_at(o.depth, "decode tg" + std::to_string(o.decode_tokens) + " @" + std::to_string(o.depth)) != 0)
      return 1;

    if (o.profile) {
      // Profiling pass: every op class bracketed by events, graphs off (so times include launch
      // gaps the graph would hide; compare the total with the decode row above).
      be.ResetSlot(0);
      be.SetProfiling(true);
      be.ResetProfile();
      const int steps = 16;
      auto d = DecodeLoop(be, {0}, {1}, steps);
      BENCH_CHECK(d.status());
      be.SetProfiling(false);
      std::printf("\nper-op-class time, single-stream decode at depth ~0 (profiling pass, no graphs):\n");
      double total = 0;
      for (auto& [cls, ms] : be.ProfileTotals()) total += ms;
      for (auto& [cls, ms] : be.ProfileTotals())
        std::printf("  %-12s %8.3f ms/token  %5.1f%%\n", cls.c_str(), ms / steps, 100.0 * ms / std::max(total, 1e-9));
      std::printf("  %-12s %8.3f ms/token (wall %.3f ms/token)\n", "sum", total / steps, 1e3 * *d / steps);
      // Same for one prefill of 512 tokens, and of the longest --prefill size when longer (its
      // op mix differs: attention grows with the square of the length).
      int longest = 512;
      for (const int n : o.prefill) longest = std::max(longest, n);
      std::vector<int> profiled = {512};
      if (longest > 512) profiled.push_back(longest);
      for (const int n : profiled) {
        be.ResetSlot(0);
        be.SetProfiling(true);
        be.ResetProfile();
        std::vector<SeqStep> b(1);
        b[0].tokens = RandomTokens(n, vocab, rng);
        BENCH_CHECK(be.ForwardGreedy(b, &out, nullptr));
        be.SetProfiling(false);
        std::printf("per-op-class time, prefill of %d tokens:\n", n);
        for (auto& [cls, ms] : be.ProfileTotals()) std::printf("  %-12s %8.2f ms\n", cls.c_str(), ms);
      }
    }
  }

  // ---- concurrent sequences ----
  if (!o.concurrency.empty()) {
    int max_b = 0;
    for (int b : o.concurrency) max_b = std::max(max_b, b);
    // The sampled loops (--sample) continue the same sequences twice more.
    auto be_or = make_backend(max_b, o.conc_prompt + o.conc_gen * (o.sample_temperature > 0 ? 3 : 1) + 64);
    if (!be_or.ok()) {
      std::fprintf(stderr, "bench: %s\n", be_or.status().ToString().c_str());
      return 1;
    }
    auto& be = **be_or;
    const double wbytes = static_cast<double>(be.StepWeightBytes());
    const int vocab = be.config().n_vocab;
    std::printf("\n%-34s %12s %10s %8s\n", "test", "tok/s", "GB/s", "of BW");
    for (int B : o.concurrency) {
      std::vector<int> slots(B);
      std::vector<SeqStep> batch(B);
      for (int i = 0; i < B; ++i) {
        slots[i] = i;
        be.ResetSlot(i);
        batch[i].slot = i;
        batch[i].tokens = RandomTokens(o.conc_prompt, vocab, rng);
      }
      std::vector<int32_t> first;
      double psecs = 0;
      BENCH_CHECK(be.ForwardGreedy(batch, &first, &psecs));
      // Warm-up decode steps for this batch size (graph capture), not timed.
      auto w = DecodeLoop(be, slots, first, 2);
      BENCH_CHECK(w.status());
      auto d = DecodeLoop(be, slots, first, o.conc_gen - 2);
      BENCH_CHECK(d.status());
      const int gen = o.conc_gen - 2;
      const double tps = static_cast<double>(B) * gen / *d;
      const double gbs = wbytes * (gen / *d) * 1e-9;
      Row r{"aggregate decode x" + std::to_string(B), tps, gbs, pct(gbs), ""};
      char note[128];
      std::snprintf(note, sizeof note, "%.2f ms/step; prompts %.2f s (%.0f tok/s)", 1e3 * *d / gen,
                    psecs, B * o.conc_prompt / psecs);
      r.note = note;
      PrintRow(r);
      rows.push_back(r);
      if (o.sample_temperature > 0) {
        const sampling::SamplingParams sp = BenchSampling(o);
        for (bool device : {true, false}) {
          auto sd = SampledDecodeLoop(be, slots, first, gen, sp, device);
          BENCH_CHECK(sd.status());
          const double stps = static_cast<double>(B) * gen / *sd;
          Row sr{std::string("aggregate sampled ") + (device ? "device" : "host") + " x" +
                     std::to_string(B),
                 stps, wbytes * (gen / *sd) * 1e-9, pct(wbytes * (gen / *sd) * 1e-9), ""};
          char sn[64];
          std::snprintf(sn, sizeof sn, "%.2f ms/step", 1e3 * *sd / gen);
          sr.note = sn;
          PrintRow(sr);
          rows.push_back(sr);
        }
      }
      if (o.profile && B > 1) {
        be.SetProfiling(true);
        be.ResetProfile();
        const int steps = 4;
        auto pd = DecodeLoop(be, slots, first, steps);
        BENCH_CHECK(pd.status());
        be.SetProfiling(false);
        std::printf("  per-op-class x%d (profiling pass, no graphs):", B);
        for (auto& [cls, ms] : be.ProfileTotals()) std::printf(" %s %.2f", cls.c_str(), ms / steps);
        std::printf(" ms/step\n");
      }
    }
  }

  std::printf("\n==== bench summary (%s) ====\n", prop.name);
  std::printf("%-34s %12s %10s %8s\n", "test", "tok/s", "GB/s", "of BW");
  for (const Row& r : rows) PrintRow(r);
  return 0;
}

}  // namespace ds
