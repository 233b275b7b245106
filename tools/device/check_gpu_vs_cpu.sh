#!/usr/bin/env bash
# Whole-model GPU vs CPU-reference check on the GPU machine: runs the ctest binary
# gpu_vs_cpu_test (tests/model/gpu_vs_cpu_test.cc, label `gpu`): the HF reference model and
# synthetic models of every weight type (F32 F16 BF16 Q8_0 Q6_K Q5_K Q4_K IQ4_NL IQ4_XS), CPU
# backend vs CUDA backend over a mixed prefill step and 16 teacher-forced decode steps, bounded
# max |gpu - cpu| / max |cpu| per step, CPU and GPU determinism, and the tiled vs raw Q6_K
# prefill on a 4-layer model of the 27B width. Prints the test's per-model measurement lines
# last; the JUnit XML (per-step values as properties) is left in $OUT/gpu_vs_cpu (or /tmp).
# Usage (device, repo root, after `DS_PACK_XZ=1 bash tools/device/pack.sh gpu_vs_cpu_test` here):
#   bash tools/device/check_gpu_vs_cpu.sh [gtest flags, e.g. --gtest_filter=*Q6_K*]
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/gpu_vs_cpu; mkdir -p "$LOG"
"$BIN/gpu_vs_cpu_test" --gtest_color=no --gtest_output="xml:$LOG/gpu_vs_cpu_test.xml" "$@" \
  > "$LOG/gpu_vs_cpu_test.log" 2>&1 || rc=1
grep -A4 -E ": Failure$" "$LOG/gpu_vs_cpu_test.log" | head -60
grep -E "^\[  (FAILED|SKIPPED) " "$LOG/gpu_vs_cpu_test.log"
grep -E "^gpu_(vs_cpu|tiled)" "$LOG/gpu_vs_cpu_test.log"
tail -3 "$LOG/gpu_vs_cpu_test.log"
exit $rc
