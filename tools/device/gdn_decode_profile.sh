#!/usr/bin/env bash
# Where the batched GDN decode's time goes (issue #22: ~2.4 TB/s of f32 state at 64 sequences
# against ~4.3 for a copy): the per-launch times of `GdnLaunchTiming.DISABLED_Batched27B` (the
# 27B's layer at 16 and 64 sequences, whole-head and column-split forms), then ncu's
# speed-of-light, memory, warp-state, scheduler and occupancy sections of one 64-sequence launch
# of each form, to $OUT/logs/ncu_{whole,split}.txt.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-t bash tools/device/pack.sh gdn_launch_cuda_test):
#   DS_CARRY=.devcarry-t bash tools/device/gdn_decode_profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
T=$BIN/gdn_launch_cuda_test
ARGS=(--gtest_also_run_disabled_tests --gtest_filter='GdnLaunchTiming.*')
timeout 120 "$T" "${ARGS[@]}" 2>&1 | grep "GDN decode"
# The test's GdnDecode launches in order: 16 sequences whole-head then split (3 warm-ups + 20
# each), then 64 sequences likewise: the 4th launch of each 64-sequence block is 49 and 72.
for form in whole:49 split:72; do
  timeout 240 /usr/local/cuda/bin/ncu --kernel-name regex:GdnDecode --launch-skip "${form#*:}" \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats \
    "$T" "${ARGS[@]}" >"$L/ncu_${form%%:*}.txt" 2>&1
  echo "== ncu ${form%%:*}: rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Warp|No Eligible|Block Size" \
    "$L/ncu_${form%%:*}.txt" | head -14
done
exit $rc
