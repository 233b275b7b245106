#!/usr/bin/env bash
# wip (issue #22): variants of the f16 tensor-core kernel (kernels/cuda/tiled_f16.cu): d folded
# into the f16 weights, weights 1 or 2 units ahead. Tests of the folded variants against their
# CPU reference, the variant timing table, then `deltaserve bench` x16 / x64 per variant.
# Usage (device): DS_CARRY=.devcarry-lead bash tools/device/f16_variant_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
M=${MODEL:-/tmp/m.gguf}
( [ -s "$M" ] || timeout 200 "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$M" >/dev/null 2>&1 ) &
synth=$!
for v in ${TEST_VARIANTS:-1 2}; do
  DS_F16_VARIANT=$v timeout 200 "$BIN/tiled_f16_cuda_test" --gtest_filter='TiledF16.*' --gtest_color=no >"$L/t$v.log" 2>&1
  echo "variant $v: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$L/t$v.log" | tr '\n' ' ')"
  grep -E "max err/tol" "$L/t$v.log" | sort -t' ' -k1 | awk '{print $(NF-3), $(NF-1)}' | sort -g | tail -2
  grep -E "Failure|vs the" "$L/t$v.log" | head -4
done
timeout 200 "$BIN/tiled_f16_cuda_test" --gtest_also_run_disabled_tests --gtest_filter='TiledF16Timing.Variants27B' \
  --gtest_color=no >"$L/var.log" 2>&1
grep -A26 "^matrix" "$L/var.log"
wait $synth
for v in ${BENCH_VARIANTS:-0 1 2 0 1}; do
  echo "== variant $v"
  timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 --conc ${CONC:-16,64} \
    --conc-gen 32 --no-profile --f16-variant $v 2>&1 | grep -A8 "bench summary" | tail -7
done
exit $rc
