#!/usr/bin/env bash
# Issue #15's demo-model row on the device: where a decode step, a verify step and a draft chain
# of the trained demo model (launch-bound: 8 layers of width 256) spend their time.
#   1. `deltaserve generate --model demo --backend cuda --mtp off|K` end to end (tok/s,
#      acceptance), alternated, two runs each;
#   2. `deltaserve bench --model demo --mtp ...` (decode / verify / chain cycle per step);
#   3. ncu: every kernel of a short greedy run with and without MTP, its duration alone
#      (gpu__time_duration), written to $OUT/ncu_{off,mtp}.csv (tools/device/ncu_kernels.py lists them).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh deltaserve):
#   DS_CARRY=.devcarry-lead bash tools/device/demo_mtp_profile.sh
# Knobs: MTP_K (default "3 4"; generate also takes auto), BENCH_K (default MTP_K), NCU=0 skips
# step 3, NCU_K its drafts (3), PROFILE=1 lets the bench print its per-op-class times (decode vs verify), GEN_ARGS
# (extra generate flags), TESTS="bin ..." runs those packed gtest binaries first.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
O=${OUT:-/tmp/out}
L=$O/logs
mkdir -p "$L"
MTP_K=${MTP_K:-3 4}
BENCH_K=${BENCH_K:-$MTP_K}
PROMPT="The jury said that"
for t in ${TESTS:-}; do run_gtest "$t"; done
# The same text with and without MTP (greedy, or sampled with one --seed in GEN_ARGS).
demo_generate_rounds 2 off $MTP_K
NOPROF=--no-profile
[ "${PROFILE:-0}" = 1 ] && NOPROF=
timeout 120 "$BIN/deltaserve" bench --model demo --quick --mtp ${BENCH_K// /,} --mtp-conc 1 \
  --mtp-depth 64 $NOPROF 2>&1 | tee "$L/bench.log" | grep -E "decode|verify|^ k streams|^ [0-9] +[0-9]+ |ms" | head -60
if [ "${NCU:-1}" = 1 ]; then
  NCU_BIN=/usr/local/cuda/bin/ncu
  for k in off ${NCU_K:-3}; do
    f=ncu_mtp; [ "$k" = off ] && f=ncu_off
    timeout 240 $NCU_BIN --metrics gpu__time_duration.sum --csv --print-units base \
      "$BIN/deltaserve" generate --model demo --backend cuda --max-tokens 20 --prompt "$PROMPT" \
      --mtp $k >"$O/$f.csv" 2>"$L/ncu_$k.err"
    echo "ncu --mtp $k: rc=$? $(grep -c gpu__time_duration "$O/$f.csv") kernels"
  done
fi
exit $rc
