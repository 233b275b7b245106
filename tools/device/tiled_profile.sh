#!/usr/bin/env bash
# ncu of single launches of the 1..8-column tiled int8 kernel (kernels/cuda/gemv_tiled.cu) from
# `tiled_gemv_bench --layers 1 --reps 1 --cols 1 --sums 1 --row-scan 1`: by default the ffn_down
# shape (K = 17,408) with 132 tiles (one block per SM) and with all 320, to see what holds a
# long-K launch at ~25 us whatever its rows (docs/perf/h200.md, 2026-12-04). SKIPS: the indices
# of the TiledKernel launches to profile (0-15: the step graph and the matrices alone, twice each;
# 16 + 2i: row-scan size i). Sections: speed of light, warp states, scheduler, memory, launch.
# Usage (device, repo root, after pack.sh ... tiled_gemv_bench):
#   DS_CARRY=.devcarry-lead [SKIPS="16 28"] bash tools/device/tiled_profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
NCU=/usr/local/cuda/bin/ncu
for k in ${SKIPS:-16 28}; do
  timeout 200 $NCU --clock-control none --kernel-name regex:TiledKernel --launch-skip $k --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section LaunchStats --section Occupancy \
    "$BIN/tiled_gemv_bench" --layers 1 --reps 1 --cols 1 --sums 1 --row-scan 1 >"$L/ncu_$k.txt" 2>&1
  echo "== launch $k"
  grep -E "Grid Size|Duration|DRAM Throughput|L1/TEX Hit|L2 Hit|Issued Warp|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Registers Per|No Eligible|Achieved Occupancy|Stall|stall" "$L/ncu_$k.txt" | head -40
done
exit 0
