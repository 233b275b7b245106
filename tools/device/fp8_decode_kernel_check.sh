#!/usr/bin/env bash
# The FP8 decode-width kernel (kernels/cuda/gemm_fp8_decode.cuh, issue #22): gemm_fp8_cuda_test
# (its tests), the timing table against cuBLASLt (Fp8Timing.DISABLED_DecodeKernel27B), then, if
# the tests passed, `deltaserve bench` on the 27B Q6_K synth with each CONFIGS entry ("-" = the
# defaults), as fp8_decode_check.sh. Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev
# DS_PACK_OUT=.devcarry-f8k bash tools/device/pack.sh deltaserve gemm_fp8_cuda_test; on the
# device: DS_CARRY=.devcarry-f8k [CONFIGS="...;..."] [CONC=16,32,64] [TESTS="..."]
# [TABLE=0] bash tools/device/fp8_decode_kernel_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
M=/tmp/m.gguf
synth_27b "$M" &
run_gtest gemm_fp8_cuda_test
tests_rc=$rc
grep -E "decode kernel|Fp8DecodeGemm" "$L/gemm_fp8_cuda_test.log" | head -12
for t in ${TESTS:-}; do run_gtest "$t" ${GTEST_ARGS:-}; done
if [ "${TABLE:-1}" = 1 ] && [ -x "$BIN/gemm_fp8_cuda_test" ]; then
  timeout 200 "$BIN/gemm_fp8_cuda_test" --gtest_also_run_disabled_tests \
    --gtest_filter="${TIMING:-Fp8Timing.DISABLED_DecodeKernel27B}" 2>&1 | grep -vE "^\[|^$|Note:"
fi
wait
[ "$tests_rc" = 0 ] || { echo "tests failed: no bench"; exit 1; }
CONFIGS=${CONFIGS:-"-;--prefill-fp8 on --fp8-decode-rows 9 --fp8-decode-kernel off;--prefill-fp8 on --fp8-decode-rows 9"}
IFS=';' read -ra cfgs <<<"$CONFIGS"
for c in "${cfgs[@]}"; do
  [ "$c" = "-" ] && c=""
  echo "== bench $c"
  t0=$SECONDS
  timeout 240 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 \
    --conc "${CONC:-16,32,64}" --conc-gen 32 --no-profile $c 2>&1 |
    grep -E "^(prefill|decode|aggregate)|error|Error|ignored" | head -10
  [ ${PIPESTATUS[0]} = 0 ] && pass "bench $c" || fail "bench $c"
  echo "   ($((SECONDS - t0)) s)"
done
exit $rc
