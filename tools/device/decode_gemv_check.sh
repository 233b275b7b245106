#!/usr/bin/env bash
# The decode column kernel (kernels/cuda/gemv_tiled.cu) on the device in one call: its matmuls
# alone (tiled_gemv_bench), its bit-identity and CPU-reference tests (kernels_cuda_test Tiled.*,
# tiled_cuda_test, mmq_cuda_test, gpu_vs_cpu_test, batch_invariance_test when packed), then the
# 27B Q6_K synth's decode rows and the MTP cost rows (`deltaserve bench --mtp 3`, the tok/s at
# 75% acceptance).
# Logs in /tmp/decode_gemv on the device.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve tiled_gemv_bench kernels_cuda_test tiled_cuda_test mmq_cuda_test gpu_vs_cpu_test):
#   DS_CARRY=.devcarry-lead bash tools/device/decode_gemv_check.sh
# SKIP_TESTS=1 runs the benches only.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=/tmp/decode_gemv; mkdir -p "$LOG"
M=/tmp/m.gguf
( timeout 200 "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$M" >"$LOG/synth.log" 2>&1 ) &
SYNTH=$!
[ -x "$BIN/tiled_gemv_bench" ] && "$BIN/tiled_gemv_bench" --layers 64 --cols 1,4,8 --reps 7
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in "kernels_cuda_test --gtest_filter=Tiled.*" tiled_cuda_test mmq_cuda_test gpu_vs_cpu_test batch_invariance_test; do
    set -- $t
    [ -x "$BIN/$1" ] || { echo "skip $1 (not packed)"; continue; }
    t0=$SECONDS
    timeout 300 "$BIN/$1" --gtest_color=no "${@:2}" >"$LOG/$1.log" 2>&1
    r=$?
    echo "$t: rc=$r in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED)' "$LOG/$1.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \]|Failure" "$LOG/$1.log" | head -8
    [ $r = 0 ] && pass "$1" || fail "$1"
  done
fi
wait "$SYNTH"; tail -1 "$LOG/synth.log"
timeout 300 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 32 --depth 0 --conc 4,16 \
  --conc-gen 32 --no-profile >"$LOG/bench.log" 2>&1
r=$?
grep -E "^(prefill|decode|aggregate)" "$LOG/bench.log" | tail -4
[ $r = 0 ] && pass "bench" || fail "bench (rc=$r)"
# With --mtp the bench runs only its MTP rows: decode, verify, drafts, the tok/s at 75%.
timeout 300 "$BIN/deltaserve" bench --model "$M" --mtp 3 --mtp-conc 1,4 --mtp-depth 512 >"$LOG/bench_mtp.log" 2>&1
r=$?
grep -E "^ *k streams|^ *3 " "$LOG/bench_mtp.log"
[ $r = 0 ] && pass "bench --mtp 3" || fail "bench --mtp 3 (rc=$r)"
exit $rc
