#!/usr/bin/env bash
# Issue #15's demo-model row with the fused draft chain (kernels/cuda/mtp_chain.cuh): the MTP
# tests (the new FusedDraftChain test among them), then the trained demo model end to end and in
# the bench with the chain fused (default) and per kernel (`--fused-draft off`), alternated.
#   1. mtp_gpu_test;
#   2. `deltaserve generate --model demo --backend cuda --max-tokens 256 --mtp off|3|4`, fused
#      and not, two rounds;
#   3. `deltaserve bench --model demo --quick --mtp 3,4 --mtp-conc 1 --mtp-depth 64` with
#      `--fused-draft off`, on, and on with BLOCKS (default "32 64") blocks.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh deltaserve mtp_gpu_test):
#   DS_CARRY=.devcarry-lead bash tools/device/fused_draft_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
O=${OUT:-/tmp/out}
L=$O/logs
mkdir -p "$L"
[ "${TESTS:-1}" = 1 ] && run_gtest mtp_gpu_test
# Greedy text is the same with and without MTP, fused or not.
demo_generate_rounds 2 "off" "3 --fused-draft off" "3" "4 --fused-draft off" "4"
for fd in "--fused-draft off" "" ${BLOCKS:-32 64}; do
  case "$fd" in [0-9]*) fd="--fused-draft-blocks $fd" ;; esac
  echo "== bench $fd"
  timeout 120 "$BIN/deltaserve" bench --model demo --quick --mtp 3,4 --mtp-conc 1 \
    --mtp-depth 64 --no-profile $fd 2>&1 | tee "$L/bench_${fd// /_}.log" |
    grep -E "decode|^ k streams|^ [0-9] +[0-9]+ " | head -12
done
exit $rc
