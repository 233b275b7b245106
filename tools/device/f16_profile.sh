#!/usr/bin/env bash
# ncu profile of single launches of the f16 tensor-core matmul (kernels/cuda/tiled_f16.cu) from
# the timing table (TiledF16Timing.Table27B): per mangled-name regex in $KERNELS (default: the
# pair at 9-16 columns without clusters, TiledF16Kernel<2, true, false>; $SKIP launches of it
# skipped first), the speed-of-light / warp-state / scheduler / instruction sections and the
# per-SASS-instruction executed counts and stall samples (sass_N.csv), summarised by opcode and
# stall reason (tools/device/sass_summary.py; docs/perf/h200.md, 2026-12-04 ~04:35).
# Usage (device, repo root, after pack.sh ... tiled_f16_cuda_test):
#   DS_CARRY=.devcarry-lead [KERNELS="regex ..."] bash tools/device/f16_profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
NCU=/usr/local/cuda/bin/ncu
i=0
for k in ${KERNELS:-TiledF16KernelILi2ELb1ELb0EE}; do
  i=$((i + 1))
  timeout 200 $NCU --clock-control none --kernel-name-base mangled --kernel-name "regex:$k" --launch-skip ${SKIP:-2} --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section SourceCounters --section LaunchStats --section Occupancy \
    -o "$L/prof_$i" -f "$BIN/tiled_f16_cuda_test" --gtest_filter='TiledF16Timing.*' >"$L/ncu_run_$i.txt" 2>&1
  $NCU -i "$L/prof_$i.ncu-rep" >"$L/ncu_$i.txt" 2>&1
  $NCU -i "$L/prof_$i.ncu-rep" --page source --csv --print-source sass >"$L/sass_$i.csv" 2>&1
  echo "== $k"
  grep -E "Duration|Memory Throughput|DRAM Throughput|Issued Warp|Eligible Warps|Warp Cycles Per Issued|Registers Per|Executed Ipc A|No Eligible" "$L/ncu_$i.txt" | head -14
  python3 tools/device/sass_summary.py "$L/sass_$i.csv" 16
  rm -f "$L/prof_$i.ncu-rep"
done
exit 0
