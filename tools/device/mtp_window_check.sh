#!/usr/bin/env bash
# What the demo's `generate` window holds besides the steady MTP cycle (issue #15): tok/s of
# `generate --mtp off | 4 | 4 --mtp-full-tail off` at 256 and 1,024 new tokens (the longer run's
# marginal rate leaves the one-time costs out), ROUNDS rounds, then one traced `generate --mtp 4
# --max-tokens 256`
# (tools/kernel_timeline's CSV summarized by timeline_calls.py: host runtime calls by total time,
# kernels launched outside graphs).
# Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-jc bash tools/device/pack.sh \
#   deltaserve ds_kernel_timeline
# On the device: DS_CARRY=.devcarry-jc [ROUNDS=2] bash tools/device/mtp_window_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
gen=("$BIN/deltaserve" generate --model demo --backend cuda --prompt "The jury said that" --json)
for r in $(seq 1 "${ROUNDS:-2}"); do
  for m in off 4 "4 --mtp-full-tail off"; do
    for n in 256 1024; do
      t=${m// /_}
      "${gen[@]}" --mtp $m --max-tokens $n >"$L/w_${t}_$n.json" 2>"$L/w.err" || fail "generate --mtp $m --max-tokens $n"
      echo "round $r --mtp $m --max-tokens $n: $(gen_summary "$L/w_${t}_$n.json")"
    done
  done
done
CUDA_INJECTION64_PATH=$(realpath "$BIN/libds_kernel_timeline.so") DS_TIMELINE_OUT=/tmp/w_tl.txt \
  DS_TIMELINE_CSV=/tmp/w_tl.csv "${gen[@]}" --mtp 4 --max-tokens 256 >/dev/null 2>&1
python3 tools/device/timeline_calls.py /tmp/w_tl.csv 14
exit $rc
