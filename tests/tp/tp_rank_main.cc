// ds_tp_rank: runs ONE rank of a tensor-parallel group (one process per rank; the ranks meet
// through a Gloo FileStore directory). Used by tests/tp (TP = 1..4 must agree), by
// tools/device/tp_cuda_check.sh (--backend cuda) and for the communication measurements in
// docs/perf/tp.md.
//
//   ds_tp_rank --model M.gguf --rank R --world W --store DIR [--split 1,2 | --split mem]
//              [--free-gib X] [--lm-head vocab|rank0] [--prompt 24] [--prompt2 9] [--gen 8]
//              [--seed 1] [--threads 1] [--out result.json] [--no-logits] [--iface lo]
//              [--comm-bench ITERS] [--no-align] [--backend cpu|cuda] [--device 0]
//              [--follow REF.json] [--no-graphs] [--tiled on|off] [--fuse-norm on|off] [--collective staged|custom]
//              [--overlap on|off] [--overlap-min-rows 256] [--overlap-chunks 4] [--ctx 256]
//              [--portable on|off] [--gdn-state f32|bf16]
//
// --backend cuda (builds with CUDA): the rank's shard runs on the CUDA backend; the Gloo group is
// wrapped in a HostStagedCollective (device buffers staged through the host), so several ranks
// may share one GPU (NCCL refuses that). A testing path: every all-reduce synchronises the stream
// and decode runs without CUDA graphs. Each rank prints its CUDA memory plan.
// --collective custom (CUDA): the IPC all-reduce (CustomAllReduceCollective) over that Gloo group:
// device all-reduces and gathers through CUDA IPC buffers, graph-capturable (decode graphs on).
//   ds_tp_rank --make-model M.gguf --shape tp|tiled|perf [--type Q8_0] [--seed 1]
//
// The run: one prefill step with two sequences (slot 0: --prompt tokens, all logits; slot 1:
// --prompt2 tokens, last logits), then --gen greedy decode steps of both sequences. Rank 0 picks
// the tokens (argmax of the gathered logits) and broadcasts them, so every rank feeds the same
// batch. Rank 0 writes the JSON result: tokens, logits (unless --no-logits), per-step forward
// and communication seconds, the plan and the memory report.
//
// --follow REF.json (teacher forcing): feed the tokens of an earlier run's result instead of this
// run's argmax, so two backends' logits stay comparable at every step even where their greedy
// choices part (the recorded tokens are still this run's argmax). --no-graphs: CUDA backend
// without its decode graphs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string>

#include "common/collective/gloo_collective.h"
#include "common/collective/host_staged_collective.h"
#ifdef DS_HAVE_CUSTOM_ALLREDUCE
#include "common/collective/custom_allreduce.h"
#endif
#include "nlohmann/json.hpp"
#include "tools/synth/synth.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/gdn_state.h"
#include "worker/tp/plan.h"
#ifdef DS_HAVE_CUDA
#include "worker/cuda/cuda_backend.h"
#endif

namespace ds {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "ds_tp_rank: error: %s\n", std::string(s.message()).c_str());
  return 1;
}

// The test shape: every TP degree 1..4 divides something interesting. 12 q heads / 4 KV heads
// (units of 3 q + 1 kv), GDN 4 key heads / 12 value heads (units of 1 key head + its 3 tiled
// value heads), FFN 384 = 12 Q8_0 blocks; dv = 16 makes ssm_out column slices unaligned to Q8_0
// blocks (exercises the dequantize-at-load path), head_dim 32 keeps attn_output aligned.
SynthOptions TpTestShape() {
  SynthOptions o;
  o.n_layer = 4;
  o.n_embd = 128;
  o.n_ff = 384;
  o.n_head = 12;
  o.n_head_kv = 4;
  o.head_dim = 32;
  o.n_rot = 8;
  o.gdn_k_heads = 4;
  o.gdn_v_heads = 12;
  o.gdn_k_dim = 16;
  o.gdn_v_dim = 16;
  o.with_mtp = false;
  o.tokenizer = SynthTokenizer::kNone;
  o.n_vocab = 256;
  o.weight_type = GgmlType::Q8_0;
  o.quant_mode = SynthQuantMode::kQuantizeFloats;
  return o;
}

// The TP test shape at hidden 256 and FFN 768, for the formats the CUDA backend tiles for its f16
// kernel only when a row holds whole 256-element units (CudaBackendOptions::tiled_f16_formats):
// the matrices reading the hidden state (attn q / k / v / gate, GDN qkv / gate, ffn_up / gate)
// are tiled on every rank; ffn_down's slices where they hold whole units (Q4_K's FFN granule is
// 256 columns: 512 + 256 at TP = 2, 3 x 256 at TP = 3; IQ4_NL's is 32: 2 x 384, raw, at TP = 2,
// 3 x 256 at TP = 3); ssm_out / attn_output (192 / 384 columns: Q8_0 in the file, the synth's
// fallback) on no rank. At TP = 3 rank 2 holds no GDN heads (empty slices). Each rank mixes both
// layouts.
SynthOptions TiledTestShape() {
  SynthOptions o = TpTestShape();
  o.n_embd = 256;
  o.n_ff = 768;
  return o;
}

// A model big enough that compute per step is measurable on a laptop-class CPU: 27B-like ratios
// at 1/5 width (hidden 1024, 24/4 heads of 64 → units of 6 q + 1 kv; GDN 16/48 heads of 32),
// 8 layers, vocab 32768, Q8_0.
SynthOptions PerfShape() {
  SynthOptions o = TpTestShape();
  o.n_layer = 8;
  o.n_embd = 1024;
  o.n_ff = 3584;
  o.n_head = 24;
  o.n_head_kv = 4;
  o.head_dim = 64;
  o.n_rot = 16;
  o.gdn_k_heads = 16;
  o.gdn_v_heads = 48;
  o.gdn_k_dim = 32;
  o.gdn_v_dim = 32;
  o.n_vocab = 32768;
  o.quant_mode = SynthQuantMode::kAuto;
  return o;
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) return Fail(absl::InvalidArgumentError("unexpected argument " + k));
    if (k == "--no-logits" || k == "--no-align" || k == "--no-graphs") {
      a[k] = "1";
      continue;
    }
    if (i + 1 >= argc) return Fail(absl::InvalidArgumentError(k + " needs a value"));
    a[k] = argv[++i];
  }
  auto str = [&](const std::string& k, const std::string& d) { return a.count(k) ? a[k] : d; };
  auto num = [&](const std::string& k, int d) { return a.count(k) ? std::atoi(a[k].c_str()) : d; };

  if (a.count("--make-model")) {
    const std::string shape = str("--shape", "tp");
    if (shape != "tp" && shape != "tiled" && shape != "perf")
      return Fail(absl::InvalidArgumentError("--shape expects tp, tiled or perf, got " + shape));
    SynthOptions o = shape == "perf" ? PerfShape() : shape == "tiled" ? TiledTestShape() : TpTestShape();
    if (a.count("--type")) {
      auto t = GgmlTypeFromName(a["--type"]);
      if (!t) return Fail(absl::InvalidArgumentError("unknown --type " + a["--type"]));
      o.weight_type = *t;
    }
    o.seed = num("--seed", 1);
    absl::Status st = SynthesizeGguf(o, a["--make-model"]);
    return st.ok() ? 0 : Fail(st);
  }

  if (!a.count("--model")) return Fail(absl::InvalidArgumentError("--model is required"));
  const int rank = num("--rank", 0), world = num("--world", 1);
  const std::string backend = str("--backend", "cpu");
  if (backend != "cpu" && backend != "cuda")
    return Fail(absl::InvalidArgumentError("--backend expects cpu or cuda, got '" + backend + "'"));
#ifndef DS_HAVE_CUDA
  if (backend == "cuda")
    return Fail(absl::UnimplementedError("--backend cuda: this build has no CUDA backend"));
#endif
  std::unique_ptr<Collective> coll;
  if (world > 1) {
    GlooOptions go;
    go.rank = rank;
    go.world = world;
    go.store_dir = str("--store", "");
    go.prefix = str("--prefix", "tp");
    go.iface = str("--iface", "");
    auto g = GlooCollective::Create(go);
    if (!g.ok()) return Fail(g.status());
    coll = std::move(*g);
#ifdef DS_HAVE_CUDA
    if (backend == "cuda") {
      auto dev = NewCudaStagingDevice(num("--device", 0));
      if (!dev.ok()) return Fail(dev.status());
      coll = std::make_unique<HostStagedCollective>(std::move(coll), std::move(*dev));
      if (str("--collective", "staged") == "custom") {
#ifdef DS_HAVE_CUSTOM_ALLREDUCE
        auto car = CustomAllReduceCollective::Create(std::move(coll), num("--device", 0));
        if (!car.ok()) return Fail(car.status());
        coll = std::move(*car);
#else
        return Fail(absl::UnimplementedError("--collective custom: this build has no CUDA"));
#endif
      } else if (str("--collective", "staged") != "staged") {
        return Fail(absl::InvalidArgumentError("--collective expects staged or custom"));
      }
    }
#endif
  }

  // Split: explicit weights, or each rank's free memory gathered over the group.
  std::vector<double> split;
  const std::string split_arg = str("--split", "");
  if (split_arg == "mem") {
    float mine = a.count("--free-gib") ? std::strtof(a["--free-gib"].c_str(), nullptr)
                                       : static_cast<float>(tp::HostMemAvailableGiB());
    std::vector<float> all(world, mine);
    if (coll) {
      absl::Status st = coll->AllGather(&mine, 1, all.data());
      if (!st.ok()) return Fail(st);
    }
    split = tp::SplitFromFreeBytes(std::vector<double>(all.begin(), all.end()));
  } else if (!split_arg.empty()) {
    auto s = tp::ParseSplit(split_arg);
    if (!s.ok()) return Fail(s.status());
    split = *s;
  }

  BackendOptions bo;
  bo.n_slots = 2;
  bo.slot_ctx = num("--ctx", 256);
  bo.n_threads = num("--threads", 1);
  bo.device = num("--device", 0);
  bo.tp_rank = rank;
  bo.tp_world = world;
  bo.tp_split = split;
  bo.tp_lm_head_rank0 = str("--lm-head", "vocab") == "rank0";
  bo.tp_align_heads = !a.count("--no-align");
  bo.collective = coll.get();
  // The GDN state's storage (worker/model/gdn_state.h): CUDA stores bf16, the CPU emulates it.
  auto gdn_state = ParseGdnState(str("--gdn-state", "f32"));
  if (!gdn_state.ok()) return Fail(gdn_state.status());
  bo.gdn_state_bf16 = *gdn_state;
  std::unique_ptr<Backend> owner;
  const tp::Plan* plan = nullptr;
  uint64_t dequantized_bytes = 0;
#ifdef DS_HAVE_CUDA
  cuda::CudaBackendApi* cuda_backend = nullptr;
#endif
  nlohmann::json res;
  if (backend == "cpu") {
    auto be = CpuBackend::Create(a["--model"], bo);
    if (!be.ok()) return Fail(be.status());
    plan = (*be)->tp_plan();
    dequantized_bytes = (*be)->weights().dequantized_bytes;
    owner = std::move(*be);
  }
#ifdef DS_HAVE_CUDA
  if (backend == "cuda") {
    CudaBackendOptions copts;
    copts.use_graphs = !a.count("--no-graphs");
    copts.tiled = str("--tiled", "on") != "off";  // --tiled off: the raw Q6_K layout (A/B)
    copts.portable = str("--portable", "off") == "on";  // the sm_70 (V100) kernels (issue #19)
    copts.fuse_allreduce_norm = str("--fuse-norm", "off") == "on";  // CudaBackendOptions
    // TP all-reduce overlapped with the projection GEMMs in large steps (default: the option's).
    if (a.count("--overlap")) copts.overlap_allreduce = str("--overlap", "off") == "on";
    copts.overlap_min_rows = num("--overlap-min-rows", copts.overlap_min_rows);
    copts.overlap_chunks = num("--overlap-chunks", copts.overlap_chunks);
    auto be = cuda::CreateCudaBackendApi(a["--model"], bo, copts);
    if (!be.ok()) return Fail(be.status());
    plan = (*be)->tp_plan();
    const CudaMemoryPlan& m = (*be)->memory_plan();
    res["cuda_memory"] = {{"weights", m.weights}, {"kv_cache", m.kv_cache},
                          {"recurrent", m.recurrent}, {"workspace", m.workspace},
                          {"total", m.total()}, {"text", m.ToString()}};
    std::fprintf(stderr, "rank %d/%d CUDA memory plan: %s\n", rank, world, m.ToString().c_str());
    cuda_backend = be->get();
    owner = std::move(*be);
  }
#endif
  Backend& b = *owner;
  const ModelConfig& c = b.config();

  res["rank"] = rank;
  res["world"] = world;
  res["backend"] = backend;
  res["collective"] = coll ? coll->name() : "none";
  if (plan) {
    const tp::Plan* p = plan;
    auto file = gguf::File::Open(a["--model"]);  // for the planner's tensor list (mmap, cheap)
    if (!file.ok()) return Fail(file.status());
    auto mem = tp::PlanMemory(**file, c, *p);
    if (!mem.ok()) return Fail(mem.status());
    res["plan"] = p->ToString();
    res["memory"] = tp::MemoryReport(*p, *mem, bo.slot_ctx);
    // CPU: what the loader really dequantized; CUDA: the planner's figure for this rank.
    res["dequantized_bytes"] = backend == "cpu" ? dequantized_bytes : (*mem)[rank].dequantized_bytes;
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < p->world; ++r)
      ranks.push_back({{"attn", {p->ranks[r].attn_units.begin, p->ranks[r].attn_units.end}},
                       {"gdn", {p->ranks[r].gdn_units.begin, p->ranks[r].gdn_units.end}},
                       {"ffn", {p->ranks[r].ffn.begin, p->ranks[r].ffn.end}},
                       {"vocab", {p->ranks[r].vocab.begin, p->ranks[r].vocab.end}},
                       {"weight_bytes", (*mem)[r].weight_bytes}});
    res["ranks"] = ranks;
    if (rank == 0) std::fprintf(stderr, "%s%s", p->ToString().c_str(), res["memory"].get<std::string>().c_str());
  }

  std::mt19937 rng(num("--seed", 1));
  auto toks = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % c.n_vocab);
    return t;
  };
  const bool keep_logits = !a.count("--no-logits");
  std::vector<std::vector<int32_t>> follow;  // [2][n_gen + 1] tokens to feed (--follow)
  if (a.count("--follow")) {
    std::ifstream f(a["--follow"]);
    if (!f) return Fail(absl::NotFoundError("--follow: cannot read " + a["--follow"]));
    follow = nlohmann::json::parse(f)["tokens"].get<std::vector<std::vector<int32_t>>>();
    if (follow.size() != 2) return Fail(absl::InvalidArgumentError("--follow: tokens must be [2][n]"));
  }
  std::vector<SeqStep> batch = {{0, 0, toks(num("--prompt", 24)), true},
                                {1, 0, toks(num("--prompt2", 9)), false}};
  nlohmann::json steps = nlohmann::json::array(), logits = nlohmann::json::array();
  std::vector<std::vector<int32_t>> gen(2);
  const int n_gen = num("--gen", 8);
  for (int step = 0; step <= n_gen; ++step) {
    StepOutput out;
    absl::Status st = b.Forward(batch, StepOptions{}, &out);
    if (!st.ok()) return Fail(st);
    steps.push_back({{"n_tokens", batch[0].tokens.size() + batch[1].tokens.size()},
                     {"forward_s", out.forward_seconds},
                     {"comm_s", out.comm_seconds}});
    int32_t next[2] = {0, 0};
    if (rank == 0) {
      if (out.logits.size() != static_cast<size_t>(out.n_rows) * c.n_vocab)
        return Fail(absl::InternalError("rank 0 got no logits"));
      if (keep_logits) logits.push_back(out.logits);
      // Rows: slot 0's rows (all of them at prefill), then slot 1's last row.
      for (int s = 0; s < 2; ++s) {
        const float* row = out.logits.data() + static_cast<size_t>(s == 0 ? out.n_rows - 2 : out.n_rows - 1) * c.n_vocab;
        next[s] = static_cast<int32_t>(std::max_element(row, row + c.n_vocab) - row);
      }
    }
    if (coll) {
      absl::Status bs = coll->Broadcast(next, sizeof(next), 0);
      if (!bs.ok()) return Fail(bs);
    }
    for (int s = 0; s < 2; ++s) {
      gen[s].push_back(next[s]);
      const int32_t feed = step < static_cast<int>(follow.empty() ? 0 : follow[s].size())
                               ? follow[s][step] : next[s];
      batch[s] = {s, b.SlotLength(s), {feed}, false};
    }
  }
  res["tokens"] = gen;
  res["steps"] = steps;
  if (keep_logits) res["logits"] = logits;
  // Summary over the decode steps (step 0 is the prefill).
  double fwd = 0, comm = 0;
  for (int s = 1; s <= n_gen; ++s) {
    fwd += steps[s]["forward_s"].get<double>();
    comm += steps[s]["comm_s"].get<double>();
  }
  if (n_gen > 0) {
    res["decode_forward_ms"] = 1e3 * fwd / n_gen;
    res["decode_comm_ms"] = 1e3 * comm / n_gen;
  }
  res["prefill_forward_ms"] = 1e3 * steps[0]["forward_s"].get<double>();
  res["prefill_comm_ms"] = 1e3 * steps[0]["comm_s"].get<double>();
  std::fprintf(stderr,
               "rank %d/%d: prefill %.2f ms (comm %.2f ms), decode %.2f ms/step (comm %.2f ms, "
               "%.1f%%)\n",
               rank, world, res["prefill_forward_ms"].get<double>(), res["prefill_comm_ms"].get<double>(),
               n_gen ? 1e3 * fwd / n_gen : 0.0, n_gen ? 1e3 * comm / n_gen : 0.0,
               fwd > 0 ? 100.0 * comm / fwd : 0.0);
  // Pure transfer cost of one step's collectives, without load imbalance: after a barrier, time
  // the 2·n_layer all-reduces of [N, n_embd] and the logits all-gather of a decode step (N = 2)
  // and of the prefill step.
  if (coll && a.count("--comm-bench")) {
    const int iters = num("--comm-bench", 20);
    auto bench = [&](int64_t n_tok, int64_t n_rows) -> absl::StatusOr<double> {
      std::vector<float> y(n_tok * c.n_embd, 1.f), part, all(n_rows * c.n_vocab);
      std::vector<size_t> counts;
      if (const tp::Plan* p = plan) {
        for (const auto& r : p->ranks) counts.push_back(n_rows * r.vocab.size());
        part.assign(counts[rank], 1.f);
      }
      DS_RETURN_IF_ERROR(coll->Barrier());
      const auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < iters; ++it) {
        for (int l = 0; l < 2 * c.n_layer; ++l) DS_RETURN_IF_ERROR(coll->AllReduceSum(y.data(), y.size()));
        if (!bo.tp_lm_head_rank0) DS_RETURN_IF_ERROR(coll->AllGatherV(part.data(), counts, all.data()));
      }
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
    };
    auto dec = bench(2, 2);
    if (!dec.ok()) return Fail(dec.status());
    const int64_t pre_tok = static_cast<int64_t>(num("--prompt", 24)) + num("--prompt2", 9);
    auto pre = bench(pre_tok, num("--prompt", 24) + 1);
    if (!pre.ok()) return Fail(pre.status());
    res["bench_decode_comm_ms"] = *dec;
    res["bench_prefill_comm_ms"] = *pre;
    std::fprintf(stderr, "rank %d: pure collective time per step: decode %.3f ms, prefill %.3f ms\n",
                 rank, *dec, *pre);
  }
#ifdef DS_HAVE_CUDA
  if (cuda_backend) res["overlap_allreduces"] = cuda_backend->OverlappedAllReduces();
#endif
  const std::string out_path = str("--out", "");
  if (!out_path.empty()) {
    std::string p = out_path;
    if (rank != 0) p += "." + std::to_string(rank);
    std::ofstream f(p);
    f << res.dump();
    if (!f) return Fail(absl::InternalError("cannot write " + p));
  }
  if (coll) {
    // Nobody tears the mesh down while a peer still needs it. A peer that closes its sockets while
    // we are still inside this barrier has necessarily left it, i.e. every rank has entered it and
    // all real work is done: Gloo then reports "connection closed by peer" here, which is benign.
    absl::Status st = coll->Barrier();
    if (!st.ok()) std::fprintf(stderr, "ds_tp_rank: rank %d: final barrier: %s (ignored)\n", rank,
                               std::string(st.message()).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace ds

int main(int argc, char** argv) { return ds::Main(argc, argv); }
