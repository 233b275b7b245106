// `deltaserve bench`: GPU benchmark of the CUDA backend on a GGUF file. Prints tok/s next to the
// weight bytes read per step, achieved GB/s and % of the measured device-to-device copy bandwidth,
// plus a per-op-class time breakdown from a profiling pass.
#pragma once
#include <string>
#include <vector>

#include "worker/model/dense_weights.h"

namespace ds {

struct BenchOptions {
  std::string model;                         // GGUF path (required)
  int device = 0;
  std::vector<int> prefill = {512, 2048, 8192};
  int decode_tokens = 128;
  int depth = 32768;                         // context filled before the second decode run (0: skip)
  std::vector<int> concurrency = {1, 4, 16, 64};
  int conc_prompt = 512;
  int conc_gen = 128;
  bool profile = true;
  int max_step_tokens = 4096;
  std::string kv_type = "f16";               // KV cache element type: f16 | q8_0 | q4_0
  bool tiled = true;                         // --tiled off: raw Q6_K layout (A/B runs)
  bool portable = false;                     // --portable on: the sm_70 (V100) kernels (issue #19)
  bool mmq = true;                           // --mmq off: no int8 MMQ kernel (A/B runs, issue #22)
  bool f16_mma = true;  // --f16-mma off: no f16 tensor-core kernel on tiled matrices (issue #22)
  DenseWeights dense = DenseWeights::kAuto;  // --dense-weights on|off|auto (dense_weights.h)
  bool batch_invariant = true;               // --batch-invariant off: CudaBackendOptions (A/B)
  bool gdn_runs = true;                      // --gdn-runs off: MTP verify GDN rows in waves (A/B)
  bool gemv_six = true;  // --gemv-six off: CudaBackendOptions::gemv_six_columns (A/B)
  bool gemv_early_weights =
      true;  // --gemv-early-weights off: CudaBackendOptions::gemv_early_weights
  bool fuse_gdn = true;                      // --fuse-gdn off: the GDN output's int8 copy by a launch of its own (A/B)
  bool attn_mma = true;                      // --attn-mma off: the f32 SIMT decode attention (A/B)
  bool attn_wgmma = true;                    // --attn-wgmma off: the mma.sync prefill flash kernel
  bool gdn_scan_mma = true;                  // --gdn-scan-mma off: the f32 CUDA-core chunk scan
  bool tiled_f16_formats = true;   // --tiled-f16-formats off: CudaBackendOptions::tiled_f16_formats
  bool gdn_bulk = true;                      // --gdn-bulk off: CudaBackendOptions::gdn_bulk_state
  bool gdn_state_early = true;  // --gdn-state-early off: CudaBackendOptions::gdn_state_early
  bool gdn_spread = true;       // --gdn-spread off: CudaBackendOptions::gdn_spread_run_tokens (A/B)
  bool gdn_one_group = false;   // --gdn-one-group on: CudaBackendOptions::gdn_one_group_runs (A/B)
  bool side_copies = true;      // --side-copies off: CudaBackendOptions::side_copies (A/B)
  bool f16_cluster = true;                   // --f16-cluster off: f16 matmul K split via scratch
  bool f16_tail_split = true;  // --f16-tail-split off: the f16 matmul's last round in the same launch
  double f16_split_cost = -1;  // --f16-split-cost X: CudaBackendOptions::f16_split_cost (< 0: default)
  bool half_regs = true;  // --half-regs off: CudaBackendOptions::half_rows_in_registers (A/B)
  bool f16_wgmma = true;                     // --f16-wgmma off: the mma.sync f16 matmul (A/B)
  bool prefill_fp8 = false;                  // --prefill-fp8 on: CudaBackendOptions::prefill_fp8
  bool fuse_norm = false;                    // --fuse-norm on: TP all-reduce fused with the RMSNorm
  // --overlap on|off: TP all-reduces of large (prefill) steps overlapped with the projection
  // GEMMs (CudaBackendOptions::overlap_allreduce); -1 = that option's default.
  int overlap = -1;
  int f16_min_cols = 0;  // --f16-min-cols N: CudaBackendOptions::f16_mma_min_cols (0: its default)
  int fp8_decode_rows = -1;  // --fp8-decode-rows N: CudaBackendOptions::fp8_decode_rows (-1: its default)
  int small_float_rows = -1;  // --small-float-rows N: CudaBackendOptions::small_float_max_rows (-1: its default)
  bool early_launch = true;  // --early-launch off: CudaBackendOptions::early_launch (A/B)
  // --coarse-draft-head off: CudaBackendOptions::coarse_draft_head (A/B of the MTP rows)
  bool coarse_draft_head = true;
  // --fused-draft off: CudaBackendOptions::fused_draft_chain (A/B of the draft chain);
  // --fused-draft-blocks N: its cluster's blocks (0: 16, see CudaBackendOptions)
  bool fused_draft = true;
  int fused_draft_blocks = 0;
  bool draft_resident = false;  // --draft-resident on: CudaBackendOptions::draft_chain_resident
  bool chain_prefetch =
      false;  // --chain-prefetch on: CudaBackendOptions::draft_chain_prefetch (A/B)
  bool chain_fold = false;      // --chain-fold on: CudaBackendOptions::draft_chain_fold_prep (A/B)
  // --gdn-state f32|bf16: CudaBackendOptions::gdn_state_bf16 (the GDN state stored in bf16)
  bool gdn_state_bf16 = false;
  int overlap_chunks = 0;                    // --overlap-chunks N (0: the option's default)
  // Non-greedy decode rows (--sample T,TOP_K,TOP_P): the same decode loops through Forward with
  // sampling on the device (StepOptions::device_sample) and on the host (logits copied back, CPU
  // sampler), one sampler per sequence. Off when sample_temperature <= 0.
  float sample_temperature = 0.0f;
  int sample_top_k = 0;
  float sample_top_p = 1.0f;
  // Tensor parallelism (--tp N [--gpus 0,1 | 0,0] [--tp-collective custom|staged|nccl]): the
  // command spawns N rank processes of itself (rank r on gpus[r], default GPU r) that meet through
  // a Gloo FileStore and run every row in lock-step; rank 0 prints. With N > 1 the bench adds
  // the all-reduce latency of one decode row (eager and graph-captured) and its share of a step.
  int tp = 1;
  std::vector<int> gpus;                     // empty: rank r on GPU r
  std::string tp_collective = "custom";      // custom (CUDA IPC) | staged (Gloo via host) | nccl
  int tp_rank = -1;                          // set in the rank processes (internal flags)
  std::string tp_store;
  // MTP cost (--mtp K[,K..], issue #15): instead of the rows above, for every k and every stream
  // count of mtp_streams the plain decode step, a verify step of k + 1 tokens per stream
  // (speculative + CommitSpeculative(1): random weights accept nothing, so the shape is forced)
  // and the drafts (MtpRows of the catch-up rows + k - 1 MtpStep per stream), at mtp_depth tokens
  // of context; then the tok/s these costs give at 75% acceptance per draft position and at the
  // --mtp-accept rates (e.g. the demo model's from `deltaserve mtp-accept`, docs/quality.md).
  std::vector<int> mtp;                      // k values; empty: no MTP section
  std::vector<double> mtp_accept;            // per-position acceptance rates (given the earlier)
  std::vector<int> mtp_streams = {1};        // --mtp-conc
  int mtp_depth = 512;
  int mtp_iters = 20;
};

// Runs the benchmark; returns 0 on success, 1 on any error (printed to stderr).
int RunBench(const BenchOptions& opts);

// argv parsing for the CLI: --model PATH [--device N] [--prefill 512,2048] [--decode N]
// [--depth N] [--conc 1,4,16] [--conc-prompt N] [--conc-gen N] [--kv-type f16|q8_0|q4_0]
// [--no-profile] [--quick] [--sample T,TOP_K,TOP_P] [--tiled on|off] [--portable on|off] [--mmq on|off]
// [--tp N [--gpus LIST] [--tp-collective custom|staged|nccl]]
// [--mtp K[,K..] [--mtp-accept R1,R2,..] [--mtp-conc 1,16] [--mtp-depth N] [--mtp-iters N]].
int BenchMain(int argc, char** argv);

}  // namespace ds
