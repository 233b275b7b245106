#!/usr/bin/env bash
# The tiled column kernel's weight ring (GemvArgs::weight_ring, kernels/cuda/README.md "Weight
# ring"): its bit-identity test, tiled_gemv_bench with and without it, then `deltaserve bench` on
# the 27B Q6_K synth with `--weight-ring off|on` alternated: one-stream decode, the MTP k=4 cycle
# and (CONC) aggregate decode with the int8 kernel at 9..16 columns (`--f16-min-cols 17`).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve tiled_cuda_test tiled_gemv_bench):
#   DS_CARRY=.devcarry-lead [ROUNDS=2] [COLS=1,4,8] [CONC=16] bash tools/device/weight_ring_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
M=${MODEL:-/tmp/m.gguf}
( [ -s "$M" ] || timeout 200 "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$M" >/dev/null 2>&1 ) &
synth=$!
run_gtest tiled_cuda_test
grep -E "^\[ +(OK|FAILED|SKIPPED) " "$L/tiled_cuda_test.log" | head -20
[ -x "$BIN/tiled_gemv_bench" ] && timeout 240 "$BIN/tiled_gemv_bench" --cols ${COLS:-1,4,8} --sums 1 --ring 0,1 2>&1 | tail -12
wait $synth
for round in $(seq 1 ${ROUNDS:-2}); do
  for f in off on; do
    echo "== round $round --weight-ring $f"
    timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 64 --depth 0 --conc "" \
      --no-profile --weight-ring $f 2>&1 | grep -E "decode tg|^ *tg" | sort -u
    timeout 200 "$BIN/deltaserve" bench --model "$M" --quick --mtp 4 --mtp-conc 1 --mtp-depth 512 \
      --weight-ring $f 2>&1 | grep -E "^ k streams|^ [0-9] +[0-9]+ "
    [ -n "${CONC:-}" ] && timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 \
      --conc $CONC --conc-gen 32 --no-profile --f16-min-cols 17 --weight-ring $f 2>&1 | grep -E "aggregate decode" | sort -u
  done
done
exit $rc
