#!/usr/bin/env bash
# Every kernel of a few one-stream decode steps of the 27B Q6_K synth, each timed alone by ncu at
# the GPU's own clocks and without cache flushes (`--clock-control none --cache-control none`),
# to compare their sum with the graph's time per token (`deltaserve bench`): the difference is
# what launches and the gaps between kernels cost. The list goes to $OUT/ncu_decode.csv
# (tools/device/ncu_kernels.py prints it by kernel).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh deltaserve):
#   DS_CARRY=.devcarry-lead bash tools/device/decode_kernels_profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
O=${OUT:-/tmp/out}
L=$O/logs
mkdir -p "$L"
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M"
timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 64 --depth 0 --conc "" \
  --no-profile 2>&1 | grep -E "decode tg" | sort -u
timeout 400 /usr/local/cuda/bin/ncu --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum --csv --print-units base \
  "$BIN/deltaserve" generate --model "$M" --backend cuda --max-tokens ${TOKENS:-4} --prompt "hello" \
  >"$O/ncu_decode.csv" 2>"$L/ncu.err"
echo "ncu: rc=$? $(grep -c gpu__time_duration "$O/ncu_decode.csv") kernels"
python3 tools/device/ncu_kernels.py "$O/ncu_decode.csv" | tail -25
