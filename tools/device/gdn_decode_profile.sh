#!/usr/bin/env bash
# Where the batched GDN decode's time goes (issue #22: ~2.4 TB/s of f32 state at 64 sequences
# against ~4.3 for a copy): the per-launch times of `GdnLaunchTiming.DISABLED_Batched27B` (the
# 27B's layer at 16 and 64 sequences), then ncu's speed-of-light, memory, warp-state, scheduler,
# occupancy and source-counter sections of one 64-sequence launch, to $OUT/logs/ncu_gdn64.txt.
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
# The test's GdnDecode launches in order: 16 sequences (3 warm-ups + 20 per form: registers,
# then the bulk copy where the GPU has it), then 64 likewise: launch 49 is the 4th of the
# 64-sequence register form, 72 of the bulk copy (SKIP=72).
timeout 300 /usr/local/cuda/bin/ncu --kernel-name regex:GdnDecode --launch-skip "${SKIP:-49}" --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section SchedulerStats --section LaunchStats --section SourceCounters \
  "$T" "${ARGS[@]}" >"$L/ncu_gdn64.txt" 2>&1
echo "ncu: rc=$?"
grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Warp|No Eligible|Block Size|Stall" \
  "$L/ncu_gdn64.txt" | head -24
exit $rc
