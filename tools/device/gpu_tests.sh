#!/usr/bin/env bash
# Every GPU gtest binary of the carry, one after another, then (when `deltaserve` is in it) a short
# bench of the 27B Q6_K file (its memory plan and the decode rows). With the kernels as a shared
# library (pack.sh's default since 2026-12-06) the whole suite and deltaserve pack to ~28 MB, one
# call; tools/device/gpu_groups.sh packs it into .devcarry-g1 (more groups when it outgrows a
# call) and prints each call's command. Usage (device, repo root): DS_CARRY=.devcarry-gN
# [ONLY="a b"] [SKIP="a b"] [BENCH=0] bash tools/device/gpu_tests.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/gpu_tests; mkdir -p "$LOG"
if [ -x "$BIN/deltaserve" ] && [ "${BENCH:-1}" = 1 ]; then
  ( timeout 150 "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out /tmp/m.gguf >"$LOG/synth.log" 2>&1 ) &
fi
for f in "$BIN"/*; do
  t=$(basename "$f")
  case "$t" in deltaserve|ds_tp_rank|deltactl|*.so) continue ;; esac
  # ONLY="a b": just those binaries of the carry; SKIP="a b": all but those.
  [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $t "* ]] && continue
  [[ " ${SKIP:-} " == *" $t "* ]] && continue
  t0=$SECONDS
  DS_TP_RANK_BIN=$(realpath -m "$BIN/ds_tp_rank") timeout 300 "$f" --gtest_color=no >"$LOG/$t.log" 2>&1
  r=$?
  echo "$t: rc=$r in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$LOG/$t.log" | tr '\n' ' ')"
  grep -E "^\[  SKIPPED \] [A-Za-z]" "$LOG/$t.log" | head -5
  grep -E "^\[  FAILED  \]" "$LOG/$t.log" | head -5
  [ $r = 0 ] && pass "$t" || fail "$t"
done
if [ -x "$BIN/deltaserve" ] && [ "${BENCH:-1}" = 1 ]; then
  wait; tail -1 "$LOG/synth.log"
  timeout 200 "$BIN/deltaserve" bench --model /tmp/m.gguf --prefill 512 --decode 64 --depth 0 \
    --conc 1,16,64 --conc-gen 32 --no-profile 2>&1 | tee "$LOG/bench.log" | grep -E "memory plan|^(prefill|decode|aggregate)" | tail -8
  [ ${PIPESTATUS[0]} = 0 ] && pass bench || fail bench
fi
exit $rc
