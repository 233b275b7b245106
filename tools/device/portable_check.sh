#!/usr/bin/env bash
# The portable (sm_70 / V100) kernel path forced on the H200 (issue #19, docs/v100.md): every GPU
# test that creates a backend with --portable, the f16-range test, the kernel tests, then the
# 27B Q6_K bench with `--portable on` (pp512, decode, x16). Tests run side by side (small models,
# one GPU of 141 GB) to fit a short device call.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h19 DS_PACK_OUT=.devcarry-h19 bash tools/device/pack.sh \
#     ds_gpu_bench portable_gpu_test gpu_vs_cpu_test batch_invariance_test paged_kv_gpu_test \
#     mtp_gpu_test kernels_cuda_test):
#   DS_CARRY=.devcarry-h19 bash tools/device/portable_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/portable; mkdir -p "$LOG"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
( timeout 100 "$BIN/ds_gpu_bench" gguf-synth --preset 27b --type Q6_K --out /tmp/m.gguf >"$LOG/synth.log" 2>&1 ) &
SYNTH=$!
declare -A PIDS
for t in portable_gpu_test gpu_vs_cpu_test batch_invariance_test paged_kv_gpu_test mtp_gpu_test \
         kernels_cuda_test; do
  [ -x "$BIN/$t" ] || { echo "skip $t (not packed)"; continue; }
  arg=--portable
  [ "$t" = kernels_cuda_test ] && arg=""  # kernels only: no backend, nothing to switch
  ( timeout 110 "$BIN/$t" $arg --gtest_color=no >"$LOG/$t.log" 2>&1; echo $? >"$LOG/$t.rc" ) &
  PIDS[$t]=$!
done
for t in "${!PIDS[@]}"; do
  wait "${PIDS[$t]}"
  r=$(cat "$LOG/$t.rc" 2>/dev/null || echo 99)
  echo "$t: rc=$r; $(grep -E '^\[  (PASSED|FAILED)  \]|^\[  SKIPPED \] [0-9]' "$LOG/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|^(portable|gpu_vs_cpu|f16 range) " "$LOG/$t.log" | head -20
  [ "$r" = 0 ] && pass "$t" || fail "$t"
done
wait $SYNTH; tail -1 "$LOG/synth.log"
timeout 90 "$BIN/ds_gpu_bench" bench --model /tmp/m.gguf --portable on --prefill 512 --decode 32 \
  --depth 0 --conc 16 --conc-gen 16 --no-profile 2>&1 | tee "$LOG/bench.log" |
  grep -E "kernel path|memory plan|^(prefill|decode|aggregate)" | tail -8
[ ${PIPESTATUS[0]} = 0 ] && pass bench || fail bench
exit $rc
