#!/usr/bin/env bash
# Same-call A/B of two deltaserve binaries: the carried build ($BIN/deltaserve, "B") against a
# second one carried xz-packed alone ($A_XZ, "A"; it uses B's shared libraries), `deltaserve
# bench $BENCH` alternated A, B, A, B ... for $ROUNDS rounds on the 27B Q6_K synth, printing
# the lines that match $GREP. The machines of one kind differ by up to 3%, so an A/B across
# calls says little; this one is what the perf notes quote.
# Usage (device, repo root; the tests to run first in $TESTS):
#   DS_CARRY=.devcarry-lead A_XZ=.devcarry-main/deltaserve.xz TESTS="gdn_launch_cuda_test" \
#     BENCH="--quick --mtp 3,4 --mtp-conc 1 --mtp-depth 512" [BENCH2="..."] \
#     bash tools/device/ab_bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
ab_setup
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M"
# BENCH, then BENCH2 when given, each alternated A, B for ROUNDS rounds.
for args in "${BENCH:?}" ${BENCH2:+"$BENCH2"}; do
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for side in A B; do
      b=$A
      [ $side = B ] && b=$BIN/deltaserve
      echo "== $side round $r: bench $args"
      timeout 250 "$b" bench --model "$M" $args 2>&1 |
        grep -E "${GREP:-^ k streams|^ [0-9] +[0-9]+ |^decode tg|^aggregate}"
    done
  done
done
exit $rc
