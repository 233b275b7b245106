#!/usr/bin/env bash
# Every GPU gtest binary of the carry, one after another, then (when `deltaserve` is in it) a short
# bench of the 27B Q6_K file (its memory plan and the decode rows). The whole suite does not fit
# one call's 64 MiB any more (~13 MB packed per test binary, 2026-12-05): tools/device/
# gpu_groups.sh packs it into .devcarry-g1, -g2, ... and prints one command per call, this script
# with DS_CARRY=.devcarry-gN. Usage (device, repo root): DS_CARRY=.devcarry-gN bash tools/device/gpu_tests.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/gpu_tests; mkdir -p "$LOG"
if [ -x "$BIN/deltaserve" ]; then
  ( timeout 150 "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out /tmp/m.gguf >"$LOG/synth.log" 2>&1 ) &
fi
for f in "$BIN"/*; do
  t=$(basename "$f")
  case "$t" in deltaserve|ds_tp_rank|deltactl) continue ;; esac
  t0=$SECONDS
  DS_TP_RANK_BIN=$(realpath -m "$BIN/ds_tp_rank") timeout 300 "$f" --gtest_color=no >"$LOG/$t.log" 2>&1
  r=$?
  echo "$t: rc=$r in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$LOG/$t.log" | tr '\n' ' ')"
  grep -E "^\[  SKIPPED \] [A-Za-z]" "$LOG/$t.log" | head -5
  grep -E "^\[  FAILED  \]" "$LOG/$t.log" | head -5
  [ $r = 0 ] && pass "$t" || fail "$t"
done
if [ -x "$BIN/deltaserve" ]; then
  wait; tail -1 "$LOG/synth.log"
  timeout 200 "$BIN/deltaserve" bench --model /tmp/m.gguf --prefill 512 --decode 64 --depth 0 \
    --conc 1,16,64 --conc-gen 32 --no-profile 2>&1 | tee "$LOG/bench.log" | grep -E "memory plan|^(prefill|decode|aggregate)" | tail -8
  [ ${PIPESTATUS[0]} = 0 ] && pass bench || fail bench
fi
exit $rc
