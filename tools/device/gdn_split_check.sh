#!/usr/bin/env bash
# The GDN decode's column split (issue #22, kernels/cuda/gdn.cu GdnDecodeSplitKernel,
# `--gdn-split off|batched|all`): its kernel test (bit for bit the whole-head kernels), the
# batch-invariance and MTP tests, then `deltaserve bench` on the 27B Q6_K synth (one stream, x16,
# x64) with each setting, alternated, the per-op-class profile of off / batched at x16 / x64, and
# the demo model's decode / MTP verify / chain cycle (`bench --model demo --mtp 4`).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve gdn_launch_cuda_test batch_invariance_test mtp_gpu_test):
#   DS_CARRY=.devcarry-lead [ROUNDS=2] [SPLITS="off batched all"] [PROFILE=1] [DEMO=1] \
#     bash tools/device/gdn_split_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
M=${MODEL:-/tmp/m.gguf}
SPLITS=${SPLITS:-off batched all}
synth_27b "$M" &
synth=$!
for t in ${TESTS:-gdn_launch_cuda_test batch_invariance_test mtp_gpu_test}; do run_gtest $t; done
wait $synth
for round in $(seq 1 ${ROUNDS:-2}); do
  for f in $SPLITS; do
    echo "== round $round --gdn-split $f"
    timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 \
      --conc ${CONC:-1,16,64} --conc-gen 32 --no-profile --gdn-split $f 2>&1 |
      grep -E "aggregate decode|decode tg" | sort -u
  done
done
if [ "${PROFILE:-1}" = 1 ]; then
  for f in off batched; do
    echo "== profile --gdn-split $f"
    timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 8 --depth 0 \
      --conc 16,64 --conc-gen 16 --gdn-split $f >"$L/prof_$f.log" 2>&1
    grep -E "gdn_core|aggregate decode" "$L/prof_$f.log" | head -12
  done
fi
if [ "${DEMO:-1}" = 1 ]; then
  for round in 1 2; do
    for f in off all; do
      echo "== demo round $round --gdn-split $f"
      timeout 120 "$BIN/deltaserve" bench --model demo --quick --mtp 4 --mtp-conc 1 --mtp-depth 64 \
        --no-profile --gdn-split $f 2>&1 | grep -E "decode|verify|^ +[0-9] +[0-9]+ " | head -8
    done
  done
fi
exit $rc
