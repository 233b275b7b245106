#!/usr/bin/env bash
# Where a speculative verify's GDN run waits (issue #15: on the demo model a k = 4 verify's six
# GDN runs add ~71 us to its graph against ~21 for a decode step's, ~2 us per further token):
# ncu's warp-state, scheduler, instruction and source-counter sections of one GdnDecodeRunKernel
# launch inside `generate --mtp 4` (after the prompt every launch of it is a verify's run; $SKIP
# of them skipped first, default 60: ten verify steps), then the per-opcode summary and the
# instructions with the most stall samples (tools/device/sass_summary.py), in $OUT/logs.
# Usage (device, repo root, after pack.sh deltaserve ...): DS_CARRY=... bash tools/device/gdn_run_profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
NCU=/usr/local/cuda/bin/ncu
timeout 240 $NCU --clock-control none --kernel-name regex:GdnDecodeRunKernel --launch-skip "${SKIP:-60}" \
  --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section InstructionStats --section SourceCounters --section LaunchStats --import-source yes \
  -o /tmp/gdn_run -f "$BIN/deltaserve" generate --model demo --backend cuda --max-tokens 128 \
  --prompt "The jury said that" --mtp "${K:-4}" >/tmp/gdn_run_ncu.txt 2>&1
echo "ncu: rc=$?"
$NCU -i /tmp/gdn_run.ncu-rep >"$L/ncu_gdn_run.txt" 2>&1
$NCU -i /tmp/gdn_run.ncu-rep --page source --csv --print-source sass >/tmp/gdn_run_sass.csv 2>&1
grep -E "Duration|Grid Size|Block Size|Registers Per|Warp Cycles Per Issued|Issued Warp|No Eligible|Executed Ipc A" \
  "$L/ncu_gdn_run.txt" | head -12
python3 tools/device/sass_summary.py /tmp/gdn_run_sass.csv 14 28 | tee "$L/gdn_run_sass.txt"
exit 0
