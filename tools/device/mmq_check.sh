#!/usr/bin/env bash
# Int8 MMQ (issue #22) on the device in one call: the kernel tests and timing table
# (mmq_cuda_test), the tiled kernel's tests (kernels_cuda_test Tiled.*), whole-model checks with
# MMQ on (gpu_vs_cpu_test, batch_invariance_test), then `deltaserve bench` on the 27B Q6_K synth
# with --mmq on and --mmq off.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h22 DS_PACK_OUT=.devcarry-h22 bash tools/device/pack.sh \
#     deltaserve mmq_cuda_test kernels_cuda_test gpu_vs_cpu_test batch_invariance_test):
#   DS_CARRY=.devcarry-h22 bash tools/device/mmq_check.sh
# BENCH_ARGS: the bench rows (default pp512, decode, x16, x64); SKIP_TESTS=1 runs the benches only;
# MMQ_MODES: the --mmq values to bench (default "on off").
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/mmq; mkdir -p "$LOG"
M=/tmp/m.gguf
if [ ! -s "$M" ]; then
  ( timeout 200 "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$M" >"$LOG/synth.log" 2>&1 ) &
  SYNTH=$!
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test() {
    local t=$1; shift
    [ -x "$BIN/$t" ] || { echo "skip $t (not packed)"; return; }
    local t0=$SECONDS
    timeout 300 "$BIN/$t" --gtest_color=no "$@" >"$LOG/$t.log" 2>&1
    local r=$?
    echo "$t $*: rc=$r in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED)' "$LOG/$t.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \]|Failure|MMQ != |not bitwise|differ from" "$LOG/$t.log" | head -8
    [ $r = 0 ] && pass "$t" || fail "$t"
  }
  run_test mmq_cuda_test
  grep -E "^(matrix|ffn|gdn|attn|ssm)" "$LOG/mmq_cuda_test.log"
  run_test kernels_cuda_test --gtest_filter='Tiled.*'
  run_test gpu_vs_cpu_test
  run_test batch_invariance_test
fi
[ -n "${SYNTH:-}" ] && { wait "$SYNTH"; tail -1 "$LOG/synth.log"; }
for mode in ${MMQ_MODES:-on off}; do
  # shellcheck disable=SC2086
  timeout 240 "$BIN/deltaserve" bench --model "$M" ${BENCH_ARGS:---prefill 512 --decode 32 --depth 0 --conc 16,64 --conc-gen 32 --no-profile} \
    --mmq "$mode" >"$LOG/bench_$mode.log" 2>&1
  r=$?
  echo "bench --mmq $mode (rc=$r):"
  grep -E "^(prefill|decode|aggregate)" "$LOG/bench_$mode.log" | tail -8
  [ $r = 0 ] && pass "bench --mmq $mode" || fail "bench --mmq $mode"
done
exit $rc
