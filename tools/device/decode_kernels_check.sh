#!/usr/bin/env bash
# Where a single-stream decode step and an MTP verify cycle spend their time, kernel by kernel:
# ncu's gpu__time_duration of every kernel of `deltaserve generate` on the 27B Q6_K synth (graph
# nodes profiled one by one, clocks left alone), written to $OUT/kernels_{plain,mtp3}.csv for
# tools/perf/kernel_table.py; then `deltaserve bench` for the step times in graphs.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh deltaserve):
#   DS_CARRY=.devcarry-lead bash tools/device/decode_kernels_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
M=${MODEL:-/tmp/m.gguf}
O=${OUT:-/tmp/out}
mkdir -p "$O"
synth_27b "$M"
NCU=/usr/local/cuda/bin/ncu
for mode in "plain off" "mtp3 3"; do
  set -- $mode
  t0=$SECONDS
  timeout 280 "$NCU" --graph-profiling node --clock-control none --metrics gpu__time_duration.sum \
    --csv --print-units base "$BIN/deltaserve" generate --model "$M" --backend cuda \
    --prompt-ids 11,22,33,44,55,66,77,88 --max-tokens ${TOKENS:-5} --ignore-eos --mtp "$2" \
    >"$O/kernels_$1.csv" 2>"$O/kernels_$1.err"
  echo "ncu $1: rc=$? in $((SECONDS - t0)) s, $(grep -c gpu__time_duration "$O/kernels_$1.csv") kernels"
done
timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 32 --depth 0 --conc 4 --conc-gen 32 \
  --no-profile --mtp 3 --mtp-conc 1 --mtp-depth 512 2>&1 | grep -E -A12 "bench summary|MTP"
exit $rc
