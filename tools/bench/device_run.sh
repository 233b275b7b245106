#!/usr/bin/env bash
# Runs on the GPU machine after tools/device/pack.sh carried the binaries (.devcarry/bin, lib):
#   1. kernels_cuda_test (every CUDA kernel vs the CPU reference; PASS/FAIL per test) and, when
#      packed, gpu_vs_cpu_test (the whole model, CUDA vs CPU backend, every weight type)
#   2. the 27B-shape random Q6_K model from `deltaserve gguf-synth` (skipped when MODEL already exists)
#   3. `deltaserve bench` (prefill, decode @0 and @depth, aggregate decode, per-op breakdown)
# and prints a short summary last. Env: MODEL (default /tmp/q6k-27b.gguf),
# BENCH_ARGS (extra bench flags, e.g. --quick), SKIP_TESTS=1, SKIP_BENCH=1.
# Usage (from the repository root on the device): bash tools/bench/device_run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/device_run
mkdir -p "$LOG"
MODEL=${MODEL:-/tmp/q6k-27b.gguf}  # outside $OUT: 21 GB must not be carried back
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true

test_status="skipped"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== kernels_cuda_test =="
  if "$BIN/kernels_cuda_test" --gtest_color=no 2>&1 | tee "$LOG/kernels_cuda_test.log"; then
    test_status="PASS"
  else
    test_status="FAIL"
  fi
fi
gvc_status="skipped"
if [ "${SKIP_TESTS:-0}" != 1 ] && [ -x "$BIN/gpu_vs_cpu_test" ]; then
  echo "== gpu_vs_cpu_test =="
  if "$BIN/gpu_vs_cpu_test" --gtest_color=no 2>&1 | tee "$LOG/gpu_vs_cpu_test.log"; then
    gvc_status="PASS"
  else
    gvc_status="FAIL"
  fi
fi

bench_status="skipped"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  if [ ! -f "$MODEL" ]; then
    echo "== synth $MODEL =="
    "$BIN/deltaserve" gguf-synth --out "$MODEL" --preset 27b --type Q6_K 2>&1 | tail -3
  fi
  echo "== bench =="
  if "$BIN/deltaserve" bench --model "$MODEL" ${BENCH_ARGS:-} 2>&1 | tee "$LOG/bench.log"; then
    bench_status="PASS"
  else
    bench_status="FAIL"
  fi
fi

echo
echo "==== device_run summary ===="
echo "kernels_cuda_test: $test_status"
[ -f "$LOG/kernels_cuda_test.log" ] && grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$LOG/kernels_cuda_test.log" | head -20
echo "gpu_vs_cpu_test: $gvc_status"
[ -f "$LOG/gpu_vs_cpu_test.log" ] && grep -E "^gpu_(vs_cpu|tiled)|^\[  FAILED  \]" "$LOG/gpu_vs_cpu_test.log"
echo "bench: $bench_status"
[ -f "$LOG/bench.log" ] && sed -n '/==== bench summary/,$p' "$LOG/bench.log"
[ "$test_status" != FAIL ] && [ "$gvc_status" != FAIL ] && [ "$bench_status" != FAIL ]
