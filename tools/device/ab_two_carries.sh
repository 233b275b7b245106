#!/usr/bin/env bash
# Same-call A/B of a kernel-library change: B is the carried build ($DS_CARRY, packed by pack.sh),
# A the same binaries with another build's libds_kernels_cuda.so ($A_DIR/libds_kernels_cuda.so.xz,
# xz-packed alone: the host binaries did not change, only the kernels). First B's tests ($TESTS),
# then a per-launch table with each library ($TABLE_BIN, $TABLE_FILTER; TABLE=0: none), then
# `deltaserve bench $BENCH` alternated A, B for $ROUNDS rounds on the 27B Q6_K synth.
# Two carries seldom fit one call (64 MiB with the tree): then a first call runs B's tests with
# KEEP=/tmp/Bc (B's unpacked carry copied there; ROUNDS=0 TABLE=0), and a second call on the same
# warm machine carries only A_DIR and passes B_KEPT=/tmp/Bc.
# Usage (device, repo root): DS_CARRY=.devcarry-b A_DIR=.devcarry-a [TESTS="..."] [ROUNDS=2]
#   [BENCH="..."] [KEEP=/tmp/Bc | B_KEPT=/tmp/Bc] bash tools/device/ab_two_carries.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh  # KEEP / B_KEPT: the kept carry (env.sh)
A_DIR=${A_DIR:-}
mkdir -p /tmp/alib
[ -n "$A_DIR" ] && xz -dc "$A_DIR/libds_kernels_cuda.so.xz" >/tmp/alib/libds_kernels_cuda.so
ALIB="/tmp/alib:$LD_LIBRARY_PATH"
[ -n "$A_DIR" ] && echo "A's kernels: $(LD_LIBRARY_PATH=$ALIB ldd "$BIN/deltaserve" | grep ds_kernels)"
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M" &
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
for t in ${TESTS:-}; do run_gtest "$t"; done  # B's tests
# The per-launch table: B's test binary $TABLE_BIN (default tiled_f16_cuda_test) with B's and
# with A's kernel library (the host code is the same), filter $TABLE_FILTER.
TB=${TABLE_BIN:-tiled_f16_cuda_test}
TF=${TABLE_FILTER:-TiledF16Timing.Table27B}
if [ "${TABLE:-1}" = 1 ] && [ -x "$BIN/$TB" ]; then
  for side in A B; do
    [ $side = A ] && [ -z "$A_DIR" ] && continue
    echo "== $side $TB $TF"
    lp=$LD_LIBRARY_PATH
    [ $side = A ] && lp=$ALIB
    LD_LIBRARY_PATH=$lp timeout 150 "$BIN/$TB" --gtest_also_run_disabled_tests \
      --gtest_filter="$TF" --gtest_color=no 2>&1 | grep -vE "^\[|^$|^Note|^Running main"
  done
fi
wait
for r in $(seq 1 "${ROUNDS:-2}"); do
  for side in A B; do
    [ $side = A ] && [ -z "$A_DIR" ] && continue
    echo "== $side round $r: bench ${BENCH:-default}"
    lp=$LD_LIBRARY_PATH
    [ $side = A ] && lp=$ALIB
    LD_LIBRARY_PATH=$lp timeout 150 "$BIN/deltaserve" bench --model "$M" \
      ${BENCH:---prefill 512 --decode 32 --depth 0 --conc 1,16,32,64 --conc-gen 32 --no-profile} 2>&1 |
      grep -E "^(decode tg|aggregate)" | sort -u
  done
done
exit $rc
