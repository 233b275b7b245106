// Options and the memory plan of the CUDA device (worker/cuda/cuda_device.h). Plain structs with
// no CUDA types, so the programs that set them (bench, CLI, TP test driver) include them freely.
#pragma once
#include <cstdint>
#include <string>

#include "common/gguf/ggml_types.h"
#include "kernels/cuda/tiled_f16_split.cuh"  // kSplitCost (plain C++, no CUDA types)
#include "worker/model/backend.h"
#include "worker/runner/memory_planner.h"

namespace ds {

struct CudaBackendOptions {
  int max_step_tokens = 4096;  // token rows per internal micro-step (longer prefills are split)
  int kv_page_size = 64;       // tokens per KV page
  // Paged KV pool shared by the slots (worker/runner/memory_planner.h): tokens, 0 = what fits
  // (at most every slot full); the share of the device's memory to plan for.
  int64_t kv_pool_tokens = 0;
  double memory_fraction = 1.0;
  // Kept free beside the plan for prefix-cache checkpoints (BackendOptions::prefix_cache_bytes).
  uint64_t prefix_cache_bytes = 0;
  bool prefix_cache_required = false;
  bool use_graphs = true;      // CUDA graphs for decode-only steps (decodes, MTP verifies)
  // An MTP verify's GDN rows in runs (GdnDecodeArgs::run_first): the k + 1 tokens of a sequence
  // in one launch, the state read once; false = one launch per token index (A/B).
  bool gdn_decode_runs = true;
  // Float-weight matmuls of 5-6 columns in a 6-column kernel (GemvArgs::six_columns; A/B:
  // `bench --gemv-six off`).
  bool gemv_six_columns = true;
  // The float-weight GEMV asks for its first weights before waiting for the kernel ahead
  // (GemvArgs::early_weights; with early launch). A/B: `bench --gemv-early-weights off`.
  bool gemv_early_weights = true;
  // The GDN decode kernel writes the int8 copy of its output for ssm_out (GdnDecodeArgs::xq):
  // one launch per GDN layer fewer in decode-only steps (A/B: `bench --fuse-gdn off`).
  bool fuse_gdn_decode = true;
  // Batched GDN decode launches (heads x sequences >= 256) bring each head's state into shared
  // memory by one bulk copy, three blocks per SM (GdnDecodeArgs::bulk_state; sm_90 builds on
  // compute capability 9.0+, off the portable path). The same bits; on the H200 the 27B's x64
  // decode 2,039 -> 2,144 tok/s (A/B: `bench --gdn-bulk off`, docs/perf/h200.md).
  bool gdn_bulk_state = true;
  // The GDN decode launch asks for its state before waiting for the kernel ahead (with early
  // launch; GdnDecodeArgs::state_early; only a layer's first decode launch of the step, see
  // CudaDevice::GdnMixer). On the H100, 27B Q6_K, x1 / x16 / x64 +0.5-0.8 / +0.7 / +0.3%
  // (2026-12-07, two alternated rounds; `bench --gdn-state-early off` for A/B, docs/perf/h200.md).
  // Off for a day after its first default let every wave of a decode_path run read its states
  // early (batch_invariance_test's replay rows failed on an H100); on again since the fixed form
  // passed the whole GPU suite (batch_invariance_test with a case each way) on 2026-12-07.
  bool gdn_state_early = true;
  // A verify's (or replay's) GDN runs on one block per head (the one-stream form): token c of
  // each chunk of the run has its conv / norm / gate prologue and its output epilogue in the
  // block's thread group c % groups instead of all in group 0 (GdnDecodeArgs::spread_run_tokens).
  // The same bits (spec_kernels_cuda_test). A/B: `bench --gdn-spread off`.
  bool gdn_spread_run_tokens = true;
  // The same launches at dk = 64 (the demo model) on one thread group per head, each thread
  // holding its whole state column: no barrier per token (GdnDecodeArgs::one_group_runs; it
  // takes precedence over the spread). The same bits (spec_kernels_cuda_test). Off until measured
  // on a device (built 2026-12-07 after the last call of that session): `bench --gdn-one-group on`.
  bool gdn_one_group_runs = false;
  // Copies that need only finished micro-steps (the MTP rollback's state copies,
  // CommitSpeculative, and the next micro-step's index upload, Prepare), queued after a deferred
  // draft chain, run on a second stream beside that chain, and the device's stream waits for them:
  // on the demo model's MTP cycle they ran one after another between the chain and the next
  // verify (A/B: `bench --side-copies off`). The same work in the same order for every kernel.
  bool side_copies = true;
  // Deferred draft chains judged on the device (StepOptions::chain_after, QueueChainAfterVerify):
  // the fused chain is queued right behind a verify's sampling and judges its drafts itself, so
  // it runs while the host judges the same tokens and queues the next verify; off, the runner
  // queues the chain after the verify's wait, as before (A/B: `generate --judged-chains off`).
  // The same tokens either way.
  bool judged_chains = true;
  // Attention on f16 tensor cores (sm_80+, not on the portable path). Decode
  // (kernels/cuda/attention_mma.cu): ~10x fewer instructions per cached token than the f32 SIMT
  // kernel, which bounds decode at long contexts; P and K rounded to f16 (~1e-4..1e-3 relative on
  // the attention output). Prefill (attention_prefill_mma.cu): a flash kernel instead of the
  // cuBLAS chunks with their scores in memory, the same f16 operands. false: the SIMT decode
  // kernel and the cuBLAS prefill (A/B runs, `bench --attn-mma off`).
  bool attn_tensor_cores = true;
  // With attn_tensor_cores: prefill attention on Hopper's warpgroup tensor cores (wgmma,
  // kernels/cuda/attention_prefill_wgmma.cu) where the build has sm_90a code and the GPU is
  // compute capability 9.0; elsewhere, or false, the mma.sync flash kernel (A/B runs, `bench
  // --attn-wgmma off`). The same f16 operands and f32 accumulation.
  bool attn_prefill_wgmma = true;
  // The portable path (issue #19, docs/v100.md): the kernels a V100 (sm_70) runs, on any GPU:
  // f16 cuBLAS operands for prefill (activations scaled into f16's range,
  // ConvertF32ToHalfScaled in kernels/cuda/dequant.cuh) instead of bf16, and the raw-layout
  // dp4a GEMV instead of the tiled int8 mma kernels (tiled and int8_mmq have no effect). Always
  // taken below compute capability 8.0; `true` forces it on newer GPUs, so that the V100's
  // kernels are tested and benchmarked there (worker / serve / bench / generate --portable).
  bool portable = false;
  int gemv_max_rows = 32;      // up to this many rows per matmul use GEMV (in groups of 8)
  // Small float matrices (F32 / F16 / BF16 of at most kSmallFloatBytes: the 27B's ssm_alpha and
  // ssm_beta, a small model's layers) take the GEMV up to this many rows, as column groups of
  // one launch, instead of gemv_max_rows; cuBLAS above. Their rows are then batch-invariant to
  // there. At 64 the 27B's pair costs ~4-5 us per layer at every decode width instead of 10.5
  // us at 16 rows, 21 at 32 and ~24 through cuBLAS from 33 (docs/perf/h200.md).
  int small_float_max_rows = 64;
  // KV cache element type (worker/model/kv_type.h): F16, Q8_0 (8.5 bits) or Q4_0 (4.5 bits) per
  // element. Per token and attention layer: 2 x n_kv x GgmlRowBytes(kv_type, hd), i.e. at
  // n_kv 4, hd 256: 4096 / 2176 / 1152 bytes.
  GgmlType kv_type = GgmlType::F16;
  // Q6_K matrices repacked at upload into 16-row int8 mma tiles (sm_80+; false keeps the raw
  // layout, for A/B runs). Steps of up to tiled_max_rows rows run the tiled tensor-core kernel;
  // at 64 rows dequantization + cuBLAS measured faster (54 vs 84 ms per x64 step).
  bool tiled = true;
  int tiled_max_rows = 32;
  // Int8 MMQ (kernels/cuda/mmq.cuh, issue #22): tiled matrices at 9..64 column rows take the
  // kernel with activations staged in shared memory where the shape table in
  // worker/cuda/matmul_dispatch.cc measured it faster than the tiled column kernel; it gives the
  // same numbers bit for bit, so the choice never changes a row's result. With it on, tiled
  // matrices keep the column path up to max(tiled_max_rows, mmq_max_rows) rows (decode steps of
  // up to 64 sequences stay batch-invariant). false: the tiled column kernel only (A/B runs,
  // `bench --mmq off`).
  bool int8_mmq = true;
  int mmq_max_rows = 64;
  // Tiled matrices on f16 tensor cores (kernels/cuda/tiled_f16.cuh, issue #22): column steps of
  // f16_mma_min_cols..64 rows take TiledF16Multi instead of the int8 kernels. The Q6_K sub-block
  // scale goes into the f16 weight operand, so the float work per mma that bounds the int8
  // kernels at 16-64 columns is gone. Its numbers are not the int8 kernels' (f16 activations
  // scaled per row, not int8 per 32-block), so batch invariance then holds among the steps of
  // fewer than f16_mma_min_cols decode rows and among the steps of f16_mma_min_cols..64, not
  // across. false: the int8 kernels at every column count (A/B runs, `bench --f16-mma off`).
  // From 9 columns it measured at least as fast as the int8 kernels for every 27B matrix but
  // ssm_out (TiledF16Timing.Table27B; x16 decode 960 -> 1,022-1,030 tok/s at 9, and
  // batch_invariance_test's replay cases at 9 pass on the H200: docs/perf/h200.md).
  bool f16_mma = true;
  int f16_mma_min_cols = 9;
  // Q4_K, Q5_K, Q8_0, IQ4_XS and IQ4_NL matrices tiled at upload too (kernels/cpu/
  // tiled_*_layout.h: the same bytes as the raw blocks, in f16-mma fragment order), multiplied by
  // the f16 tensor-core kernel at every column count up to tiled_max_rows (they have no int8
  // kernel: a row's numbers are then the same at any batch size) and dequantized from the tiles
  // for the cuBLAS path; needs f16_mma. Off: they keep the raw layout, the v2 GEMV (<=
  // gemv_max_rows rows) and dequantization + cuBLAS. On an H100 (docs/perf/h200.md): 27B Q4_K one
  // stream +31%, x16 3.2x; batch-invariant (batch_invariance_test's *_tiled cases, 27B widths
  // included, pass on the H100 since LinearMulti launches a step's matrices together per
  // segment); the kernels' GPU tests against the CPU reference: tiled_formats_cuda_test.
  bool tiled_f16_formats = true;
  // The decode kernels launched early on sm_90+ (programmatic dependent launch, kernels/cuda/
  // README.md "Early launch of the decode kernels"): the tiled column kernel (1..8 columns) and
  // the f16 kernel (9..64) may start while the norm, quantizer or GDN kernel before them runs and
  // load their first weights, and those kernels start while the one before them finishes; each
  // waits for its predecessor before touching activations. The same arithmetic (bit for bit).
  bool early_launch = true;
  // MTP drafts through a coarse copy of a tiled Q6_K head (kernels/cuda/draft_head.cuh: 4-bit
  // codes with a bf16 scale per 16 values, 0.76x the head's bytes, made at load): drafts only
  // propose tokens, so greedy and sampled outputs stay exactly those of the full head's
  // verification; the copy costs memory (0.74 GiB on the 27B) and saves ~0.08 ms of each draft's
  // ~0.64 on the H200.
  bool coarse_draft_head = true;
  // The greedy draft chain in one thread-block-cluster kernel (kernels/cuda/mtp_chain.cuh, sm_90)
  // where the MTP block takes it (one rank, F32 / F16 / BF16 matrices: small models such as the
  // demo, whose draft pass of ~20 launches is counted in launches, not bytes); off keeps one
  // kernel per op (`--fused-draft off` for A/B). fused_draft_blocks: the cluster's blocks, 0 = 16
  // (the most the device places; a power of two).
  bool fused_draft_chain = true;
  int fused_draft_blocks = 0;
  // The fused chain's resident form (MtpChainArgs::resident): stage vectors through distributed
  // shared memory and each block's weight rows kept in its shared memory; the same drafts bit
  // for bit. Off until measured on a GPU (`bench --draft-resident on` for A/B).
  bool draft_chain_resident = false;
  // The fused chain's global form with its q / k norms, RoPE and new K/V rows done by the
  // attention warps (MtpChainArgs::fold_prep): one cluster barrier fewer per draft. The same
  // drafts. Off until measured on a device: `bench --chain-fold on`.
  bool draft_chain_fold_prep = false;
  // The fused chain's global form prefetching into L1, before each stage barrier, the weight rows
  // each warp multiplies after it (MtpChainArgs::prefetch_weights). The same drafts. Off until
  // measured on a device: `bench --chain-prefetch on`.
  bool draft_chain_prefetch = false;
  // The GDN delta-rule state ([n_states, Hv, dk, dv] per layer: 151 MB per sequence on the 27B in
  // f32) stored in bf16 between steps, rounded to nearest even; every kernel loads it into f32
  // and does all its arithmetic in f32 (kernels/cuda/gdn.cuh: a decode step rounds after each
  // token, a prefill piece once at its end). Halves the state a batched decode step reads and
  // writes (gdn_core: ~8 of a ~35 ms step at 64 streams on the H200) and the recurrent bytes per
  // slot, speculative entry and checkpoint, so the memory planner fits more slots. Opt-in: its
  // precision is issue #22's question (docs/quality.md "GDN recurrent state in bf16"); off keeps
  // the f32 state and its numbers bit for bit. A snapshot or checkpoint loads only into a device
  // with the same setting (state_layout()).
  bool gdn_state_bf16 = false;
  // Dense weights (issue #22, worker/model/dense_weights.h): every layer matrix also kept as a
  // 16-bit copy (bf16; f16 on the portable path), dequantized once at load, which the cuBLAS path
  // multiplies instead of dequantizing the quantized matrix into a scratch at every step. Costs 2
  // bytes per weight on the device (the 27B: ~45 GiB beside its 20.6 GiB of Q6_K); the numbers
  // are those of the dequantize + cuBLAS path (the same 16-bit values, the same GEMM). kOn: steps
  // of more than tiled_max_rows rows (batched decode of 33+ sequences, prefill) take it instead
  // of MMQ / the f16 kernel, so decode steps of 33-64 sequences are no longer batch-invariant.
  // kAuto (default): the copies only where the memory plan loses nothing by them
  // (worker/runner/dense_weights_plan.h), used only past the column kernels' row range
  // (max(tiled_max_rows, mmq_max_rows): prefill pieces), so no step's numbers change.
  DenseWeights dense_weights = DenseWeights::kAuto;
  // FP8 prefill (issue #22; compute capability 9.0 with cuBLAS 12.9+, else ignored with a note on
  // stderr): the dense copies in e4m3 with one f32 scale per 128 x 128 block (1 byte per weight
  // instead of 2), made once at load from the dequantized rows, and the products past the column
  // kernels' rows (prefill pieces) on FP8 tensor cores through cuBLASLt, the activations
  // quantized per token and 128-element block (kernels/cuda/gemm_fp8.cuh). Lossy: e4m3 keeps 3
  // significant bits of every weight and activation (docs/quality.md "FP8 prefill"), so it is
  // the operator's choice; decode steps of up to tiled_max_rows rows keep their kernels. Only
  // where dense copies are made (dense_weights on or auto) and the matrix is whole 128 x 128
  // blocks; the others keep the 16-bit path.
  bool prefill_fp8 = false;
  // With prefill_fp8: decode steps of at least this many decode rows multiply the e4m3 copies too
  // (the serving regime, issue #22: at 16-64 streams the column kernels are bound by decoding the
  // quantized weights, where cuBLASLt's FP8 product reads 1 byte per weight); fewer keep the
  // column kernels, so steps on either side of it give a row other numbers (batch invariance
  // holds within each side, as at f16_mma_min_cols). 33 by default, measured (docs/perf/h200.md,
  // 2026-12-06, H100, 27B Q6_K): the FP8 product is ~10% ahead from 40 to 64 streams and ~11-20%
  // behind at 16 and 32, where the f16 kernel covers the rows in one pass of 32 columns. 0 =
  // never: decode keeps its kernels at any batch. Only where the copies are made and the trunk
  // is tiled.
  int fp8_decode_rows = 33;
  // Prefill pieces of at least this many tokens run the chunked GDN form (0 = always, a huge value
  // = never), shorter ones the per-token recurrence.
  int gdn_chunk_min = 16;
  // The chunked form's sequential scan on TF32 tensor cores in three passes (f32 accuracy;
  // kernels/cuda/gdn_chunk_scan_mma.cuh) instead of f32 CUDA-core products; sm_80+ and not on the
  // portable path (`bench --gdn-scan-mma off` for A/B).
  bool gdn_scan_mma = true;
  // K-split launches of the f16 tensor-core matmul (9..64-row steps) add their partial sums
  // through thread-block clusters on sm_90+ instead of a global scratch with tickets; the same
  // bits either way (`bench --f16-cluster off` for A/B; kernels/cuda/tiled_f16.cuh).
  bool f16_cluster_split = true;
  // One-matrix f16 matmul launches of whole rounds plus a nearly idle last one (the 27B's ffn
  // pair on a 132-SM card) run the last round's row blocks as a second launch, each launch at
  // its own rows' K split (TiledF16Scratch::tail_split; `bench --f16-tail-split off` for A/B;
  // H100, 27B: x16 / x32 / x64 +2 / +4 / +2%, docs/perf/h200.md).
  bool f16_tail_split = true;
  // The f16 matmul's K-split planning charge for partial sums (TiledF16Scratch::split_cost;
  // `bench --f16-split-cost X` for A/B; 0.5 before 2026-12-06: x16 +1.4%, x64 -0.4% on an H100,
  // docs/perf/h200.md).
  double f16_split_cost = ds::cuda::kSplitCost;
  // The f16 tensor-core matmul on Hopper's warpgroup instruction (wgmma; sm_90a builds on sm_90
  // GPUs, else ignored): each warpgroup's four 16-row weight fragments go to one wgmma per
  // 16-element step that reads the staged activations from shared memory itself, instead of a
  // shared load and an mma.sync per 8 columns in every warp. Every f16 launch of 9..64 columns
  // then takes it (up to 8, mma.sync), and the activations are written in its order
  // (kernels/cuda/tiled_f16.cuh, TiledF16Scratch::warpgroup_order). The same bits as the mma.sync
  // form where the tensor cores sum alike, which they do on the H100 and H200 (tiled_f16_cuda_test
  // `TiledF16Wgmma.SameBitsAsMmaSync`, tiled_formats_cuda_test for the other formats), so batch
  // invariance does not depend on it. 27B Q6_K on an H100: x64 1,983-1,990 -> 2,150-2,154 tok/s,
  // x32 1,592-1,595 -> 1,658-1,661, x8 / x16 the same (docs/perf/h200.md). `bench --f16-wgmma off`
  // for A/B.
  bool f16_wgmma = true;
  // The f16 kernel's activation copies (HalfActivations: ssm_out's and ffn_down's inputs at
  // 9..64 rows) with a row held in the registers of up to 1,024 threads instead of read twice
  // by 256; the same bits (`bench --half-regs off` for A/B).
  bool half_rows_in_registers = true;
  // Speculative verify (MTP, issue #15; SeqStep::speculative): spec_tokens tokens per sequence
  // (k drafts + 1) for up to spec_seqs sequences of one Forward (0 = min(n_slots, 8)). Each
  // token's recurrent state (every GDN layer's conv ring + delta-rule state: ~150 MiB on the 27B)
  // is kept in an entry of its own, spec_tokens x spec_seqs entries in all, charged by the memory
  // planner; with MTP in the file the MTP layer's K/V gets one more (f16) plane of the paged KV
  // pool. 0 = no speculative steps and no MtpStep: memory as without MTP.
  int spec_tokens = 0;
  int spec_seqs = 0;
  // Batch-invariant decode: while a micro-step holds at most gemv_max_rows (tiled:
  // tiled_max_rows) decode sequences, every decode row (and every row of a SeqStep::decode_path
  // run) takes the column kernels and the decode attention with a split length that depends on
  // the sequence alone, and every prefill piece gets matmuls of its own: a row's numbers then do
  // not depend on what else shares the step. That is what lets a failover replay (prompt pieces
  // as first cut, generated tokens on the decode path) continue with the tokens of the
  // uninterrupted run. Costs a second weight pass in steps that mix decodes with a long prefill
  // piece (docs/perf/failover.md). With f16_mma the invariance holds on either side of
  // f16_mma_min_cols (worker/README.md). false: one matmul path for the whole step, chosen by its
  // row count (the behaviour before, for A/B runs).
  bool batch_invariant = true;
  // Tensor parallelism with the CUDA IPC all-reduce: each of the layer's all-reduces runs fused
  // with the RMSNorm after it (one launch instead of two per boundary). Off by default: on one
  // H200 (both ranks on GPU 0 under MPS) it did not pay (docs/perf/tp.md); to be measured on
  // two cards (bench --tp 2 --fuse-norm on).
  bool fuse_allreduce_norm = false;
  // Tensor parallelism, large (prefill) micro-steps: the row-parallel projections (attn_output /
  // ssm_out, ffn_down) write the residual chunk by chunk, and each finished chunk's all-reduce
  // runs on a second stream while the next chunk's GEMM runs on the compute stream; the layer's
  // norm waits for all of them (CudaDevice::ProjectToResidual, docs/tp.md §11). Only steps of at
  // least overlap_min_rows rows that hold prefill rows: decode steps need the reduced row before
  // the next matmul, and their graphs stay as they are. A cuBLAS segment (one prefill piece) of
  // at least overlap_min_rows rows is cut into overlap_chunks chunks (multiples of 64 rows) by
  // its own length only, so the same micro-step always gives the same chunks (failover replay)
  // and a piece's numbers do not depend on its neighbours (batch_invariant). Every rank of a
  // group must use the same three values (they decide the sequence of collectives). Measured on
  // one H200 (both ranks on GPU 0, docs/perf/tp.md): 4,096-row steps in chunks of 1,024 rows
  // gain 2.5% (pp8192), 512-row steps in chunks of 128 / 256 rows lose 8% / 3.5% (pp512: the
  // small GEMMs fill the GPU worse), hence on by default from 4,096 rows only; the threshold is
  // for the two-GPU issue (20) to tune, where the all-reduce crosses NVLink.
  bool overlap_allreduce = true;
  int overlap_min_rows = 4096;
  int overlap_chunks = 4;
};

// Bytes the device needs, computed from the file and options before any cudaMalloc. Under
// tensor parallelism: this rank's share (its shard of the weights, the KV of its KV heads, the
// recurrent state of its GDN heads, workspace sized for its local widths).
struct CudaMemoryPlan : MemoryFootprint {
  MemoryPlan plan;  // the planner's figures: slots, context, KV pool pages, budget
  std::string ToString() const;
};

}  // namespace ds
