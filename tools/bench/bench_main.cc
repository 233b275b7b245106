// `deltaserve bench`'s command line (bench.h): the flags into BenchOptions, checked, then the
// run (RunBench, or RunBenchTpParent for --tp N).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/config/on_off_switch.h"
#include "common/util/model_alias.h"
#include "tools/bench/bench.h"
#include "tools/bench/bench_tp.h"
#include "worker/model/gdn_state.h"

namespace ds {

namespace {

// The on|off switches of CudaBackendOptions (bench.h), one row each: flag, field.
constexpr OnOffSwitch<BenchOptions> kOnOff[] = {
    {"--portable", &BenchOptions::portable},
    {"--tiled", &BenchOptions::tiled},
    {"--mmq", &BenchOptions::mmq},
    {"--f16-mma", &BenchOptions::f16_mma},
    {"--batch-invariant", &BenchOptions::batch_invariant},
    {"--fuse-norm", &BenchOptions::fuse_norm},
    {"--gdn-runs", &BenchOptions::gdn_runs},
    {"--attn-mma", &BenchOptions::attn_mma},
    {"--attn-wgmma", &BenchOptions::attn_wgmma},
    {"--fuse-gdn", &BenchOptions::fuse_gdn},
    {"--gdn-scan-mma", &BenchOptions::gdn_scan_mma},
    {"--f16-cluster", &BenchOptions::f16_cluster},
    {"--f16-tail-split", &BenchOptions::f16_tail_split},
    {"--half-regs", &BenchOptions::half_regs},
    {"--gdn-bulk", &BenchOptions::gdn_bulk},
    {"--gdn-state-early", &BenchOptions::gdn_state_early},
    {"--gdn-spread", &BenchOptions::gdn_spread},
    {"--gdn-one-group", &BenchOptions::gdn_one_group},
    {"--side-copies", &BenchOptions::side_copies},
    {"--tiled-f16-formats", &BenchOptions::tiled_f16_formats},
    {"--early-launch", &BenchOptions::early_launch},
    {"--coarse-draft-head", &BenchOptions::coarse_draft_head},
    {"--fused-draft", &BenchOptions::fused_draft},
    {"--draft-resident", &BenchOptions::draft_resident},
    {"--chain-fold", &BenchOptions::chain_fold},
    {"--chain-prefetch", &BenchOptions::chain_prefetch},
    {"--gemv-six", &BenchOptions::gemv_six},
    {"--gemv-early-weights", &BenchOptions::gemv_early_weights},
    {"--f16-wgmma", &BenchOptions::f16_wgmma},
    {"--prefill-fp8", &BenchOptions::prefill_fp8},
};

}  // namespace

// argv holds only the subcommand's flags (no program name).
int BenchMain(int argc, char** argv) {
  BenchOptions o;
  auto ints = [](const char* s) {
    std::vector<int> v;
    for (const char* p = s; *p;) {
      v.push_back(std::atoi(p));
      while (*p && *p != ',') ++p;
      if (*p == ',') ++p;
    }
    return v;
  };
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench: %s needs a value\n", a.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "--tp") o.tp = std::atoi(next());
    else if (a == "--gpus") o.gpus = ints(next());
    else if (a == "--tp-collective") o.tp_collective = next();
    else if (a == "--tp-rank") o.tp_rank = std::atoi(next());
    else if (a == "--tp-store") o.tp_store = next();
    else if (a == "--model" || a == "-m") o.model = ResolveModelAlias(next());
    else if (a == "--device") o.device = std::atoi(next());
    else if (a == "--prefill") o.prefill = ints(next());
    else if (a == "--decode") o.decode_tokens = std::atoi(next());
    else if (a == "--depth") o.depth = std::atoi(next());
    else if (a == "--conc") o.concurrency = ints(next());
    else if (a == "--conc-prompt") o.conc_prompt = std::atoi(next());
    else if (a == "--conc-gen") o.conc_gen = std::atoi(next());
    else if (a == "--max-step-tokens") o.max_step_tokens = std::atoi(next());
    else if (a == "--kv-type") o.kv_type = next();
    else if (a == "--overlap-chunks") o.overlap_chunks = std::atoi(next());
    else if (a == "--f16-min-cols") o.f16_min_cols = std::atoi(next());
    else if (a == "--fp8-decode-rows") o.fp8_decode_rows = std::atoi(next());
    else if (a == "--small-float-rows") o.small_float_rows = std::atoi(next());
    else if (a == "--f16-split-cost") {
      const char* v = next();
      char* end = nullptr;
      o.f16_split_cost = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(o.f16_split_cost >= 0 && o.f16_split_cost <= 100)) {
        std::fprintf(stderr, "bench: --f16-split-cost expects a number in [0, 100], got '%s'\n", v);
        return 2;
      }
    }
    else if (a == "--fused-draft-blocks") o.fused_draft_blocks = std::atoi(next());
    else if (a == "--no-profile") o.profile = false;
    else if (a == "--mtp") o.mtp = ints(next());
    else if (a == "--mtp-conc") o.mtp_streams = ints(next());
    else if (a == "--mtp-depth") o.mtp_depth = std::atoi(next());
    else if (a == "--mtp-iters") o.mtp_iters = std::atoi(next());
    else if (a == "--mtp-accept") {
      o.mtp_accept.clear();
      for (const char* p = next(); *p;) {
        char* end = nullptr;
        const double r = std::strtod(p, &end);
        if (end == p || !(r >= 0 && r <= 1)) {
          std::fprintf(stderr, "bench: --mtp-accept wants rates in [0, 1], e.g. 0.609,0.539,0.517\n");
          return 2;
        }
        o.mtp_accept.push_back(r);
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
          std::fprintf(stderr, "bench: --mtp-accept: bad list\n");
          return 2;
        }
      }
    }
    else if (a == "--overlap") {
      const std::string v = next();
      if (v != "on" && v != "off") {
        std::fprintf(stderr, "bench: --overlap expects on or off, got '%s'\n", v.c_str());
        return 2;
      }
      o.overlap = v == "on" ? 1 : 0;
    }
    else if (bool BenchOptions::*field = OnOffFieldOf(kOnOff, a)) {
      // The on|off switches of CudaBackendOptions, for A/B runs.
      const std::string v = next();
      if (v != "on" && v != "off") {
        std::fprintf(stderr, "bench: %s expects on or off, got '%s'\n", a.c_str(), v.c_str());
        return 2;
      }
      o.*field = v == "on";
    }
    else if (a == "--gdn-state") {
      const std::string v = next();
      const auto s = ParseGdnState(v);
      if (!s.ok()) {
        std::fprintf(stderr, "bench: %s\n", std::string(s.status().message()).c_str());
        return 2;
      }
      o.gdn_state_bf16 = *s;
    }
    else if (a == "--dense-weights") {
      const std::string v = next();
      const auto d = DenseWeightsFromName(v);
      if (!d) {
        std::fprintf(stderr, "bench: --dense-weights expects on, off or auto, got '%s'\n",
                     v.c_str());
        return 2;
      }
      o.dense = *d;
    }
    else if (a == "--sample") {
      const std::string v = next();
      float t = 0, p = 1;
      int k = 0;
      if (std::sscanf(v.c_str(), "%f,%d,%f", &t, &k, &p) != 3 || !(t > 0) || k < 0 || !(p > 0 && p <= 1)) {
        std::fprintf(stderr, "bench: --sample wants T,TOP_K,TOP_P with T > 0, e.g. 0.8,40,0.95\n");
        return 1;
      }
      o.sample_temperature = t;
      o.sample_top_k = k;
      o.sample_top_p = p;
    }
    else if (a == "--quick") {
      o.prefill = {512};
      o.decode_tokens = 32;
      o.depth = 4096;
      o.concurrency = {1, 4};
      o.conc_gen = 16;
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: deltaserve bench --model PATH [--device N] [--prefill 512,2048,8192] "
          "[--decode 128] [--depth 32768] [--conc 1,4,16,64] [--conc-prompt 512] "
          "[--conc-gen 128] [--max-step-tokens 4096] [--kv-type f16|q8_0|q4_0] "
          "[--no-profile] [--quick] [--sample T,TOP_K,TOP_P] [--tiled on|off] [--portable on|off] "
          "[--mmq on|off] [--f16-mma on|off] [--f16-min-cols 9] [--early-launch on|off] "
          "[--coarse-draft-head on|off] [--fused-draft on|off] [--fused-draft-blocks N] "
          "[--draft-resident on|off] [--chain-fold on|off] [--chain-prefetch on|off] [--gdn-state "
          "f32|bf16] [--dense-weights "
          "on|off|auto] "
          "[--batch-invariant on|off] [--gdn-runs on|off] [--gemv-six on|off] "
          "[--gemv-early-weights on|off] [--fuse-gdn on|off] "
          "[--attn-mma on|off] [--attn-wgmma on|off] [--gdn-scan-mma on|off] [--f16-cluster "
          "on|off] [--f16-tail-split on|off] [--f16-split-cost X] [--half-regs on|off] "
          "[--f16-wgmma on|off] [--prefill-fp8 on|off] [--fp8-decode-rows N] [--small-float-rows "
          "N] [--gdn-bulk on|off] [--gdn-state-early on|off] [--gdn-spread on|off] "
          "[--gdn-one-group on|off] "
          "[--side-copies on|off] "
          "[--tiled-f16-formats on|off] [--fuse-norm on|off] [--overlap on|off] [--overlap-chunks "
          "4]\n"
          "  [--tp N [--gpus 0,1|0,0] [--tp-collective custom|staged|nccl]]: N rank "
          "processes (rank r on GPU r or gpus[r]), every row at TP = N plus the "
          "all-reduce latency and its share of a decode step\n"
          "  --mtp K[,K..] [--mtp-accept R1,R2,..] [--mtp-conc 1,16] [--mtp-depth 512] "
          "[--mtp-iters 20]: only the MTP cost rows (issue #15): decode step, verify of "
          "K+1 tokens, drafts, and the tok/s they give at 75%% acceptance per position and "
          "at the given per-position rates\n"
          "  --kv-type: KV cache element type (q8_0 / q4_0: GGML blocks of 32 along "
          "head_dim, dequantized in the attention kernels)\n");
      return 0;
    } else {
      std::fprintf(stderr, "bench: unknown argument %s\n", a.c_str());
      return 1;
    }
  }
  if (o.tp < 1 || o.tp > 8) {
    std::fprintf(stderr, "bench: --tp expects 1..8, got %d\n", o.tp);
    return 1;
  }
  for (int k : o.mtp)
    if (k < 1 || k > 15) {
      std::fprintf(stderr, "bench: --mtp expects drafts per step in 1..15, got %d\n", k);
      return 1;
    }
  for (int b : o.mtp_streams)
    if (b < 1) {
      std::fprintf(stderr, "bench: --mtp-conc expects stream counts >= 1\n");
      return 1;
    }
  if (!o.mtp.empty() && (o.mtp_depth < 2 || o.mtp_iters < 1)) {
    std::fprintf(stderr, "bench: --mtp-depth must be >= 2 and --mtp-iters >= 1\n");
    return 1;
  }
  if (o.tp > 1 && o.tp_rank < 0) return RunBenchTpParent(o, argc, argv);
  return RunBench(o);
}

}  // namespace ds
