#!/usr/bin/env bash
# ncu profile of single launches of the FP8 decode-width kernel (kernels/cuda/gemm_fp8_decode.cu)
# from gemm_fp8_cuda_test's timing table (Fp8Timing.DISABLED_DecodeKernel27B: ffn_gate first):
# per mangled-name regex in $KERNELS (default: the 16-token form Fp8StreamKernel<2> at T = 8 and
# the 64-token form <8> at T = 64, each its 4th launch, after the 3 warm-ups), the speed-of-light
# / memory / warp-state / scheduler sections and the per-SASS-instruction stall samples summarised
# by tools/device/sass_summary.py. Usage (device, repo root, after pack.sh ... gemm_fp8_cuda_test):
#   DS_CARRY=.devcarry-f8s [KERNELS="regex ..."] bash tools/device/fp8_stream_profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
NCU=/usr/local/cuda/bin/ncu
i=0
for k in ${KERNELS:-Fp8StreamKernelILi2EE Fp8StreamKernelILi8EE}; do
  i=$((i + 1))
  timeout 200 $NCU --clock-control none --kernel-name-base mangled --kernel-name "regex:$k" --launch-skip ${SKIP:-3} --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section SourceCounters --section LaunchStats --section Occupancy \
    -o "$L/prof_$i" -f "$BIN/gemm_fp8_cuda_test" --gtest_also_run_disabled_tests \
    --gtest_filter='Fp8Timing.DISABLED_DecodeKernel27B' >"$L/ncu_run_$i.txt" 2>&1
  $NCU -i "$L/prof_$i.ncu-rep" >"$L/ncu_$i.txt" 2>&1
  $NCU -i "$L/prof_$i.ncu-rep" --page source --csv --print-source sass >"$L/sass_$i.csv" 2>&1
  echo "== $k"
  grep -E "Duration|Memory Throughput|DRAM Throughput|Issued Warp|Eligible Warps|Warp Cycles Per Issued|Registers Per|Executed Ipc A|No Eligible|L2 Hit" "$L/ncu_$i.txt" | head -16
  python3 tools/device/sass_summary.py "$L/sass_$i.csv" 24
  rm -f "$L/prof_$i.ncu-rep"
done
exit 0
