#!/usr/bin/env bash
# The one-column tiled kernel with its activations staged in shared memory (kernels/cuda/
# gemv_tiled.cu, kStageX): the kernel and whole-model tests, tiled_gemv_bench (per matrix, and
# ffn_down's rows scanned, staged and not), then `deltaserve bench` on the 27B Q6_K synth: one-stream decode, x4 /
# x8 and the MTP k=4 cycle (ROUNDS rounds).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve tiled_cuda_test tiled_gemv_bench kernels_cuda_test batch_invariance_test \
#     gpu_vs_cpu_test mtp_gpu_test):
#   DS_CARRY=.devcarry-lead [ROUNDS=2] bash tools/device/stage_x_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M" &
synth=$!
for t in tiled_cuda_test kernels_cuda_test batch_invariance_test gpu_vs_cpu_test mtp_gpu_test; do run_gtest $t; done
[ -x "$BIN/tiled_gemv_bench" ] && timeout 300 "$BIN/tiled_gemv_bench" --cols ${COLS:-1,4} --sums 1 --stage 0,1 \
  --row-scan 1 2>&1 | tail -20
wait $synth
for round in $(seq 1 ${ROUNDS:-2}); do
  echo "== round $round"
  timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 64 --depth 0 --conc 4,8 \
    --conc-gen 32 --no-profile 2>&1 | grep -E "decode tg|aggregate decode" | sort -u
  timeout 200 "$BIN/deltaserve" bench --model "$M" --quick --mtp 4 --mtp-conc 1 --mtp-depth 512 \
    2>&1 | grep -E "^ k streams|^ [0-9] +[0-9]+ "
done
exit $rc
