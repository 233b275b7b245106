#!/usr/bin/env bash
# FP8 prefill (kernels/cuda/gemm_fp8.cuh, CudaBackendOptions::prefill_fp8; issue #22) on the
# device: the kernel tests and the cuBLASLt-vs-bf16 table, the demo model's perplexity with the
# prefill products in bf16 and in FP8 (dense copies on), then the 27B Q6_K synth's prefill
# (`bench --prefill-fp8 off|on`, ROUNDS times, alternated).
# Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-f8 bash tools/device/pack.sh
# deltaserve gemm_fp8_cuda_test && cp build/demo-data/heldout.txt .devcarry-f8/ (from
# tools/train/get_corpus.sh); on the device: DS_CARRY=.devcarry-f8 [ROUNDS=1] [TIMING=1] [PPL=1]
# [BENCH="--prefill 512,8192 ..."] bash tools/device/fp8_prefill_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
TEXT=/tmp/heldout.txt
[ -f "${DS_CARRY:-.devcarry}/heldout.txt" ] && cp "${DS_CARRY:-.devcarry}/heldout.txt" "$TEXT"
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
M=/tmp/m.gguf
synth_27b "$M" &
"$BIN/gemm_fp8_cuda_test" >"$L/gemm_fp8_cuda_test.log" 2>&1 && pass gemm_fp8_cuda_test || fail gemm_fp8_cuda_test
grep -E "^\[  (PASSED|FAILED)|Failure|worst" "$L/gemm_fp8_cuda_test.log" | head -30
if [ "${TIMING:-1}" = 1 ]; then
  "$BIN/gemm_fp8_cuda_test" --gtest_also_run_disabled_tests --gtest_filter='Fp8Timing.*' 2>&1 | grep -v "^\[" | grep -v "^$"
fi
if [ "${PPL:-1}" = 1 ] && [ -f "$TEXT" ]; then
  for v in off on; do
    echo "== demo perplexity, --prefill-fp8 $v"
    timeout 200 "$BIN/deltaserve" perplexity --model demo --text "$TEXT" --ctx 512 --backend cuda \
      --dense-weights on --prefill-fp8 $v --max-tokens 65536 --json --quiet 2>&1 | tail -2
  done
fi
wait
BENCH=${BENCH:---prefill 512,8192 --decode 4 --depth 0 --conc "" --no-profile}
for r in $(seq 1 "${ROUNDS:-1}"); do
  for v in off on; do
    echo "== round $r --prefill-fp8 $v"
    eval timeout 300 "$BIN/deltaserve" bench --model "$M" $BENCH --prefill-fp8 $v 2>&1 |
      grep -E "pp[0-9]+|memory plan|error|Error|ignored" | head -8
  done
done
exit $rc
