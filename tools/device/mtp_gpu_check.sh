#!/usr/bin/env bash
# MTP speculative decoding on the device (issue #15): the speculative kernels against the CPU
# (spec_kernels_cuda_test), the CUDA MtpStep against the CPU and verify + commit against the kept
# tokens alone (mtp_gpu_test), the GDN kernels and decode-path invariance as regression checks
# (kernels_cuda_test Gdn*/Attention*, batch_invariance_test), then the cost of a verify step of 4
# tokens vs a plain decode step on the synthetic 27B Q6_K file (mtp_verify_bench).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-h3 bash tools/device/pack.sh \
#     spec_kernels_cuda_test mtp_gpu_test kernels_cuda_test batch_invariance_test mtp_verify_bench):
#   DS_CARRY=.devcarry-h3 bash tools/device/mtp_gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/mtp_gpu; mkdir -p "$LOG"
M=/tmp/mtp_bench_27b.gguf
( timeout 200 "$BIN/mtp_verify_bench" --synth-only >"$LOG/synth.log" 2>&1 ) &
SYNTH=$!
for t in "spec_kernels_cuda_test" "mtp_gpu_test" "kernels_cuda_test --gtest_filter=Gdn*:Attention*" \
         "batch_invariance_test"; do
  set -- $t
  [ -x "$BIN/$1" ] || { echo "skip $1 (not packed)"; continue; }
  t0=$SECONDS
  timeout 240 "$BIN/$1" "${@:2}" --gtest_color=no >"$LOG/$1.log" 2>&1
  r=$?
  echo "$1: rc=$r in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED)' "$LOG/$1.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is|max rel|mtp_gpu|masked attn" "$LOG/$1.log" | head -30
  [ $r = 0 ] && pass "$1" || fail "$1"
done
wait $SYNTH; tail -2 "$LOG/synth.log"
timeout 150 "$BIN/mtp_verify_bench" --model "$M" --tokens 4 --depth 512 --iters 20 2>&1 | tee "$LOG/bench.log" | tail -3
[ ${PIPESTATUS[0]} = 0 ] && pass bench || fail bench
exit $rc
