#!/usr/bin/env bash
# Tiled Q6_K on f16 tensor cores (issue #22, kernels/cuda/tiled_f16.cuh): its kernel tests and
# timing table, the whole-model / batch-invariance / MTP GPU tests with it on, then `deltaserve
# bench` on the 27B Q6_K synth with --f16-mma on / off (decode x1 / x16 / x24 / x64) in one call
# (MODES: the bench switch sets to run, e.g. MODES='"--f16-min-cols 9" "--f16-min-cols 17"';
# CONC: the --conc list).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve tiled_f16_cuda_test batch_invariance_test gpu_vs_cpu_test; mtp_gpu_test too
#     when the carry has room: a binary not packed is skipped):
#   DS_CARRY=.devcarry-lead bash tools/device/f16_mma_check.sh
# NCU=1 also profiles two 64-column launches of the f16 kernel (stall reasons).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
for t in tiled_f16_cuda_test batch_invariance_test gpu_vs_cpu_test mtp_gpu_test; do
  run_gtest $t
done
grep -A37 "^matrix" "$L/tiled_f16_cuda_test.log"
if [ "${NCU:-0}" = 1 ]; then
  # TiledF16Kernel launches of the timing test: 18 per (matrix, column count), 7 column counts
  # per matrix: gate+up at 64 columns, ffn_down at 64 (the 4th timed launch of each).
  for k in 111 237; do
    timeout 120 /usr/local/cuda/bin/ncu --clock-control none --kernel-name TiledF16Kernel --launch-skip $k \
      --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section LaunchStats "$BIN/tiled_f16_cuda_test" \
      --gtest_filter='TiledF16Timing.*' >"$L/ncu_$k.txt" 2>&1
    grep -E "Duration|Throughput|Stall|Issued Warp|Eligible|Active Warps|Registers Per|Achieved Occ|Warp Cycles Per Issued" \
      "$L/ncu_$k.txt" | head -30
  done
fi
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M"
eval "modes=(${MODES:-\"--f16-mma on\" \"--f16-mma off\"})"
for f in "${modes[@]}"; do
  echo "== $f"
  timeout 250 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 32 --depth 0 --conc ${CONC:-16,24,64} \
    --conc-gen 32 --no-profile $f 2>&1 | grep -A8 "bench summary" | tail -7
done
exit $rc
