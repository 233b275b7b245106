#!/usr/bin/env bash
# Every GPU-labelled test binary of the pack, one after another, then a short bench of the 27B
# Q6_K file (its memory plan and the decode rows): the whole device side of the suite in one call.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 tools/device/pack.sh deltaserve ds_tp_rank kernels_cuda_test gdn_cuda_test kv_quant_cuda_test \
#     sampling_cuda_test gpu_vs_cpu_test \
#     batch_invariance_test paged_kv_gpu_test tp_custom_allreduce_test mtp_gpu_test worker_mtp_tp_gpu_test):
#   bash tools/device/gpu_tests.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/gpu_tests; mkdir -p "$LOG"
( timeout 150 "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out /tmp/m.gguf >"$LOG/synth.log" 2>&1 ) &
SYNTH=$!
for t in kernels_cuda_test gdn_cuda_test kv_quant_cuda_test sampling_cuda_test gpu_vs_cpu_test batch_invariance_test \
         paged_kv_gpu_test tp_custom_allreduce_test mtp_gpu_test worker_mtp_tp_gpu_test; do
  [ -x "$BIN/$t" ] || { echo "skip $t (not packed)"; continue; }
  t0=$SECONDS
  DS_TP_RANK_BIN=$BIN/ds_tp_rank timeout 300 "$BIN/$t" --gtest_color=no >"$LOG/$t.log" 2>&1
  r=$?
  echo "$t: rc=$r in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED)' "$LOG/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" "$LOG/$t.log" | head -5
  [ $r = 0 ] && pass "$t" || fail "$t"
done
wait $SYNTH; tail -1 "$LOG/synth.log"
timeout 200 "$BIN/deltaserve" bench --model /tmp/m.gguf --prefill 512 --decode 64 --depth 0 \
  --conc 1,16,64 --conc-gen 32 --no-profile 2>&1 | tee "$LOG/bench.log" | grep -E "memory plan|^(prefill|decode|aggregate)" | tail -8
[ ${PIPESTATUS[0]} = 0 ] && pass bench || fail bench
exit $rc
